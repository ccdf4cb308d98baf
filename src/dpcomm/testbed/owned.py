"""Testbeds a process owns by name: ``<prefix><pid in hex>`` (``make demo``: ``dm``, ``dpcomm validate``:
``vl``), and the removal of those whose process was killed outright (SIGKILL skips ``finally``). Also the
load average, which every measurement on the testbed records (other jobs slow the network's CPU work)."""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["loadavg", "owned_name", "remove_stale"]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages from ``/proc/loadavg`` (``"n/a"`` where there is none)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def owned_name(prefix: str, pid: int | None = None) -> str:
    """``prefix`` and the pid in hex (this process's by default; at most 8 characters: pids are < 2**22)."""
    return f"{prefix}{os.getpid() if pid is None else pid:x}"


def remove_stale(prefix: str) -> None:
    """Take down the testbeds named :func:`owned_name` of ``prefix`` whose process is gone and which have
    nothing running inside (their workers died with them)."""
    from dpcomm.testbed import down, leftovers
    from dpcomm.testbed.shell import run

    for name in sorted({ns.removeprefix("dpc-").rsplit("-", 1)[0] for ns in leftovers()}):
        m = re.fullmatch(re.escape(prefix) + r"([0-9a-f]{1,6})", name)
        if m is None or name != owned_name(prefix, int(m.group(1), 16)):
            continue
        try:
            os.kill(int(m.group(1), 16), 0)
            continue  # that process still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if any(run(["ip", "netns", "pids", ns], check=False).strip() for ns in leftovers(name)):
            continue
        down(name)
