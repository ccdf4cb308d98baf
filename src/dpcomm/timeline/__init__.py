"""One timeline for simulated and measured iterations: spans, their Chrome trace, and their Gantt chart.

A :class:`Span` is one interval on a row (``compute`` or ``comm``) of one process. The simulator
(:meth:`dpcomm.sim.SimResult.spans`) and the runtime (its per-iteration records) both produce them;
:mod:`.chrome` writes and reads them as a Chrome trace (Perfetto, ``chrome://tracing``), and
:mod:`.plot` draws them as MG-WFBP Fig. 2/4's Gantt chart (it imports matplotlib: import it directly).
"""

from dpcomm.timeline.chrome import (
    Process,
    chrome_trace,
    chrome_trace_events,
    read_chrome_spans,
    write_chrome_trace,
    write_chrome_trace_file,
)
from dpcomm.timeline.span import ROWS, Span

__all__ = [
    "ROWS",
    "Process",
    "Span",
    "chrome_trace",
    "chrome_trace_events",
    "read_chrome_spans",
    "write_chrome_trace",
    "write_chrome_trace_file",
]
