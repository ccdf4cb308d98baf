"""Gantt chart of iterations, simulated or measured, like MG-WFBP Fig. 2 (WFBP) and Fig. 4 (merged gradients).

One panel per :class:`Panel`; each has a *compute* row (a bar per span: forward in blues, backward in
greens, shades alternating by layer so neighbours stay apart; the optimizer step grey) and a
*communication* row (a bar per all-reduce in alternating reds, the paper's red rectangles, labelled with its
layers when there are few and the bar is wide enough). Times in milliseconds from the panel's ``t0``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.timeline.chrome import read_chrome_spans
from dpcomm.timeline.span import Span
from dpcomm.utils.io import atomic_write_bytes

__all__ = ["Panel", "measured_panels", "plot_panels", "timeline_figure"]

_SHADES = {
    "forward": ("#9ecae1", "#6baed6"),  # blues
    "backward": ("#a1d99b", "#74c476"),  # greens
    "step": ("#bdbdbd", "#bdbdbd"),  # grey
}
_OTHER = ("#9e9ac8", "#9e9ac8")
_COMM = ("#fc9272", "#de2d26")  # reds: all-reduce
_MAX_LABELLED = 24  # more all-reduces than this in a panel: no labels (they would overlap)


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    """One row pair of the chart."""

    title: str
    spans: Sequence[Span]
    t0: float = 0.0
    """Time (s) drawn as 0."""
    marker_s: float | None = None
    """A dashed vertical line at this time (s, same scale as the spans), e.g. the simulated ``t_iter``."""


def _label(layers: Sequence[int]) -> str:
    return str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"


def timeline_figure(panels: Sequence[Panel], *, title: str = "", xlabel: str = "time (ms)") -> Figure:
    """A matplotlib Figure with one Gantt panel per entry (no pyplot state involved)."""
    if not panels:
        raise ValueError("nothing to draw: no timelines")
    fig = Figure(figsize=(11, 1.6 + 1.5 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    longest = max((s.end - p.t0 for p in panels for s in p.spans), default=0.0)
    min_label_ms = 0.04 * longest * 1e3  # narrower bars stay unlabelled
    for ax, panel in zip(axes, panels, strict=True):
        comm = [s for s in panel.spans if s.row == "comm"]
        for s in panel.spans:
            start, width = (s.start - panel.t0) * 1e3, (s.end - s.start) * 1e3
            if s.row != "comm":
                shades = _SHADES.get(s.kind, _OTHER)
                color = shades[int(s.args.get("layer", 1)) % 2]
                ax.broken_barh([(start, width)], (1.1, 0.8), facecolors=color, edgecolor="none")
        for i, s in enumerate(comm):
            start, width = (s.start - panel.t0) * 1e3, (s.end - s.start) * 1e3
            ax.broken_barh(
                [(start, width)], (0.1, 0.8), facecolors=_COMM[i % 2], edgecolor="white", linewidth=0.3
            )
            layers = s.args.get("layers")
            if layers and len(comm) <= _MAX_LABELLED and width >= min_label_ms:
                ax.text(
                    start + width / 2, 0.5, _label(layers), ha="center", va="center", fontsize=7, clip_on=True
                )
        if panel.marker_s is not None:
            ax.axvline((panel.marker_s - panel.t0) * 1e3, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks([0.5, 1.5], ["comm", "compute"])
        ax.set_ylim(0, 2)
        ax.set_title(panel.title, fontsize=9, loc="left")
    axes[-1].set_xlabel(xlabel)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_panels(
    panels: Sequence[Panel], path: str | os.PathLike, *, title: str = "", xlabel: str = "time (ms)"
) -> Path:
    """Write the chart (PNG, or any format matplotlib knows from the suffix), atomically."""
    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    timeline_figure(panels, title=title, xlabel=xlabel).savefig(buf, format=fmt, dpi=130)
    return atomic_write_bytes(path, buf.getvalue())


def measured_panels(traces: dict[str, str | os.PathLike], iterations: int = 2, rank: int = 0) -> list[Panel]:
    """One panel per labelled Chrome trace file written by the runtime: rank ``rank``'s last ``iterations``
    iterations, from the first of those iterations' forward start."""
    if not traces:
        raise ValueError("nothing to draw: no traces")
    panels = []
    what = "last iteration" if iterations == 1 else f"last {iterations} iterations"
    for label, path in traces.items():
        spans = read_chrome_spans(path, rank)
        starts = [s.start for s in spans if s.name == "forward" and s.row == "compute"]
        t0 = (starts[-iterations] if len(starts) >= iterations else starts[0]) if starts else 0.0
        mine = [s for s in spans if s.start >= t0] if starts else []
        end = max((s.end - t0 for s in mine), default=0.0) * 1e3
        panels.append(Panel(title=f"{label}: {what} on rank {rank} ({end:.0f} ms)", spans=mine, t0=t0))
    return panels
