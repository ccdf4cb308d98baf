"""Simulated iterations as a Chrome trace (JSON Trace Event Format): open it in Perfetto or chrome://tracing.

Each :class:`SimResult` is one process (``pid``) named after its schedule and node count, with two threads:
``compute`` (tid 0, a complete event ``ph: "X"`` per layer's forward and backward) and ``allreduce``
(tid 1, one per group, ``args`` holding its layers and bytes). ``ts``/``dur`` are microseconds, as the
format requires. Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcomm.sim.simulator import SimResult
from dpcomm.utils.io import atomic_write_json

__all__ = ["chrome_trace", "write_chrome_trace"]


def _meta(pid: int, tid: int | None, what: str, name: str) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": what, "args": {"name": name}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def chrome_trace(results: Sequence[SimResult]) -> dict[str, Any]:
    """The trace as a dict (``{"traceEvents": [...], "displayTimeUnit": "ms"}``)."""
    events: list[dict[str, Any]] = []
    for pid, res in enumerate(results):
        events.append(_meta(pid, None, "process_name", f"{res.schedule} N={res.nodes}"))
        events.append(_meta(pid, 0, "thread_name", "compute"))
        events.append(_meta(pid, 1, "thread_name", "allreduce"))
        for ev in res.compute:
            events.append(
                {
                    "name": f"{ev.phase[0].upper()} {ev.name}",
                    "cat": ev.phase,
                    "ph": "X",
                    "pid": pid,
                    "tid": 0,
                    "ts": ev.start_s * 1e6,
                    "dur": (ev.end_s - ev.start_s) * 1e6,
                    "args": {"layer": ev.layer},
                }
            )
        for ev in res.comm:
            lo, hi = ev.layers[0], ev.layers[-1]
            events.append(
                {
                    "name": f"allreduce {lo}" if lo == hi else f"allreduce {lo}-{hi}",
                    "cat": "comm",
                    "ph": "X",
                    "pid": pid,
                    "tid": 1,
                    "ts": ev.start_s * 1e6,
                    "dur": (ev.end_s - ev.start_s) * 1e6,
                    "args": {"layers": list(ev.layers), "bytes": ev.nbytes, "ready_us": ev.ready_s * 1e6},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(results: Sequence[SimResult], path: str | os.PathLike) -> Path:
    """Write :func:`chrome_trace` to ``path`` atomically."""
    return atomic_write_json(path, chrome_trace(results))
