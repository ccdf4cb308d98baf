"""What every benchmark script shares: the machine's load, printed next to each measured number.

Scripts run as ``python benchmarks/<name>.py``, so this folder is first on ``sys.path`` and they import it as
``from _common import loadavg``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["loadavg"]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages from ``/proc/loadavg`` (``"n/a"`` where there is none)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"
