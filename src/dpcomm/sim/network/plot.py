"""Link utilisation of one collective per algorithm: a heat map over the fabric's directed links.

Utilisation of a link = the wire bytes its flows put on it (payload x the goodput's header factor) over
what it could have carried in the collective's time. Links are grouped by kind (server uplinks, server
downlinks, then each kind of switch-to-switch link), in id order within a kind, with the groups marked;
a second panel gives each kind's mean, so an idle core or a relay NIC that is the bottleneck shows at once.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dpcomm.sim.network.engine import FlowRun
from dpcomm.sim.network.fabric import Fabric
from dpcomm.utils.io import atomic_write_bytes

__all__ = ["link_kind", "plot_links", "utilisation"]


def utilisation(fabric: Fabric, run: FlowRun) -> np.ndarray:
    """Fraction of each directed link's capacity used over ``run`` (0..1)."""
    if run.link_bytes is None or run.time_s <= 0:
        return np.zeros(fabric.links)
    return run.link_bytes * fabric.goodput.fwd / (fabric.capacity * run.time_s)


def link_kind(name: str) -> str:
    """``s3>e1`` -> ``server>e``: the kind of a link from its name (letters of each end, servers as such)."""
    a, b = name.split(">")

    def end(x: str) -> str:
        return "server" if x.startswith("s") and x[1:].isdigit() else re.sub(r"\d+", "", x)

    return f"{end(a)}>{end(b)}"


def plot_links(fabric: Fabric, runs: Sequence[tuple[str, FlowRun]], path: str | os.PathLike) -> Path:
    """Write the heat map (one row per ``(label, run)``) and the per-kind means as a PNG."""
    kinds_all = [link_kind(n) for n in fabric.names]
    order = list(dict.fromkeys(kinds_all))
    by_kind = sorted(range(fabric.links), key=lambda i: (order.index(kinds_all[i]), i))  # kinds contiguous
    util = np.array([utilisation(fabric, r)[by_kind] for _, r in runs]).reshape(len(runs), fabric.links)
    kinds = [kinds_all[i] for i in by_kind]
    fig = Figure(figsize=(9, 1.6 + 0.5 * len(runs) + 2.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[1 + 0.4 * len(runs), 2.4])
    im = top.imshow(util, aspect="auto", interpolation="nearest", vmin=0, vmax=1, cmap="viridis")
    top.set_yticks(range(len(runs)), [label for label, _ in runs])
    starts = [kinds.index(k) for k in order]
    top.set_xticks(starts, order, fontsize=7, rotation=30, ha="left")
    for s in starts[1:]:
        top.axvline(s - 0.5, color="white", linewidth=0.6)
    top.set_xlabel(f"directed links of {fabric.topology.spec} ({fabric.links}), by kind")
    fig.colorbar(im, ax=top, label="utilisation")
    width = 0.8 / max(len(runs), 1)
    x = np.arange(len(order))
    kind_arr = np.array(kinds)
    for i, (label, _) in enumerate(runs):
        means = [util[i][kind_arr == k].mean() for k in order]
        bottom.bar(x + i * width, means, width, label=label)
    bottom.set_xticks(x + width * (len(runs) - 1) / 2, order, fontsize=7)
    bottom.set_ylabel("mean utilisation")
    bottom.set_ylim(0, 1.05)
    bottom.legend(fontsize=7)
    bottom.grid(True, axis="y", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path, buf.getvalue())
