"""Speedup against node count, one line per schedule (like MG-WFBP Fig. 9), from sweep rows."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.sim.sweep import SweepRow
from dpcomm.utils.io import atomic_write_bytes

__all__ = ["plot_scaling", "scaling_figure"]

_MARKERS = "osD^vP*X"


def scaling_figure(rows: Sequence[SweepRow], title: str = "") -> Figure:
    """Speedup ``S(N)`` per schedule on log-2 node axes, with the linear-scaling line for reference."""
    if not rows:
        raise ValueError("nothing to draw: no sweep rows")
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.subplots()
    schedules = list(dict.fromkeys(r.schedule for r in rows))
    nodes = sorted({r.nodes for r in rows})
    ax.plot(nodes, nodes, color="grey", linestyle=":", label="linear")
    for k, s in enumerate(schedules):
        pts = sorted((r.nodes, r.speedup) for r in rows if r.schedule == s)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=_MARKERS[k % len(_MARKERS)], label=s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_xlabel("nodes N")
    ax.set_ylabel("speedup S(N) = N (t_f + t_b) / t_iter")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_scaling(rows: Sequence[SweepRow], path: str | os.PathLike, title: str = "") -> Path:
    """Write the scaling plot (PNG or any format matplotlib knows from the suffix), atomically."""
    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    scaling_figure(rows, title).savefig(buf, format=fmt, dpi=130)
    return atomic_write_bytes(path, buf.getvalue())
