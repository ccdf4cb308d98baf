"""What every benchmark script shares: the machine's load, printed next to each measured number.

Scripts run as ``python benchmarks/<name>.py``, so this folder is first on ``sys.path`` and they import it as
``from _common import loadavg``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

__all__ = ["loadavg", "sigterm_exits"]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages from ``/proc/loadavg`` (``"n/a"`` where there is none)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def sigterm_exits() -> None:
    """Make SIGTERM (``timeout``, ``kill``) a ``SystemExit``, so a script's ``finally`` still takes its
    testbed down; Python's default for SIGTERM ends the process at once and left the namespaces up."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
