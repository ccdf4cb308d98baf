"""Gantt chart of simulated iterations, like MG-WFBP Fig. 2 (WFBP) and Fig. 4 (merged gradients).

One panel per :class:`SimResult`, drawn by :mod:`dpcomm.timeline.plot` (the plotter measured iterations use
too): compute row (forward, then backward from layer ``L-1``), communication row (one bar per group's
all-reduce, labelled with its layers), and a dashed line at ``t_iter``. Time in milliseconds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from dpcomm.sim.simulator import SimResult
from dpcomm.timeline.plot import Panel, plot_panels
from dpcomm.timeline.plot import timeline_figure as _figure

__all__ = ["plot_timeline", "timeline_figure"]

_XLABEL = "time in the iteration (ms): forward, backward (layer L-1 first), all-reduces"


def _panels(results: Sequence[SimResult]) -> list[Panel]:
    return [
        Panel(
            title=(
                f"{r.schedule}, N={r.nodes}: t_iter {r.t_iter_s * 1e3:.1f} ms, "
                f"{len(r.comm)} all-reduce(s), exposed comm {r.t_comm_exposed_s * 1e3:.1f} ms"
            ),
            spans=r.spans(),
            marker_s=r.t_iter_s,
        )
        for r in results
    ]


def timeline_figure(results: Sequence[SimResult], title: str = "") -> Figure:
    """A matplotlib Figure with one Gantt panel per result (no pyplot state involved)."""
    if not results:
        raise ValueError("nothing to draw: no simulation results")
    return _figure(_panels(results), title=title, xlabel=_XLABEL)


def plot_timeline(results: Sequence[SimResult], path: str | os.PathLike, title: str = "") -> Path:
    """Write the Gantt chart as PNG (or any format matplotlib knows from the suffix), atomically."""
    if not results:
        raise ValueError("nothing to draw: no simulation results")
    return plot_panels(_panels(results), path, title=title, xlabel=_XLABEL)
