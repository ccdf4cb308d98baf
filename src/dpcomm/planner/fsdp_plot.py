"""The FSDP time-memory front as a figure: the least modelled iteration time against the memory budget.

``optimal``'s front (:func:`dpcomm.planner.fsdp.pareto_front`) is a staircase: at a budget ``M`` the least
time is that of the front's point with the largest peak ``<= M``. The other planners are points at their own
peak and time. Written atomically (:func:`dpcomm.utils.io.atomic_write_bytes`), any format matplotlib knows
from the suffix; matplotlib's ``Agg`` canvas, no pyplot state.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.utils.io import atomic_write_bytes

__all__ = ["plot_pareto"]


def plot_pareto(
    front: Sequence[tuple[int, float, FsdpPlan]],
    others: Sequence[FsdpPlan],
    path: str | os.PathLike,
    *,
    title: str = "",
) -> Path:
    """Write the front (MiB of unsharded parameters against ms per iteration) with ``others`` as points."""
    if not front:
        raise ValueError("nothing to draw: an empty front")
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    mib = [p / 2**20 for p, _, _ in front]
    ms = [t * 1e3 for _, t, _ in front]
    top = max([mib[-1], *(o.peak_bytes / 2**20 for o in others)]) * 1.05
    ax.step([*mib, top], [*ms, ms[-1]], where="post", color="black", label="optimal (least time at budget)")
    ax.plot(mib, ms, "o", color="black", markersize=3)
    for o in others:
        label = f"{o.method} (d={o.depth}{', reshard' if o.reshard_after_forward else ''})"
        ax.plot([o.peak_bytes / 2**20], [o.time_s * 1e3], "x", markersize=7, label=label)
    ax.set_xlabel("memory budget: unsharded parameters (MiB)")
    ax.set_ylabel("modelled iteration time (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    fig.savefig(buf, format=fmt, dpi=130)
    return atomic_write_bytes(path, buf.getvalue())
