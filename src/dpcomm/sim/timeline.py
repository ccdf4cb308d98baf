"""Gantt chart of simulated iterations, like MG-WFBP Fig. 2 (WFBP) and Fig. 4 (merged gradients).

One panel per :class:`SimResult`; each has a *compute* row (a bar per layer's forward, then a bar per
layer's backward, shades alternating so neighbours stay apart) and a *communication* row (a bar per
group's all-reduce, labelled with its layers when it is wide enough). Time in milliseconds.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.sim.simulator import SimResult
from dpcomm.utils.io import atomic_write_bytes

__all__ = ["plot_timeline", "timeline_figure"]

_FWD = ("#9ecae1", "#6baed6")  # blues: forward
_BWD = ("#a1d99b", "#74c476")  # greens: backward
_COMM = ("#fc9272", "#de2d26")  # reds: all-reduce (the paper's red rectangles)


def _label(layers: tuple[int, ...]) -> str:
    return str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"


def timeline_figure(results: Sequence[SimResult], title: str = "") -> Figure:
    """A matplotlib Figure with one Gantt panel per result (no pyplot state involved)."""
    if not results:
        raise ValueError("nothing to draw: no simulation results")
    fig = Figure(figsize=(11, 1.6 + 1.5 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 1, squeeze=False, sharex=True)[:, 0]
    min_label_ms = 0.04 * max(r.t_iter_s for r in results) * 1e3  # narrower bars stay unlabelled
    for ax, res in zip(axes, results, strict=True):
        for ev in res.compute:
            colors = _FWD if ev.phase == "forward" else _BWD
            ax.broken_barh(
                [(ev.start_s * 1e3, (ev.end_s - ev.start_s) * 1e3)],
                (1.1, 0.8),
                facecolors=colors[ev.layer % 2],
                edgecolor="none",
            )
        few = len(res.comm) <= 24
        for ev in res.comm:
            width = (ev.end_s - ev.start_s) * 1e3
            ax.broken_barh(
                [(ev.start_s * 1e3, width)],
                (0.1, 0.8),
                facecolors=_COMM[ev.group % 2],
                edgecolor="white",
                linewidth=0.3,
            )
            if few and width >= min_label_ms:
                ax.text(
                    ev.start_s * 1e3 + width / 2,
                    0.5,
                    _label(ev.layers),
                    ha="center",
                    va="center",
                    fontsize=7,
                    clip_on=True,
                )
        ax.axvline(res.t_iter_s * 1e3, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks([0.5, 1.5], ["comm", "compute"])
        ax.set_ylim(0, 2)
        ax.set_title(
            f"{res.schedule}, N={res.nodes}: t_iter {res.t_iter_s * 1e3:.1f} ms, "
            f"{len(res.comm)} all-reduce(s), exposed comm {res.t_comm_exposed_s * 1e3:.1f} ms",
            fontsize=9,
            loc="left",
        )
    axes[-1].set_xlabel("time in the iteration (ms): forward, backward (layer L-1 first), all-reduces")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_timeline(results: Sequence[SimResult], path: str | os.PathLike, title: str = "") -> Path:
    """Write the Gantt chart as PNG (or any format matplotlib knows from the suffix), atomically."""
    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    timeline_figure(results, title).savefig(buf, format=fmt, dpi=130)
    return atomic_write_bytes(path, buf.getvalue())
