"""Gantt chart of *measured* iterations, read back from the runtime's Chrome traces (one panel per run).

The runtime (:meth:`dpcomm.DataParallel.write_chrome_trace`, and ``dpcomm train --chrome-trace`` for DDP)
writes "complete" events per rank on two rows, ``compute`` (tid 0: forward, backward, step) and ``comm``
(tid 1: each group's all-reduce, or DDP's exposed wait). This draws one rank's last few iterations the way
:mod:`dpcomm.sim.timeline` draws simulated ones (MG-WFBP Fig. 2/4), so the two can be put side by side.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.utils.io import atomic_write_bytes

__all__ = ["measured_spans", "measured_timeline_figure", "plot_measured_timeline"]

_COLORS = {"forward": "#6baed6", "backward": "#74c476", "step": "#bdbdbd"}
_COMM = ("#fc9272", "#de2d26")


def measured_spans(trace_path: str | os.PathLike, rank: int = 0, iterations: int = 2) -> list[dict]:
    """Rank ``rank``'s events of its last ``iterations`` iterations: ``{name, row, start_ms, end_ms}``,
    times from the first of those iterations' forward start."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    mine = sorted((e for e in events if e.get("ph") == "X" and e.get("pid") == rank), key=lambda e: e["ts"])
    starts = [e["ts"] for e in mine if e["name"] == "forward" and e.get("tid", 0) == 0]
    if not starts:
        return []
    t0 = starts[-iterations] if len(starts) >= iterations else starts[0]
    return [
        {
            "name": e["name"],
            "row": "comm" if e.get("tid", 0) == 1 else "compute",
            "start_ms": (e["ts"] - t0) / 1e3,
            "end_ms": (e["ts"] + e["dur"] - t0) / 1e3,
        }  # fmt: skip
        for e in mine
        if e["ts"] >= t0
    ]


def measured_timeline_figure(
    traces: dict[str, str | os.PathLike], iterations: int = 2, title: str = ""
) -> Figure:
    """One panel per labelled Chrome trace file: rank 0's last ``iterations`` iterations."""
    if not traces:
        raise ValueError("nothing to draw: no traces")
    fig = Figure(figsize=(11, 1.4 + 1.3 * len(traces)), layout="constrained")
    axes = fig.subplots(len(traces), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (label, path) in zip(axes, traces.items(), strict=True):
        spans = measured_spans(path, iterations=iterations)
        k = 0
        for s in spans:
            width = s["end_ms"] - s["start_ms"]
            if s["row"] == "compute":
                ax.broken_barh(
                    [(s["start_ms"], width)], (1.1, 0.8), facecolors=_COLORS.get(s["name"], "#9e9ac8")
                )
            else:
                color = _COMM[k % 2]
                ax.broken_barh([(s["start_ms"], width)], (0.1, 0.8), facecolors=color, edgecolor="white")
                k += 1
        end = max((s["end_ms"] for s in spans), default=0.0)
        ax.set_yticks([0.5, 1.5], ["comm", "compute"])
        ax.set_ylim(0, 2)
        what = "last iteration" if iterations == 1 else f"last {iterations} iterations"
        ax.set_title(f"{label}: {what} on rank 0 ({end:.0f} ms)", fontsize=9, loc="left")
    axes[-1].set_xlabel(
        "time (ms) - compute: forward (blue), backward (green), step incl. waiting for comm (grey); "
        "comm: all-reduces (red)"
    )
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_measured_timeline(
    traces: dict[str, str | os.PathLike], path: str | os.PathLike, iterations: int = 2, title: str = ""
) -> Path:
    """Write the measured Gantt chart (PNG or any matplotlib format by suffix), atomically."""
    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    measured_timeline_figure(traces, iterations, title).savefig(buf, format=fmt, dpi=130)
    return atomic_write_bytes(path, buf.getvalue())
