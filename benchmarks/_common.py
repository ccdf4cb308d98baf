"""What every benchmark script shares: the machine's load, printed next to each measured number.

Scripts run as ``python benchmarks/<name>.py``, so this folder is first on ``sys.path`` and they import it as
``from _common import loadavg``.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

from dpcomm.testbed.owned import loadavg

__all__ = ["busy_share", "cpu_ticks", "loadavg", "sigterm_exits"]


def cpu_ticks() -> tuple[int, int] | None:
    """``(busy, total)`` CPU ticks of the whole machine since boot, from ``/proc/stat`` (None where there is
    none); two readings give the share of the cores busy in between (idle and iowait count as idle)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return sum(ticks) - sum(ticks[3:5]), sum(ticks)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share (0-1) of every core's time that was busy between two :func:`cpu_ticks` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def sigterm_exits() -> None:
    """Make SIGTERM (``timeout``, ``kill``) a ``SystemExit``, so a script's ``finally`` still takes its
    testbed down; Python's default for SIGTERM ends the process at once and left the namespaces up."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def without_folder(data: Any, folder: Path | str) -> Any:
    """``data`` (JSON-able) with ``folder/`` cut from every string in it: a run's temporary folder is no
    result, and a results file keeps no machine paths (``emulated:/tmp/x/a.json`` -> ``emulated:a.json``)."""
    prefix = json.dumps(f"{folder}/")[1:-1]
    return json.loads(json.dumps(data).replace(prefix, ""))
