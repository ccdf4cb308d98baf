"""Compute slowed by communication: a per-message and a per-byte term, fitted from a run's own records.

The simulator (MG-WFBP Eq. 6-8, :func:`dpcomm.sim.simulate`) assumes that backward runs at its profiled
speed while the all-reduces proceed beside it. Where compute and communication share CPUs (loopback on two
cores, gloo's threads, the runtime's copies into and out of flat buffers) every all-reduce issued during
backward takes CPU time from it. The iBatch paper models the same effect for pulls during forward (its
``d``, :mod:`dpcomm.planner.pull_model`); here it is generalised to a cost per message and per byte::

    backward slowed by   sum over groups g of  s_msg + s_byte * M_g          (seconds; M_g in bytes)

each group's term added to the layer whose backward issues it (the group's lowest layer index). Fitted
(:func:`fit_slowdown`) from the runs of one launch: for each run with a plan, ``y`` = its measured median
backward minus its trace's profiled backward, against ``G``, its number of groups. All plans of one model
move the same ``M = sum M_g`` bytes, so the per-byte term and a constant are one number: the fit is the
line ``y = s_byte M + s_msg G`` (non-negative least squares, :func:`dpcomm.costmodel.fit.fit_line`). Nothing
is fitted to iteration times: the prediction with the slowdown is then the simulator's, on the slowed trace
(:func:`slowed_trace`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dpcomm.plan import Plan
from dpcomm.trace.format import Trace

__all__ = ["Slowdown", "fit_from_results", "fit_slowdown", "overlap_slowed", "slowed_trace"]


@dataclass(frozen=True, slots=True)
class Slowdown:
    """The fitted slowdown of backward by communication (module docstring)."""

    per_msg_s: float
    """``s_msg``: seconds of backward lost per all-reduce issued."""
    per_byte_s: float
    """``s_byte``: seconds of backward lost per byte all-reduced."""
    runs: int
    """Runs the fit used."""


def fit_slowdown(runs: list[tuple[int, float, float]]) -> Slowdown | None:
    """The slowdown fitted from ``(groups G, bytes M, extra backward seconds)`` per run, all with the same
    ``M``; None with fewer than two distinct ``G`` (nothing to separate a per-message term from)."""
    from dpcomm.costmodel.fit import fit_line

    if len({g for g, _, _ in runs}) < 2 or len({m for _, m, _ in runs}) != 1:
        return None
    fit = fit_line([(float(g), float(y)) for g, _, y in runs], weighting="ols", nonneg=True)
    a, b = fit.coef
    m = runs[0][1]
    return Slowdown(per_msg_s=float(b), per_byte_s=float(a) / m if m > 0 else 0.0, runs=len(runs))


def fit_from_results(results: list[Any]) -> Slowdown | None:
    """:func:`fit_slowdown` over the :class:`~dpcomm.train.TrainResult` of one launch that ran a plan on
    a profiled trace (dpcomm's schedules; DDP's own layers are not timed)."""
    from dpcomm.trace.format import trace_from_dict

    runs = []
    for r in results:
        if r.plan and r.trace:
            trace = trace_from_dict(r.trace)
            plan = Plan.from_dict(r.plan)
            runs.append((len(plan.groups), float(r.grad_bytes), r.backward_s - trace.t_b))
    return fit_slowdown(runs)


def slowed_trace(trace: Trace, plan: Plan, slowdown: Slowdown) -> Trace:
    """``trace`` with each group's ``s_msg + s_byte * M_g`` added to the backward of the layer that issues
    it (the group's lowest index: backward runs from the last layer to the first)."""
    back = [layer.backward_s for layer in trace.layers]
    for g in plan.groups:
        nbytes = sum(trace.layer_bytes(i) for i in g)
        back[min(g)] += slowdown.per_msg_s + slowdown.per_byte_s * nbytes
    return _with_backward(trace, back)


def _with_backward(trace: Trace, back: list[float]) -> Trace:
    """``trace`` with its layers' backward times replaced by ``back`` (forward order)."""
    layers = tuple(replace(x, backward_s=b) for x, b in zip(trace.layers, back, strict=True))
    return replace(trace, layers=layers)


def overlap_slowed(
    trace: Trace, plan: Plan, cost: Any, nodes: int, per_byte_s: float, update_s: float = 0.0, rounds: int = 3
) -> Any:
    """The simulator's result with backward slowed by the bytes in flight beside it: each group's bytes
    that the simulation has on the wire before backward ends, times ``per_byte_s`` (measured by
    :func:`dpcomm.ddp.overlap_probe.probe_slowdown`), added to the backward of the layer that issues the
    group. A slower backward keeps more bytes in flight, so the charge is recomputed from the previous
    result, ``rounds`` times (from the unslowed simulation). Bytes sent after backward slow nothing."""
    from dpcomm.sim import simulate

    sim = simulate(trace, plan, cost, nodes, update_s=update_s)
    for _ in range(rounds):
        end = max((ev.end_s for ev in sim.compute if ev.phase == "backward"), default=0.0)
        back = [layer.backward_s for layer in trace.layers]
        for ev in sim.comm:
            span = ev.end_s - ev.start_s
            share = 1.0 if span <= 0 else min(1.0, max(0.0, (end - ev.start_s) / span))
            back[min(ev.layers)] += per_byte_s * ev.nbytes * share
        sim = simulate(_with_backward(trace, back), plan, cost, nodes, update_s=update_s)
    return sim
