"""``dpcomm plan --fsdp METHOD --plot FILE``: the time-memory front of ``optimal`` at the plan's shard group,
with ``per-block`` and ``whole`` as points (:mod:`dpcomm.cli.plan_fsdp`)."""

from __future__ import annotations

__all__ = ["PLOT_BUDGETS", "PLOT_GAP", "plot_front"]

PLOT_BUDGETS = 16
"""``--plot``: the front sampled at this many budgets (one plan each; every point of TinyLlama's front, 46
plans, took 25 s on the 2-core VM, more on a cluster's prices)."""
PLOT_GAP = 0.02
"""``--plot``: each point within this fraction of its certified bound (or ``--gap``, if larger): near the
smallest budgets ``optimal`` at 0.5% took over 20 s a point on TinyLlama at 128 ranks, at 2% 0.6 s."""


def plot_front(path, trace, plan, costs, world: int, opts):
    """The front at the plan's group size, planned on the costs' lines as the plan was
    (:func:`dpcomm.sim.fsdp_costs.linear_costs`), each point timed with the costs themselves (the points
    another beats, on those times, dropped)."""
    from dataclasses import replace

    from dpcomm.planner.fsdp import Modules, fsdp_time, plan_fsdp
    from dpcomm.planner.fsdp_plot import plot_pareto
    from dpcomm.planner.fsdp_precision import scaled_bytes
    from dpcomm.planner.hsdp import hsdp_front
    from dpcomm.sim.fsdp_costs import linear_costs

    mods, k = Modules.from_trace(trace).under(opts["precision"])
    f, b, m = mods.arrays
    G = plan.shard_group if plan.shard_group is not None else world
    lines, _ = linear_costs(costs, float(m[m > 0].min()), float(m.sum()))
    (ag, rs, ar), exact = lines(G), costs(G)
    rs, ar = scaled_bytes(rs, k), scaled_bytes(ar, k)  # reductions in reduce_dtype bytes
    exact = (exact[0], scaled_bytes(exact[1], k), scaled_bytes(exact[2], k))
    ar, ar_exact = (ar, exact[2]) if G < world else (None, None)
    kw = {"update_s": opts["update_s"], "max_depth": opts["max_depth"], "overlap": opts["overlap"],
          "unit_s": opts["unit_s"]}  # fmt: skip
    gap = max(opts["gap"], PLOT_GAP)

    def timed(p):
        t = fsdp_time(p.units, f, b, m, exact[0], exact[1], depth=p.depth, reshard=p.reshard_after_forward,
                      update_s=kw["update_s"], overlap=kw["overlap"], ar_cost=ar_exact,
                      unit_s=kw["unit_s"])  # fmt: skip
        return replace(p, time_s=float(t))

    front = []
    for peak, _, p in hsdp_front(mods, ag, rs, ar, gap=gap, budgets=PLOT_BUDGETS, **kw):
        p = timed(p)
        if not front or p.time_s < front[-1][1]:
            front.append((peak, p.time_s, p))
    others = [timed(plan_fsdp(name, mods, ag, rs, ar_cost=ar, **kw)) for name in ("per-block", "whole")]
    shown = f", HSDP groups of {G}" if G < world else ""
    title = f"{trace.model}: FSDP time-memory front{shown}, {PLOT_BUDGETS} budgets, each within {gap:.1%}"
    return plot_pareto(front, others, path, title=title)
