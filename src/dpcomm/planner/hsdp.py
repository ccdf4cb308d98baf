"""HSDP plans: FSDP2 on a 2-D mesh of ``P = G x N`` ranks, each unit sharded over a group of ``G`` ranks
and replicated across the ``N`` groups, with the shard group size among the planner's choices.

Ours, after PyTorch's HSDP (``fully_shard(mesh=init_device_mesh(..., (N, G)))``, torch 2.13): before a
unit's forward its shards are all-gathered within the group (``A``), after its backward its gradients are
reduce-scattered within the group (``R``) and the group's shard, ``B/G`` bytes, is all-reduced across the
``N`` groups (``C``) on a stream of its own after the reduce-scatter stream. The model (events, overlap,
memory) is :mod:`dpcomm.planner.fsdp_model`'s with ``ar_cost``; each ``G`` is planned by
:func:`dpcomm.planner.fsdp.plan_fsdp` (``optimal``: exact, or within ``gap``) and the fastest wins.

Memory per rank: the model's unsharded peak plus the sharded state, ``state_bytes / G`` (parameters,
gradients and optimizer state of the whole model, bytes over all ranks together: a smaller group holds
more of it). With ``state_bytes = 0`` the budget is FSDP's, unsharded parameters only. Costs per group size
come from :func:`mesh_costs` (one flat network: ring collectives) or any function of ``G`` (for instance a
multi-GPU cluster, where a group inside a server gathers over NVLink and the all-reduce crosses servers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.planner.fsdp import (
    FSDP_GAP,
    FSDP_MAX_DEPTH,
    FsdpPlan,
    Modules,
    _choices,
    _units_of,
    pareto_front,
    peak_memory,
    plan_fsdp,
)
from dpcomm.planner.fsdp_atoms import check_atoms, in_modules
from dpcomm.planner.fsdp_model import TIE_REL, check_overlap
from dpcomm.planner.fsdp_precision import Precision, scaled_bytes
from dpcomm.planner.fsdp_search import Problem, root_bound
from dpcomm.trace.format import Trace

__all__ = ["MeshCosts", "hsdp_front", "mesh_costs", "plan_hsdp", "shard_sizes"]

MeshCosts = Callable[[int], tuple[CommCost, CommCost, CommCost]]
"""``G -> (T_ag, T_rs, T_ar)``: all-gather and reduce-scatter within a group of ``G`` ranks and the
all-reduce of a ``G``-th across the groups, each a function of a unit's full bytes ``B``."""


def mesh_costs(net: Network, world: int, shard: int) -> tuple[LinearCost, LinearCost, LinearCost]:
    """Ring collectives on one flat network for shard groups of ``shard`` ranks among ``world``, ``N =
    world / shard`` groups: all-gather ``(G-1) alpha + (G-1)/G beta B``, reduce-scatter the same plus
    ``(G-1)/G gamma B``; all-reduce of ``B/G`` bytes over ``N`` ranks (ring, :mod:`dpcomm.costmodel.ring`):
    ``2(N-1) alpha + (N-1)/N (2 beta + gamma) B/G``. A group of one rank gathers nothing; one group
    all-reduces nothing (FSDP)."""
    shard = _check_shard(world, shard)
    G, N = shard, world // shard
    ag = LinearCost((G - 1) * net.alpha, (G - 1) / G * net.beta)
    rs = LinearCost(ag.a, (G - 1) / G * (net.beta + net.gamma))
    ar = LinearCost(2 * (N - 1) * net.alpha, (N - 1) / N * (2 * net.beta + net.gamma) / G)
    return ag, rs, ar


def shard_sizes(world: int) -> list[int]:
    """Every group size that divides ``world`` ranks, ascending (1: replicas only; ``world``: FSDP)."""
    _check_shard(world, 1)
    return [g for g in range(1, world + 1) if world % g == 0]


def _check_shard(world: int, shard: int) -> int:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise UserError(f"world size must be an integer >= 1, got {world!r}")
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 1 or world % shard:
        raise UserError(f"HSDP shard group of {shard!r} ranks does not divide {world} ranks")
    return shard


def plan_hsdp(
    method: str,
    modules: Modules | Trace,
    costs: Network | MeshCosts,
    *,
    world: int,
    shards: Sequence[int] | None = None,
    memory: float | None = None,
    state_bytes: float = 0.0,
    update_s: float = 0.0,
    max_depth: int = FSDP_MAX_DEPTH,
    depth: int | None = None,
    reshard: bool | None = None,
    overlap: str = "streams",
    gap: float = FSDP_GAP,
    precision: Precision | None = None,
    unit_s: float = 0.0,
    atoms: Sequence[tuple[int, int]] | None = None,
) -> FsdpPlan:
    """The HSDP plan of ``method`` (:func:`dpcomm.planner.fsdp.plan_fsdp`'s methods) over the shard group
    sizes ``shards`` (default: every divisor of ``world``): the least modelled ``t_iter`` whose unsharded
    peak plus ``state_bytes / G`` fits ``memory`` bytes per rank (``None``: no budget); ties to the least
    memory per rank, then the smaller group. ``costs``: a :class:`Network` (:func:`mesh_costs`) or a
    function of ``G``. Group sizes are planned by their empty prefix's bound, least first, and one whose
    bound exceeds the best plan's time is not planned. The plan's ``shard_group`` is ``G``;
    ``meta["hsdp"]`` has each group size's time (``None``: none fits, or not planned) and bound, and
    ``optimal``'s ``meta["lower_bound_s"]`` holds over every group size. ``precision``: FSDP2's
    mixed-precision policy, ``unit_s`` each unit's fixed cost per pass and ``atoms`` the runs of modules no
    unit may split (:func:`dpcomm.planner.fsdp.plan_fsdp`'s)."""
    mods = Modules.from_trace(modules) if isinstance(modules, Trace) else modules
    check_overlap(overlap)
    if atoms is not None and len(check_atoms(atoms, len(mods.forward_s))) < len(mods.forward_s):
        atoms = check_atoms(atoms, len(mods.forward_s))
        plan = plan_hsdp(method, mods.on(atoms), costs, world=world, shards=shards, memory=memory,
                         state_bytes=state_bytes, update_s=update_s, max_depth=max_depth, depth=depth,
                         reshard=reshard, overlap=overlap, gap=gap, precision=precision,
                         unit_s=unit_s)  # fmt: skip
        return in_modules(plan, atoms)
    mods, k = mods.under(precision)
    given = (lambda G: mesh_costs(costs, world, G)) if isinstance(costs, Network) else costs

    def cost_of(G: int) -> tuple[CommCost, CommCost, CommCost | None]:
        ag, rs, ar = given(G)
        return ag, scaled_bytes(rs, k), scaled_bytes(ar, k)

    groups = shard_sizes(world) if shards is None else [_check_shard(world, g) for g in shards]
    if not groups:
        raise UserError("HSDP needs at least one shard group size")
    if not (math.isfinite(state_bytes) and state_bytes >= 0):
        raise UserError(f"HSDP sharded state must be a number of bytes >= 0, got {state_bytes!r}")
    best: tuple[float, float, FsdpPlan] | None = None
    times: dict[int, float | None] = {}
    bounds: dict[int, float] = {}  # a lower bound on each group size's plans
    todo = []
    for G in sorted(set(groups)):
        ag, rs, ar = cost_of(G)
        ar = ar if world // G > 1 else None
        budget = None if memory is None else memory - state_bytes / G
        times[G] = None
        if budget is None or budget >= 0:
            lb = _root(mods, ag, rs, ar, budget, update_s, _choices(max_depth, depth, reshard), overlap,
                       unit_s)  # fmt: skip
            todo.append((lb, G, ag, rs, ar, budget))
    for lb, G, ag, rs, ar, budget in sorted(todo, key=lambda x: x[:2]):  # the most promising first
        bounds[G] = lb
        state = state_bytes / G
        if best is not None and lb > best[0] * (1 + TIE_REL):
            continue  # no plan of this group size beats the best so far
        try:
            plan = plan_fsdp(method, mods, ag, rs, memory=budget, update_s=update_s, max_depth=max_depth,
                             depth=depth, reshard=reshard, overlap=overlap, gap=gap, ar_cost=ar,
                             unit_s=unit_s)  # fmt: skip
        except UserError as exc:
            if not str(exc).startswith(f"no {method.strip().lower()} plan fits"):
                raise
            continue
        times[G] = plan.time_s
        bounds[G] = max(lb, plan.meta.get("lower_bound_s", plan.time_s))
        per_rank = plan.peak_bytes + state
        if (
            best is None
            or plan.time_s < best[0] - TIE_REL * max(1.0, best[0])
            or (plan.time_s <= best[0] + TIE_REL * max(1.0, best[0]) and per_rank < best[1])
        ):
            best = (plan.time_s, per_rank, replace(plan, shard_group=G))
    if best is None:
        raise _no_fit(method, mods, groups, memory, state_bytes, max_depth, depth, reshard)
    plan = best[2]
    hsdp = {"world": world, "shard_group": plan.shard_group, "state_bytes": state_bytes, "times_s": times,
            "bounds_s": bounds}  # fmt: skip
    meta = {**plan.meta, "hsdp": hsdp, "memory_per_rank_bytes": best[1]}
    if "lower_bound_s" in meta:  # over every group size: those not planned could not beat the plan
        meta["lower_bound_s"] = lb = min(plan.meta["lower_bound_s"], *bounds.values())
        meta["gap"] = 0.0 if gap == 0 or lb <= 0 else max(0.0, plan.time_s / lb - 1)
    return replace(plan, meta=meta)


def hsdp_front(
    modules: Modules | Trace,
    ag_cost: CommCost,
    rs_cost: CommCost,
    ar_cost: CommCost | None,
    *,
    update_s: float = 0.0,
    max_depth: int = FSDP_MAX_DEPTH,
    max_points: int = 1000,
    overlap: str = "streams",
    gap: float = 0.0,
    budgets: int | None = None,
    precision: Precision | None = None,
    unit_s: float = 0.0,
) -> list[tuple[int, float, FsdpPlan]]:
    """The time-memory front of ``optimal`` at one shard group size (its costs; ``ar_cost`` ``None``:
    FSDP): ``(peak_bytes, time_s, plan)`` by rising unsharded peak (the sharded state, the same at every
    point, left out). ``budgets=None``: walked as :func:`dpcomm.planner.fsdp.pareto_front` walks it (every
    point; one plan per point). ``budgets=n``: sampled, one plan at each of ``n`` budgets spaced
    geometrically from the least any plan needs (per-layer units) to the peak of the plan without a budget,
    the points no other point beats kept (a staircase at or above the front, touching it at each budget).
    ``precision`` and ``unit_s``: as :func:`dpcomm.planner.fsdp.plan_fsdp`'s."""
    mods = Modules.from_trace(modules) if isinstance(modules, Trace) else modules
    mods, k = mods.under(precision)
    rs_cost, ar_cost = scaled_bytes(rs_cost, k), scaled_bytes(ar_cost, k)
    kw = {"update_s": update_s, "max_depth": max_depth, "overlap": overlap, "gap": gap, "ar_cost": ar_cost,
          "unit_s": unit_s}  # fmt: skip
    out: list[tuple[int, float, FsdpPlan]] = []
    if budgets is not None:
        top = plan_fsdp("optimal", mods, ag_cost, rs_cost, **kw)
        per_layer = [(i, i) for i in range(len(mods.param_bytes))]
        least = min(
            peak_memory(per_layer, mods.param_bytes, depth=d, reshard=True) for d in range(max_depth + 1)
        )
        plans = [top]
        for M in np.geomspace(max(least, 1), max(top.peak_bytes, least, 1), max(int(budgets), 2))[:-1]:
            try:
                plans.append(plan_fsdp("optimal", mods, ag_cost, rs_cost, memory=math.ceil(M), **kw))
            except UserError:
                continue
        plans.sort(key=lambda p: (p.peak_bytes, p.time_s))
        for p in plans:  # rising peak: keep a point only if it is faster than every smaller one
            if not out or p.time_s < out[-1][1] * (1 - TIE_REL):
                out.append((p.peak_bytes, p.time_s, p))
        return out
    return pareto_front(mods, ag_cost, rs_cost, max_points=max_points, **kw)


def _root(mods: Modules, ag, rs, ar, budget, update_s, choices, overlap: str, unit_s: float = 0.0) -> float:
    """A lower bound on every plan of one group size: the empty prefix's, over the depths and reshards."""
    f, b, m = mods.arrays
    p = Problem.of(f, b, m, ag, rs, memory=math.inf if budget is None else budget, update_s=update_s,
                   blocking=overlap == "gathers", ar=ar, unit_s=unit_s)  # fmt: skip
    return min(root_bound(p, d, r) for d in choices[0] for r in choices[1])


def _no_fit(method, mods: Modules, groups, memory, state_bytes, max_depth, depth, reshard) -> UserError:
    """``no METHOD HSDP plan fits M bytes; the smallest needs N bytes (G ranks per group)``."""
    name = method.strip().lower()
    units = _units_of("per-layer" if name == "optimal" else name, mods)  # no plan needs less than per-layer
    depths, reshards = _choices(max_depth, depth, reshard)
    least = min(peak_memory(units, mods.param_bytes, depth=d, reshard=r) for d in depths for r in reshards)
    need, G = min((least + state_bytes / g, g) for g in groups)
    return UserError(f"no {name} HSDP plan fits {memory:,.0f} bytes; the smallest needs {need:,.0f} bytes "
                     f"({G} ranks per group)")  # fmt: skip
