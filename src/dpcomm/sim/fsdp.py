"""FSDP and HSDP schedules beside DDP's in a scaling table: ``fsdp:METHOD`` and ``hsdp:METHOD[:G]``.

``METHOD`` is a planner of :func:`dpcomm.planner.fsdp.plan_fsdp` (``per-block``, ``whole``, ``per-layer``,
``size:BYTES``, ``optimal``); ``hsdp:METHOD:G`` shards over groups of ``G`` ranks and replicates across them
(:func:`dpcomm.planner.hsdp.plan_hsdp`), ``hsdp:METHOD`` lets the planner choose ``G`` among ``shards(P)``.
Each row is planned with the costs of its node count (:mod:`dpcomm.sim.fsdp_costs`) and timed by the FSDP
model's event equations (:func:`dpcomm.planner.fsdp_model.fsdp_time`, with HSDP's all-reduce); ``t_iter``,
speedup ``S(N) = N (t_f + t_b + u) / t_iter`` and efficiency ``S/N`` are defined as for the all-reduce
schedules (:mod:`dpcomm.sim.simulator`, MG-WFBP Eq. 4). ``memory_bytes``: per rank, the unsharded
parameters at the model's peak plus the sharded state (``state_bytes / G``). Costs that are not straight
lines (a flow model's) are planned on their least-squares lines (:func:`dpcomm.sim.fsdp_costs.
linear_costs`) and the plan timed with the costs themselves; ``fit_error`` says how far the lines were off.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpcomm.errors import UserError
from dpcomm.planner.fsdp import FSDP_MAX_DEPTH, FSDP_METHODS, Modules, fsdp_time, plan_fsdp
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.planner.fsdp_precision import Precision, scaled_bytes
from dpcomm.planner.hsdp import MeshCosts, plan_hsdp
from dpcomm.sim.fsdp_costs import linear_costs
from dpcomm.trace.format import Trace

__all__ = ["FsdpRow", "fsdp_sweep", "is_fsdp_schedule", "parse_fsdp_schedule", "plan_row"]

_METHOD = re.compile(r"^(per-block|whole|per-layer|optimal|size:[^:]+)$")


def is_fsdp_schedule(name: str) -> bool:
    return str(name).strip().lower().startswith(("fsdp:", "hsdp:"))


def parse_fsdp_schedule(name: str) -> tuple[str, str, int | None]:
    """``"hsdp:optimal:8"`` -> ``("hsdp", "optimal", 8)``; ``fsdp:size:64MB`` -> ``("fsdp", "size:64MB",
    None)``; ``hsdp:METHOD`` (or ``:auto``) leaves ``G`` to the planner (``None``). A bad name is a
    one-line :class:`UserError`."""
    text = str(name).strip().lower()
    kind, _, rest = text.partition(":")
    G: int | None = None
    head, _, tail = rest.rpartition(":")
    if kind == "hsdp" and head and head != "size" and (tail.isdigit() or tail == "auto"):  # size:64 is bytes
        rest, G = head, (int(tail) if tail.isdigit() else None)
        if G is not None and (len(tail) > 9 or G < 1):
            raise UserError(f"{name}: the shard group must be an integer >= 1")
    if kind not in ("fsdp", "hsdp") or not _METHOD.match(rest):
        raise UserError(
            f"unknown FSDP schedule {name!r}: fsdp:METHOD or hsdp:METHOD[:G], METHOD one of "
            f"{', '.join(FSDP_METHODS)}"
        )
    return kind, rest, G


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpRow:
    """One (nodes, schedule) cell of an FSDP or HSDP schedule: the plan and its modelled time."""

    nodes: int
    schedule: str
    t_iter_s: float
    speedup: float
    efficiency: float
    t_comm_exposed_s: float
    planning_s: float
    memory_bytes: float
    """Per rank: unsharded parameter bytes at the model's peak plus the sharded state."""
    plan: FsdpPlan
    fit_error: float = 0.0
    """The planning lines' worst relative error against the costs at the plan's group size (0: exact)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of ``dpcomm simulate --json``: the all-reduce rows' keys and the plan's shape."""
        return {
            "nodes": self.nodes,
            "schedule": self.schedule,
            "t_iter_s": self.t_iter_s,
            "speedup": self.speedup,
            "efficiency": self.efficiency,
            "memory_bytes": self.memory_bytes,
            "units": len(self.plan.units),
            "depth": self.plan.depth,
            "reshard_after_forward": self.plan.reshard_after_forward,
            "shard_group": self.plan.shard_group if self.plan.shard_group is not None else self.nodes,
            "fit_error": self.fit_error,
        }


def plan_row(
    schedule: str,
    trace: Trace,
    costs: MeshCosts,
    nodes: int,
    *,
    memory: float | None = None,
    state_bytes: float = 0.0,
    shards: Sequence[int] | None = None,
    update_s: float = 0.0,
    max_depth: int = FSDP_MAX_DEPTH,
    overlap: str = "streams",
    gap: float = 0.0,
    precision: Precision | None = None,
    unit_s: float = 0.0,
) -> FsdpRow:
    """Plan ``schedule`` on ``nodes`` ranks with ``costs`` under ``memory`` bytes per rank (``None``: no
    budget), then time it by the model. ``shards``: the group sizes ``hsdp:METHOD`` chooses among.
    ``precision``: FSDP2's mixed-precision policy, gathers and memory in ``param_dtype`` bytes, reductions
    in ``reduce_dtype`` bytes (:mod:`dpcomm.planner.fsdp_precision`). ``unit_s``: FSDP2's fixed cost of a
    unit per pass, seconds (:mod:`dpcomm.planner.fsdp_unit`; in ``t_comm_exposed_s`` with the
    collectives)."""
    kind, method, G = parse_fsdp_schedule(schedule)
    mods, k = Modules.from_trace(trace).under(precision)
    if k != 1:
        costs = _reduced_in(costs, k)
    f, b, m = mods.arrays
    lines, errors = linear_costs(costs, float(m[m > 0].min()) if (m > 0).any() else 1.0, float(m.sum()))
    if kind == "fsdp":
        budget = None if memory is None else memory - state_bytes / nodes
        if budget is not None and budget < 0:
            raise UserError(f"{schedule}: the sharded state alone ({state_bytes / nodes:,.0f} bytes a rank) "
                            f"exceeds {memory:,.0f} bytes")  # fmt: skip

    def planned(name: str) -> FsdpPlan:
        if kind == "fsdp":
            ag, rs, _ = lines(nodes)
            return plan_fsdp(name, mods, ag, rs, memory=budget, update_s=update_s, max_depth=max_depth,
                             overlap=overlap, gap=gap, unit_s=unit_s)  # fmt: skip
        return plan_hsdp(name, mods, lines, world=nodes, shards=[G] if G is not None else shards,
                         memory=memory, state_bytes=state_bytes, update_s=update_s, max_depth=max_depth,
                         overlap=overlap, gap=gap, unit_s=unit_s)  # fmt: skip

    def priced(plan: FsdpPlan, by: MeshCosts = costs) -> float:  # timed by the costs, not their lines
        ag, rs, ar = by(plan.shard_group or nodes)
        d, r, ar = plan.depth, plan.reshard_after_forward, ar if kind == "hsdp" else None
        return float(fsdp_time(plan.units, f, b, m, ag, rs, depth=d, reshard=r, update_s=update_s,
                               overlap=overlap, ar_cost=ar, unit_s=unit_s))  # fmt: skip

    plan = planned(method)
    t_iter = priced(plan)
    if method == "optimal" and any(errors.values()):
        plan, t_iter = _best_priced(plan, t_iter, planned, priced, m, memory, state_bytes, nodes, max_depth)
        plan = replace(plan, time_s=priced(plan, lines))  # the plan's time, as planned, on the lines
    group = plan.shard_group or nodes
    compute = trace.t_f + trace.t_b + update_s
    speedup = nodes * compute / t_iter if t_iter > 0 else float(nodes)
    return FsdpRow(
        nodes=nodes,
        schedule=schedule,
        t_iter_s=t_iter,
        speedup=speedup,
        efficiency=speedup / nodes,
        t_comm_exposed_s=t_iter - compute,
        planning_s=plan.meta.get("planning_s", 0.0),
        memory_bytes=plan.peak_bytes + state_bytes / group,
        plan=plan,
        fit_error=errors.get(group, 0.0),
    )


def _reduced_in(costs: MeshCosts, k: float) -> MeshCosts:
    """``costs`` with the reductions (reduce-scatter, HSDP's all-reduce) of ``k`` times a unit's bytes."""

    def priced(G: int):
        ag, rs, ar = costs(G)
        return ag, scaled_bytes(rs, k), scaled_bytes(ar, k)

    return priced


def _best_priced(plan, t_iter, planned, priced, m, memory, state_bytes, nodes, max_depth):
    """``optimal`` on costs that are not lines: the line-optimal plan, or the simple planners' plans (made on
    the same lines), each at every prefetch depth and reshard that fits, whichever the costs themselves time
    fastest; so ``optimal`` never loses to ``per-block`` on the prices its row reports (the lines' optimum
    need not be the prices'). ``meta["priced_best"]`` names the planner whose units won."""
    from dpcomm.planner.fsdp import peak_memory

    best, won = (t_iter, plan), "optimal"
    for name in ("optimal", "per-block", "whole", "per-layer"):
        try:
            base = plan if name == "optimal" else planned(name)
        except UserError:
            continue
        G = base.shard_group or nodes
        room = None if memory is None else memory - state_bytes / G
        for d in range(max_depth + 1):
            for r in (True, False):
                peak = peak_memory(list(base.units), m, depth=d, reshard=r)
                if room is not None and peak > room:
                    continue
                cand = replace(base, depth=d, reshard_after_forward=r, peak_bytes=int(peak))
                t = priced(cand)
                if t < best[0] * (1 - 1e-12):
                    best, won = (t, cand), name
    t, kept = best
    return replace(kept, method="optimal", meta={**plan.meta, "priced_best": won}), t


def fsdp_sweep(
    trace: Trace,
    costs_for: Callable[[int], MeshCosts],
    nodes_list: Iterable[int],
    schedules: Sequence[str],
    *,
    shards_for: Callable[[int], Sequence[int]] | None = None,
    **opts: Any,
) -> list[FsdpRow]:
    """Rows for every (nodes, schedule), nodes-major: ``costs_for(nodes)`` prices each node count,
    ``shards_for(nodes)`` the group sizes ``hsdp:METHOD`` may choose (default: every divisor);
    ``opts``: :func:`plan_row`'s."""
    for s in schedules:
        parse_fsdp_schedule(s)  # every name checked before anything is planned
    rows = []
    for nodes in nodes_list:
        costs = costs_for(nodes)
        shards = shards_for(nodes) if shards_for is not None else None
        for s in schedules:
            rows.append(plan_row(s, trace, costs, int(nodes), shards=shards, **opts))
    return rows
