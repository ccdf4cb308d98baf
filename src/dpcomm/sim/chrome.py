"""Simulated iterations as a Chrome trace (:mod:`dpcomm.timeline.chrome`): open it in Perfetto.

Each :class:`SimResult` is one process named after its schedule and node count, with the rows ``compute``
(a span per layer's forward and backward) and ``allreduce`` (one per group, ``args`` holding its layers,
bytes and ready time): :meth:`SimResult.spans`, the same spans the runtime records.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcomm.sim.simulator import SimResult
from dpcomm.timeline.chrome import Process
from dpcomm.timeline.chrome import chrome_trace as _chrome_trace
from dpcomm.timeline.chrome import write_chrome_trace as _write

__all__ = ["chrome_trace", "write_chrome_trace"]

_ROW_NAMES = {"compute": "compute", "comm": "allreduce"}


def _processes(results: Sequence[SimResult]) -> list[Process]:
    return [
        Process(pid=i, name=f"{r.schedule} N={r.nodes}", spans=r.spans(), row_names=_ROW_NAMES)
        for i, r in enumerate(results)
    ]


def chrome_trace(results: Sequence[SimResult]) -> dict[str, Any]:
    """The trace as a dict (``{"traceEvents": [...], "displayTimeUnit": "ms"}``)."""
    return _chrome_trace(_processes(results), display_time_unit="ms")


def write_chrome_trace(results: Sequence[SimResult], path: str | os.PathLike) -> Path:
    """Write :func:`chrome_trace` to ``path`` atomically."""
    return _write(path, _processes(results), display_time_unit="ms")
