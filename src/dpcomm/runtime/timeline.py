"""Gantt chart of *measured* iterations, read back from the runtime's Chrome traces (one panel per run).

Drawn by :mod:`dpcomm.timeline.plot`, the plotter simulated iterations use too, so the two can be put side by
side; this module keeps the runtime's names for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.timeline.plot import measured_panels, plot_panels, timeline_figure

__all__ = ["measured_timeline_figure", "plot_measured_timeline"]

_XLABEL = (
    "time (ms) - compute: forward (blue), backward (green), step incl. waiting for comm (grey); "
    "comm: all-reduces (red)"
)


def measured_timeline_figure(
    traces: dict[str, str | os.PathLike], iterations: int = 2, title: str = ""
) -> Figure:
    """One panel per labelled Chrome trace file: rank 0's last ``iterations`` iterations."""
    return timeline_figure(measured_panels(traces, iterations), title=title, xlabel=_XLABEL)


def plot_measured_timeline(
    traces: dict[str, str | os.PathLike], path: str | os.PathLike, iterations: int = 2, title: str = ""
) -> Path:
    """Write the measured Gantt chart (PNG or any matplotlib format by suffix), atomically."""
    return plot_panels(measured_panels(traces, iterations), path, title=title, xlabel=_XLABEL)
