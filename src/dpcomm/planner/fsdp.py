"""FSDP2 plans: which modules form one ``fully_shard`` unit, how far ahead to prefetch, whether to reshard.

The model (all-gathers before each unit's forward, reduce-scatters after its backward, memory of unsharded
units) is :mod:`dpcomm.planner.fsdp_model`'s, written out in ``docs/fsdp.md``; the exact minimum is
:mod:`dpcomm.planner.fsdp_optimal`. Byte counts are a unit's *full* parameter bytes ``B`` (params x dtype
bytes); a collective over ``P`` ranks costs ``T(B) = a + b B`` with the ``(P-1)/P`` share of the bytes each
rank moves inside ``b`` (:func:`ring_costs`).

Methods (:func:`plan_fsdp`), each choosing the units; the depth ``d`` in ``0..max_depth`` and the reshard
choice are then the fastest under the budget unless pinned (``depth=``, ``reshard=``), ties to the least
memory, then the least depth, then resharding:

``per-block``  one unit per repeated block, what users write by hand (torchtitan: ``fully_shard`` on each
               transformer block). A module named ``P.N.rest`` (``N`` the first all-digit component, and
               something after it) is in block ``P.N`` (``h.3.attn.c_attn`` in ``h.3``, ``layers.0.conv1`` in
               ResNet-20's first residual block ``layers.0``, ``model.layers.7.mlp`` in ``model.layers.7``).
               Consecutive modules of one block are a unit; each run of modules outside blocks is a unit
               too (GPT-2: ``wte, wpe`` before the blocks, ``ln_f`` after). FSDP2 puts those in one root
               unit; this contiguous model cannot (``docs/fsdp.md``). A model without repeated blocks
               (LeNet-5, VGG) gets one unit per top-level child (``features``, ``classifier``; LeNet-5's
               layers), as ``fully_shard`` on each child of the root would.
``whole``      one unit: the root alone (ZeRO-3 of one flat parameter).
``per-layer``  one unit per module (trace layer).
``size:BYTES`` modules in forward order, a unit closed once it holds ``>= BYTES`` bytes
               (:mod:`dpcomm.utils.sizes`; like DDP's ``bucket_cap_mb``), the last holds the rest.
``optimal``    the least modelled ``t_iter`` over all units, depths and reshard choices whose peak fits the
               budget, ties to the least peak (exact: :mod:`dpcomm.planner.fsdp_optimal`); with ``gap=``,
               within that fraction of a certified lower bound (real sizes: 723 modules in about a second).

:func:`pareto_front` walks ``optimal`` down the budgets: the time-memory front. Its plot:
:mod:`dpcomm.planner.fsdp_plot`. Every method plans over ``atoms`` where given (runs of modules one
``fully_shard`` call must take whole, :mod:`dpcomm.planner.fsdp_atoms`); ``per-block``'s and ``size``'s
units are :mod:`dpcomm.planner.fsdp_methods`'; FSDP2's fixed cost per unit, :mod:`dpcomm.planner.fsdp_unit`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.planner.fsdp_atoms import check_atoms, in_modules
from dpcomm.planner.fsdp_methods import block_units, size_units
from dpcomm.planner.fsdp_model import (
    OVERLAPS,
    TIE_REL,
    FsdpPlan,
    Units,
    check_overlap,
    check_unit_s,
    check_units,
    fsdp_inputs,
    fsdp_time,
    peak_memory,
)
from dpcomm.planner.fsdp_optimal import OptimalResult, optimal_fsdp
from dpcomm.planner.fsdp_precision import Precision, priced, scaled_bytes
from dpcomm.trace.format import Trace
from dpcomm.utils.sizes import parse_size

__all__ = [
    "FSDP_GAP",
    "FSDP_MAX_DEPTH",
    "FSDP_METHODS",
    "OVERLAPS",
    "FsdpPlan",
    "Modules",
    "Precision",
    "block_units",
    "fsdp_time",
    "pareto_front",
    "peak_memory",
    "plan_fsdp",
    "ring_costs",
    "size_units",
]

FSDP_METHODS = ("per-block", "whole", "per-layer", "size:BYTES", "optimal")
"""FSDP plan methods, in the order the CLI lists them."""

FSDP_GAP = 0.005
"""``optimal``'s default: within 0.5% of a certified lower bound (``meta["lower_bound_s"]``, ``meta["gap"]``),
as ``dpcomm plan --fsdp`` plans; ``gap=0`` is exact (the 70B shape at depth 2, compute per GPU x0.25 to x8,
with and without a 10% budget: at most 32 s on the 2-core VM, ``benchmarks/fsdp_exact.py --sweep``)."""

FSDP_MAX_DEPTH = 2
"""Deepest prefetch searched by default (``d = 0..2``): FSDP2 prefetches one unit by default; beyond a few,
the memory of ``d + 1`` unsharded units rarely buys more overlap."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Modules:
    """What the model needs of a network, per module in forward order (a trace's layers)."""

    forward_s: tuple[float, ...]
    """Forward time ``f_i`` per module, seconds."""
    backward_s: tuple[float, ...]
    """Backward time ``b_i`` per module, seconds."""
    param_bytes: tuple[int, ...]
    """Unsharded parameter bytes ``m_i`` per module (params x dtype bytes)."""
    names: tuple[str, ...] = ()
    """Module names (for ``per-block``); empty when unknown."""
    dtype_bytes: int = 0
    """Bytes per parameter element of ``param_bytes`` (a trace's ``dtype_bytes``; 0: unknown), what mixed
    precision rescales (:meth:`under`)."""

    def __post_init__(self) -> None:
        f, b, m = fsdp_inputs(self.forward_s, self.backward_s, self.param_bytes)
        object.__setattr__(self, "forward_s", tuple(map(float, f)))
        object.__setattr__(self, "backward_s", tuple(map(float, b)))
        object.__setattr__(self, "param_bytes", tuple(int(x) for x in m))
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        if self.names and len(self.names) != f.size:
            raise UserError(f"need one name per module, got {len(self.names)} for {f.size} modules")

    @classmethod
    def from_trace(cls, trace: Trace) -> Modules:
        return cls(
            forward_s=tuple(x.forward_s for x in trace.layers),
            backward_s=tuple(x.backward_s for x in trace.layers),
            param_bytes=tuple(trace.layer_bytes(i) for i in range(trace.num_layers)),
            names=tuple(x.name for x in trace.layers),
            dtype_bytes=int(trace.dtype_bytes),
        )

    def under(self, precision: Precision | None) -> tuple[Modules, float]:
        """``(modules, k)``: the bytes as FSDP2 gathers them under ``precision`` (``param_dtype``) and the
        reductions' byte factor ``k`` (:mod:`dpcomm.planner.fsdp_precision`); unchanged without one."""
        if precision is None or precision.plain:
            return self, 1.0
        m, k = priced(np.array(self.param_bytes, dtype=float) / max(self.dtype_bytes, 1), self.dtype_bytes,
                      precision)  # fmt: skip
        gather = precision.gather_bytes(self.dtype_bytes)
        return replace(self, param_bytes=tuple(int(x) for x in m), dtype_bytes=gather), k

    def on(self, atoms: Sequence[tuple[int, int]]) -> Modules:
        """One module per atom (``(first, last)`` runs): times and bytes summed, the first one's name."""
        return Modules(
            forward_s=tuple(sum(self.forward_s[a : z + 1]) for a, z in atoms),
            backward_s=tuple(sum(self.backward_s[a : z + 1]) for a, z in atoms),
            param_bytes=tuple(sum(self.param_bytes[a : z + 1]) for a, z in atoms),
            names=tuple(self.names[a] for a, _ in atoms) if self.names else (),
            dtype_bytes=self.dtype_bytes,
        )

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(f, b, m)`` as float arrays (seconds, seconds, bytes)."""
        return (np.array(self.forward_s), np.array(self.backward_s), np.array(self.param_bytes, dtype=float))


def ring_costs(net: Network, world: int) -> tuple[LinearCost, LinearCost]:
    """``(T_ag, T_rs)`` of a unit's full bytes ``B`` on ``world`` ranks, ring algorithms (the two halves of
    ring all-reduce, :mod:`dpcomm.costmodel.ring`): all-gather ``(P-1) alpha + (P-1)/P beta B``,
    reduce-scatter the same plus ``(P-1)/P gamma B`` to sum. One rank: nothing to move."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise UserError(f"world size must be an integer >= 1, got {world!r}")
    share = (world - 1) / world
    ag = LinearCost((world - 1) * net.alpha, share * net.beta)
    return ag, LinearCost(ag.a, share * (net.beta + net.gamma))


def _units_of(name: str, mods: Modules) -> Units:
    L = len(mods.forward_s)
    if name == "whole":
        return [(0, L - 1)]
    if name == "per-layer":
        return [(i, i) for i in range(L)]
    if name == "per-block":
        if not mods.names:
            raise UserError("per-block needs module names (a trace's layer names)")
        return block_units(mods.names)
    if name.startswith("size:"):
        return size_units(mods.param_bytes, parse_size(name[5:], what="FSDP unit size", minimum=1))
    raise UserError(f"unknown FSDP method {name!r}: use one of {', '.join(FSDP_METHODS)}")


def _choices(max_depth: int, depth: int | None, reshard: bool | None) -> tuple[list[int], list[bool]]:
    for what, v in (("max_depth", max_depth), ("depth", depth)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UserError(f"FSDP prefetch {what} must be an integer >= 0, got {v!r}")
    depths = [depth] if depth is not None else list(range(max_depth + 1))
    return depths, [bool(reshard)] if reshard is not None else [True, False]


def _budget(memory: float | None) -> float:
    if memory is None:
        return math.inf
    if isinstance(memory, bool) or not (memory >= 0):
        raise UserError(f"FSDP memory budget must be a number of bytes >= 0, got {memory!r}")
    return float(memory)


def _no_fit(method: str, M: float, smallest: float) -> UserError:
    return UserError(f"no {method} plan fits {M:,.0f} bytes; the smallest needs {smallest:,.0f} bytes")


def plan_fsdp(
    method: str,
    modules: Modules | Trace,
    ag_cost: CommCost,
    rs_cost: CommCost,
    *,
    memory: float | None = None,
    update_s: float = 0.0,
    max_depth: int = FSDP_MAX_DEPTH,
    depth: int | None = None,
    reshard: bool | None = None,
    overlap: str = "streams",
    gap: float = FSDP_GAP,
    ar_cost: CommCost | None = None,
    precision: Precision | None = None,
    unit_s: float = 0.0,
    atoms: Sequence[tuple[int, int]] | None = None,
) -> FsdpPlan:
    """The FSDP plan of ``method`` (module docstring) for ``modules`` (or a trace), all-gather and
    reduce-scatter costs of a unit's full bytes, a budget of ``memory`` unsharded bytes (``None``: none)
    and an optimizer step of ``update_s`` seconds. ``time_s`` and ``peak_bytes`` are the model's
    (:func:`fsdp_time`, :func:`peak_memory`) under ``overlap`` (:data:`OVERLAPS`: ``streams`` for FSDP2 on
    GPUs, ``gathers`` on CPU); a budget nothing fits is a one-line :class:`UserError`. ``gap`` (``optimal``
    only): the plan's time may exceed the optimum's by this fraction of a certified lower bound,
    ``meta["lower_bound_s"]`` (default :data:`FSDP_GAP`; 0: exact; :mod:`dpcomm.planner.fsdp_optimal`).
    ``ar_cost``: HSDP's all-reduce of a unit's shard across the replicas (``None``: FSDP;
    :func:`dpcomm.planner.hsdp.plan_hsdp` chooses the shard group). ``precision``: FSDP2's mixed-precision
    policy (:class:`Precision`): gathers and memory in ``param_dtype`` bytes, reductions in ``reduce_dtype``
    bytes (None: the parameters' own). ``unit_s``: each unit's fixed cost per pass, seconds (the model's
    ``c``: FSDP2's hooks and copies; :mod:`dpcomm.planner.fsdp_unit`). ``atoms``: runs of consecutive
    modules no unit may split (``(first, last)``, covering every module: what one ``fully_shard`` call
    must take whole, :func:`dpcomm.planner.fsdp_atoms.holder_atoms`); every method plans over them, and
    the plan's units are given in modules."""
    check_overlap(overlap)
    check_unit_s(unit_s)
    t_start = time.perf_counter()
    mods = Modules.from_trace(modules) if isinstance(modules, Trace) else modules
    if atoms is not None:
        atoms = check_atoms(atoms, len(mods.forward_s))
        if len(atoms) < len(mods.forward_s):
            plan = plan_fsdp(method, mods.on(atoms), ag_cost, rs_cost, memory=memory, update_s=update_s,
                             max_depth=max_depth, depth=depth, reshard=reshard, overlap=overlap, gap=gap,
                             ar_cost=ar_cost, precision=precision, unit_s=unit_s)  # fmt: skip
            return in_modules(plan, atoms)
    mods, k = mods.under(precision)
    rs_cost, ar_cost = scaled_bytes(rs_cost, k), scaled_bytes(ar_cost, k)
    f, b, m = mods.arrays
    name = str(method).strip().lower()
    M = _budget(memory)
    if not (math.isfinite(update_s) and update_s >= 0):
        raise UserError(f"optimizer step must be a number of seconds >= 0, got {update_s!r}")
    depths, reshards = _choices(max_depth, depth, reshard)
    if isinstance(gap, bool) or not (isinstance(gap, int | float) and 0 <= gap <= 1):
        raise UserError(f"FSDP optimality gap must be a fraction in [0, 1], got {gap!r}")
    meta: dict = {"memory_bytes": None if memory is None else M, "overlap": overlap}
    if precision is not None and not precision.plain:
        meta["precision"] = precision.to_dict()
    if name == "optimal":
        inc = None
        for other in ("whole", "per-layer", "per-block"):  # the incumbent for the bound
            try:
                got = plan_fsdp(other, mods, ag_cost, rs_cost, memory=memory, update_s=update_s,
                                max_depth=max_depth, depth=depth, reshard=reshard, overlap=overlap,
                                ar_cost=ar_cost, unit_s=unit_s)  # fmt: skip
            except UserError:
                continue
            if inc is None or got.time_s < inc.time_s:
                inc = OptimalResult(got.time_s, got.peak_bytes, list(got.units), got.depth,
                                    got.reshard_after_forward, 0, got.time_s, 0)  # fmt: skip
        res = optimal_fsdp(f, b, m, ag_cost, rs_cost, memory=M, depths=depths, reshards=reshards,
                           update_s=update_s, incumbent=inc, overlap=overlap, gap=float(gap),
                           ar_cost=ar_cost, unit_s=unit_s)  # fmt: skip
        if res is None:
            per_layer = [(i, i) for i in range(f.size)]  # no plan needs less (docs/fsdp.md)
            smallest = min(peak_memory(per_layer, m, depth=d, reshard=r) for d in depths for r in reshards)
            raise _no_fit(name, M, smallest)
        units, d, r = res.units, res.depth, res.reshard
        meta |= {"dp_time_s": res.time_s, "dp_states": res.states, "dp_passes": res.passes,
                 "lower_bound_s": res.bound_s}  # fmt: skip
        if gap == 0:  # the least peak among the fastest plans: proven, or the least found
            meta["least_peak_proven"] = res.least_peak
    else:
        units = _units_of(name, mods)
        check_units(units, f.size)
        best = None
        for d in depths:
            for r in reshards:
                peak = peak_memory(units, m, depth=d, reshard=r)
                if peak > M:
                    continue
                t = fsdp_time(units, f, b, m, ag_cost, rs_cost, depth=d, reshard=r, update_s=update_s,
                              overlap=overlap, ar_cost=ar_cost, unit_s=unit_s)  # fmt: skip
                tie = TIE_REL * max(1.0, abs(best[0])) if best else 0.0
                if best is None or t < best[0] - tie or (t <= best[0] + tie and peak < best[1]):
                    best = (t, peak, d, r)
        if best is None:
            smallest = min(peak_memory(units, m, depth=d, reshard=r) for d in depths for r in reshards)
            raise _no_fit(name, M, smallest)
        _, _, d, r = best
    t_iter = fsdp_time(units, f, b, m, ag_cost, rs_cost, depth=d, reshard=r, update_s=update_s,
                       overlap=overlap, ar_cost=ar_cost, unit_s=unit_s)  # fmt: skip
    plan = FsdpPlan(
        method=name,
        num_modules=int(f.size),
        units=units,
        depth=d,
        reshard_after_forward=r,
        time_s=t_iter,
        peak_bytes=peak_memory(units, m, depth=d, reshard=r),
        meta=meta,
    )
    if unit_s:
        meta["unit_s"] = float(unit_s)
    if "lower_bound_s" in meta:  # certified: the plan's time over the bound, less one (0: exact)
        lb = meta["lower_bound_s"]
        meta["gap"] = 0.0 if gap == 0 or lb <= 0 else max(0.0, plan.time_s / lb - 1)
    return replace(plan, meta={**meta, "planning_s": time.perf_counter() - t_start})


def pareto_front(
    modules: Modules | Trace,
    ag_cost: CommCost,
    rs_cost: CommCost,
    *,
    update_s: float = 0.0,
    max_depth: int = FSDP_MAX_DEPTH,
    max_points: int = 1000,
    overlap: str = "streams",
    gap: float = 0.0,
    ar_cost: CommCost | None = None,
    precision: Precision | None = None,
    unit_s: float = 0.0,
) -> list[tuple[int, float, FsdpPlan]]:
    """The time-memory front of ``optimal``: ``(peak_bytes, time_s, plan)`` by rising peak, every point
    the least time at a budget of its peak and the least peak at its time. Walked down from no budget: each
    plan's peak less one byte is the next budget, until none fits (bytes are whole numbers, so no point
    between is missed). ``max_points`` caps the walk (a :class:`UserError` beyond it). ``gap``: each point
    planned within it (:func:`plan_fsdp`; 0: the exact front). ``ar_cost``: HSDP's all-reduce across the
    replicas (:func:`dpcomm.planner.hsdp.hsdp_front`). ``precision``, ``unit_s``: as :func:`plan_fsdp`'s."""
    mods = Modules.from_trace(modules) if isinstance(modules, Trace) else modules
    mods, k = mods.under(precision)
    rs_cost, ar_cost = scaled_bytes(rs_cost, k), scaled_bytes(ar_cost, k)
    out: list[tuple[int, float, FsdpPlan]] = []
    budget: float | None = None
    while True:
        try:
            plan = plan_fsdp("optimal", mods, ag_cost, rs_cost, memory=budget, update_s=update_s,
                             max_depth=max_depth, overlap=overlap, gap=gap, ar_cost=ar_cost,
                             unit_s=unit_s)  # fmt: skip
        except UserError:
            break
        if out and plan.time_s <= out[-1][1] * (1 + TIE_REL):  # as fast with less peak (a least peak found,
            out.pop()  # not proven: plan_fsdp's meta["least_peak_proven"]): the point before is not on it
        out.append((plan.peak_bytes, plan.time_s, plan))
        if plan.peak_bytes == 0 or len(out) >= max_points:
            if plan.peak_bytes and len(out) >= max_points:
                raise UserError(f"the FSDP time-memory front has more than {max_points} points")
            break
        budget = plan.peak_bytes - 1
    out.reverse()
    return out
