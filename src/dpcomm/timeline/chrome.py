"""Timelines as Chrome traces (JSON Trace Event Format): open them in Perfetto or ``chrome://tracing``.

One process (``pid``) per timeline, named; one thread per row, ``compute`` (tid 0) and ``comm`` (tid 1)
unless the process names its rows otherwise; one complete event (``ph: "X"``) per :class:`Span`, ``ts``
and ``dur`` in microseconds as the format requires. The runtime writes one process per rank
(:func:`write_chrome_trace_file`), the simulator one per simulated result. Format:
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcomm.timeline.span import ROWS, Span
from dpcomm.utils.io import atomic_write_json

__all__ = [
    "Process",
    "chrome_trace",
    "chrome_trace_events",
    "read_chrome_spans",
    "write_chrome_trace",
    "write_chrome_trace_file",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Process:
    """One timeline of the trace."""

    pid: int
    name: str
    """Shown as the process name (``rank 0``, ``mgwfbp N=16``)."""
    spans: Sequence[Span]
    row_names: dict[str, str] = field(default_factory=lambda: {r: r for r in ROWS})
    """Thread name shown for each row."""


def _event(pid: int, s: Span) -> dict[str, Any]:
    ev: dict[str, Any] = {"name": s.name}
    if s.cat:
        ev["cat"] = s.cat
    ev |= {
        "ph": "X",
        "pid": pid,
        "tid": ROWS.index(s.row) if s.row in ROWS else 0,
        "ts": s.start * 1e6,  # microseconds
        "dur": max(0.0, s.end - s.start) * 1e6,
        "args": s.args,
    }
    return ev


def chrome_trace(processes: Sequence[Process], display_time_unit: str | None = None) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents": [...]}`` (and ``displayTimeUnit`` when given)."""
    events: list[dict[str, Any]] = []
    for p in processes:
        events.append({"ph": "M", "name": "process_name", "pid": p.pid, "args": {"name": p.name}})
        for tid, row in enumerate(ROWS):
            name = p.row_names.get(row, row)
            events.append(
                {"ph": "M", "name": "thread_name", "pid": p.pid, "tid": tid, "args": {"name": name}}
            )
        events.extend(_event(p.pid, s) for s in p.spans)
    out: dict[str, Any] = {"traceEvents": events}
    if display_time_unit:
        out["displayTimeUnit"] = display_time_unit
    return out


def write_chrome_trace(
    path: str | os.PathLike, processes: Sequence[Process], display_time_unit: str | None = None
) -> Path:
    """Write :func:`chrome_trace` to ``path`` atomically."""
    return atomic_write_json(path, chrome_trace(processes, display_time_unit))


def _ranks(spans_by_rank: dict[int, list[Span]]) -> list[Process]:
    return [Process(pid=r, name=f"rank {r}", spans=spans) for r, spans in sorted(spans_by_rank.items())]


def chrome_trace_events(spans_by_rank: dict[int, list[Span]]) -> list[dict[str, Any]]:
    """The runtime's trace events: one process per rank (``rank R``), rows ``compute`` and ``comm``."""
    return chrome_trace(_ranks(spans_by_rank))["traceEvents"]


def write_chrome_trace_file(path: str | os.PathLike, spans_by_rank: dict[int, list[Span]]) -> Path:
    """Write the runtime's trace (one process per rank) to ``path`` atomically."""
    return write_chrome_trace(path, _ranks(spans_by_rank))


def read_chrome_spans(path: str | os.PathLike, pid: int = 0) -> list[Span]:
    """Process ``pid``'s complete events of a Chrome trace file, back as spans (seconds), in time order."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    mine = sorted((e for e in events if e.get("ph") == "X" and e.get("pid") == pid), key=lambda e: e["ts"])
    return [
        Span(
            name=e["name"],
            row=ROWS[e.get("tid", 0)] if e.get("tid", 0) < len(ROWS) else ROWS[0],
            start=e["ts"] / 1e6,
            end=(e["ts"] + e["dur"]) / 1e6,
            args=e.get("args", {}),
            cat=e.get("cat", ""),
        )
        for e in mine
    ]
