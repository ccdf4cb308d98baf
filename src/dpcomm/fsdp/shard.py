"""``dpcomm.fsdp.shard``: stock PyTorch FSDP2 (``fully_shard``) running a dpcomm plan, for a user's own
torchrun script::

    model = dpcomm.fsdp.shard(model, "optimal", example=x, memory=64 << 20)  # after init_process_group
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)              # after: FSDP2 swaps parameters

With an :class:`~dpcomm.planner.fsdp_model.FsdpPlan` its units are applied as given. With a planner name
(``per-block``, ``whole``, ``per-layer``, ``size:BYTES``, ``optimal``) it is planned on the workers, as
:func:`dpcomm.ddp.wrap` does for DDP:

1. every rank times each gradient unit's forward and backward on ``example`` (the bare module, no
   communication: :func:`dpcomm.trace.profiler.profile`), averaged over ranks; buffers restored;
2. all-gather and reduce-scatter are measured on the real group and fitted to ``T(B) = a + b B``
   (:mod:`dpcomm.fsdp.costs`);
3. rank 0 plans (:func:`dpcomm.planner.fsdp.plan_fsdp` under ``memory`` bytes of unsharded parameters,
   over the atoms one ``fully_shard`` call must take whole, :func:`dpcomm.fsdp.groups.layer_atoms`, with
   FSDP2's fixed cost per unit, :mod:`dpcomm.planner.fsdp_unit`) and broadcasts the plan, or its one-line
   error (a budget nothing fits); every rank checks its sha256;
4. for ``optimal``, the model is checked where it may be wrong: the plan and ``per-block`` are applied to
   sharded copies of the model (built on ``meta`` and given only their shards: never a whole copy) and
   timed round-robin on ``example`` (``verify_iters`` forward and backward passes
   each, the slowest rank's median); the faster is kept, ``per-block`` (what users write) within 2%;
5. the kept plan's units become ``fully_shard`` calls, one each (:mod:`dpcomm.fsdp.groups`: children
   first, the root last; a given plan that splits a module is refused in one line), the last unit with
   ``reshard_after_forward=False`` (the model's rule), the others with the plan's choice, and each unit
   prefetches the next ``depth`` units in forward and the previous ``depth`` in backward
   (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``). Depth 0 leaves FSDP2's
   defaults: none in forward, one unit in backward (an empty list means "default" to FSDP2).

On CPU the all-gathers are made asynchronous (FSDP2's ``_set_unshard_async_op(True)``: gloo has no
streams, and FSDP2's default ``async_op=False`` would block the thread on every gather, prefetched or not),
and the plan is made under the model's ``overlap="gathers"``: the reduce-scatters still block
(:mod:`dpcomm.planner.fsdp_model`). On GPUs FSDP2's streams overlap both: ``overlap="streams"``.

What was decided is ``model.dpcomm`` (:class:`Sharded`). A plan whose peak (the model's, plus the bytes of
units FSDP2 keeps unsharded longer, a tied weight's: :attr:`Sharded.peak_bound_bytes`) exceeds ``memory``
is planned again under a budget lowered by the excess (a planner name), else refused before sharding.

The numbered steps of ``shard`` read in order here; the agreed analysis is :mod:`dpcomm.fsdp.agreed`,
planning :mod:`dpcomm.fsdp.planning`, the peak bound :mod:`dpcomm.fsdp.bound`, meshes
:mod:`dpcomm.fsdp.mesh`, the timed trial :mod:`dpcomm.fsdp.trial`, unused parameters
:mod:`dpcomm.fsdp.unused`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.fsdp.agreed import agreed_shardable, layer_params_of
from dpcomm.fsdp.bound import as_run, per_block_within, within_bound
from dpcomm.fsdp.groups import ROOT, ShardGroups, mixed_dtypes, shard_groups
from dpcomm.fsdp.keywords import (
    check_dense,
    check_fsdp_keywords,
    check_runs_as_planned,
    check_unit_s,
    planned_without,
)
from dpcomm.fsdp.mesh import given_on, meshes
from dpcomm.fsdp.planning import (
    budget_bytes,
    compute_dtype,
    is_meta,
    on_model_device,
    overlap_of,
    plan_on_workers,
    unit_s_of,
)
from dpcomm.fsdp.trial import timed_trial
from dpcomm.fsdp.unused import reduce_zeros
from dpcomm.planner.fsdp import FSDP_MAX_DEPTH
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.planner.fsdp_precision import Precision
from dpcomm.trace.format import Trace
from dpcomm.trace.units import agree
from dpcomm.utils.user_run import (
    check_same_layout,
    check_same_weights,
    first_param,
    nothing_left,
    untouched,
)

_log = logging.getLogger("dpcomm.fsdp")

__all__ = ["Sharded", "apply_plan", "overlap_of", "plan_on_workers", "shard"]


@dataclass(slots=True, kw_only=True)
class Sharded:
    """What :func:`shard` decided, kept on the model as ``model.dpcomm``."""

    plan: FsdpPlan
    """The plan FSDP2 runs: the kept one, one ``fully_shard`` call per unit."""
    requested: FsdpPlan
    """The plan as planned or given."""
    groups: ShardGroups
    """The ``fully_shard`` calls: module paths per unit and their order."""
    layer_params: tuple[tuple[str, ...], ...]
    """Parameter names of each layer the plan's units index (forward order)."""
    peak_bound_bytes: int
    """The model's peak of unsharded parameter bytes plus the spanning units' bytes."""
    trace: Trace | None = None
    """The workers' unit times (planner names only)."""
    ag_cost: CommCost | None = None
    """Fitted all-gather cost of a unit's full bytes (planner names only)."""
    rs_cost: CommCost | None = None
    """Fitted reduce-scatter cost."""
    ar_cost: CommCost | None = None
    """HSDP: the fitted all-reduce across the replicas (of a unit's full bytes); ``None``: FSDP."""
    trial: dict[str, float] | None = None
    """Median forward+backward seconds per candidate (slowest rank), if the trial ran."""
    overlap: str = "streams"
    """The model's overlap the plan was made and timed under: ``gathers`` on CPU, else ``streams``."""
    said: tuple[str, ...] = ()
    """What ``shard`` told rank 0's log besides its decision (a comparison skipped, and why)."""
    why: str = ""
    """Why this plan runs (as given, planned, the trial's choice, the budget)."""
    precision: Precision = Precision()
    """FSDP2's mixed-precision policy (``mp_policy``) the plan was priced and the bound counted in."""
    nodes: int = 1
    """The ranks of the process group sharded over."""
    _verdict: str | None = None
    """:meth:`verdict`'s line once computed (``""``: none)."""

    def verdict(self) -> str | None:
        """One line: which of DDP with the ``optimal`` plan, ``dear`` and this FSDP2 plan is fastest in the
        model (:func:`dpcomm.sim.verdict.for_fsdp`: the trace and the fitted all-gather and reduce-scatter
        costs planned with, the all-reduce their sum; computed at the first call); None for a plan given
        (no trace) and for HSDP (no all-reduce over every rank was measured)."""
        if self._verdict is None:
            got = None
            if self.trace is not None and self.ar_cost is None and self.plan.time_s == self.plan.time_s:
                from dpcomm.sim.verdict import FSDP2, for_fsdp

                name = FSDP2 if self.plan.method == "optimal" else f"FSDP2 ({self.plan.method})"
                got = for_fsdp(self.trace, self.ag_cost, self.rs_cost, self.nodes, self.plan.time_s,
                               fsdp_name=name)  # fmt: skip
            self._verdict = "" if got is None else got.text()
        return self._verdict or None

    def headline(self) -> str:
        """The first line of ``str()``: the units, prefetch, reshard choice, peak bound and why."""
        why = self.why or "as given"
        peak = f"{self.peak_bound_bytes:,} bytes unsharded at most"
        G = self.plan.shard_group
        mesh = "" if G is None else f", HSDP: shard groups of {G} ranks"
        mesh += "" if self.precision.plain else f", {self.precision}"
        return (
            f"dpcomm.fsdp.shard: {len(self.plan.units)} fully_shard units{mesh}, prefetch depth "
            f"{self.plan.depth}, reshard after forward {self.plan.reshard_after_forward}, {peak} ({why})"
        )

    def __str__(self) -> str:
        from dpcomm.trace.names import pattern

        names = [n for ns in self.layer_params for n in ns]
        lines = [self.headline()] + [f"  {v}" for v in [self.verdict()] if v]
        if self.trial:
            lines.append("  candidates: trial median forward+backward (slowest rank)")
            for name, t in self.trial.items():
                lines.append(f"    {name:<10}{t * 1e3:9.3f} ms")
        if self.plan.time_s == self.plan.time_s and self.plan.time_s:  # not NaN, not 0
            c = self.plan.meta.get("unit_s", 0.0) * 1e6  # FSDP2's fixed cost of a unit per pass (us)
            lines.append(f"  the model's iteration time: {self.plan.time_s * 1e3:.3f} ms (FSDP2's fixed cost "
                         f"{c:.0f} us a unit per pass)")  # fmt: skip
        meta = self.requested.meta
        if "lower_bound_s" in meta:  # the planner's certificate (dpcomm.planner.fsdp_optimal)
            lb, gap = meta["lower_bound_s"] * 1e3, meta.get("gap", 0.0)
            lines.append(f"  '{self.requested.method}' planned within {gap:.2%} of the model's optimum "
                         f"(certified lower bound {lb:.3f} ms)")  # fmt: skip
        lines.append("  units in forward order:")
        for k, (a, z) in enumerate(self.plan.units):
            params = [n for names_ in self.layer_params[a : z + 1] for n in names_]
            mods = ", ".join(m or "(root)" for m in self.groups.modules[k])
            lines.append(f"    {k}: {pattern(params, names)}  [fully_shard: {mods}]")
        lines += [f"  note: {n}" for n in (*self.groups.notes, *self.said)]
        return "\n".join(lines)


def apply_plan(
    model: nn.Module, plan: FsdpPlan, groups: ShardGroups, mesh: Any, *, zeros: tuple[str, ...] = (),
    process_group: Any = None, **fsdp_kw: Any,
) -> nn.Module:  # fmt: skip
    """Step 5: ``fully_shard`` per unit in ``groups.order``, the root last; prefetch and reshard set; the
    units holding parameters ``zeros`` reduce-scatter zeros where a rank leaves them unused, and a parameter
    no rank of ``process_group`` used keeps ``.grad`` as DDP would (:mod:`dpcomm.fsdp.unused`).
    ``fsdp_kw``: FSDP2's other keywords (``mp_policy``, ``offload_policy``, ...), given to every call."""
    from torch.distributed.fsdp import fully_shard

    mixed = mixed_dtypes(model, groups)
    if mixed:
        raise UserError(mixed)
    mods = dict(model.named_modules())
    last = len(groups.units) - 1
    handles: dict[int, Any] = {}
    for k in groups.order:
        paths = groups.modules[k]
        keep = plan.reshard_after_forward and k != last
        if paths == (ROOT,):
            continue  # the root call comes last
        target = [mods[p] for p in paths]
        one = target if len(target) > 1 else target[0]
        fully_shard(one, mesh=mesh, reshard_after_forward=keep, **fsdp_kw)
        handles[k] = mods[paths[0]]
    root = groups.root_unit
    fully_shard(
        model, mesh=mesh, reshard_after_forward=bool(plan.reshard_after_forward and root not in (None, last)),
        **fsdp_kw,
    )  # fmt: skip
    if root is not None:
        handles[root] = model
    d = plan.depth
    if overlap_of(model) == "gathers":
        for h in handles.values():
            if hasattr(h, "_set_unshard_async_op"):  # private in torch 2.13; without it gathers block
                h._set_unshard_async_op(True)
    if d > 0:
        for k in range(len(groups.units)):
            fwd = [handles[j] for j in range(k + 1, min(k + d, last) + 1)]
            bwd = [handles[j] for j in range(k - 1, max(k - d, 0) - 1, -1)]
            if fwd:
                handles[k].set_modules_to_forward_prefetch(fwd)
            if bwd:
                handles[k].set_modules_to_backward_prefetch(bwd)
    reduce_zeros(model, zeros, process_group)
    return model


def _shape(p: FsdpPlan) -> tuple[Any, ...]:
    return (p.units, p.depth, p.reshard_after_forward)


@nothing_left()
def shard(
    model: nn.Module,
    plan: FsdpPlan | str,
    *,
    example: Any | None = None,
    memory: int | str | None = None,
    loss_fn: Any = None,
    profile_iters: int = 3,
    verify_iters: int = 3,
    max_depth: int = FSDP_MAX_DEPTH,
    process_group: Any = None,
    layer_params: Any = None,
    mesh: Any = None,
    unit_s: float | None = None,
    **fsdp_kw: Any,
) -> nn.Module:
    """``model`` sharded by FSDP2 as ``plan`` says (see the module docstring); returns it (the same object).

    ``plan``: an :class:`FsdpPlan` or a planner name (``optimal`` needs ``example``). ``example``: one input
    batch as forward takes it (a tensor, a tuple, a dict of keyword arguments or ``dpcomm.ddp.Inputs``)
    to time the units on and find their gradient-ready order (rank 0's, for every rank). ``memory``: the
    budget of unsharded parameter bytes (an int or ``"64MB"``). ``verify_iters``: timed passes per
    candidate in the trial (``optimal`` only; 0: keep the planned plan untimed). ``layer_params``: with a
    given plan, the parameter names of each of its layers (default: the gradient units of ``example``, else
    the learnable layers). ``mesh``: HSDP, a shard group size ``G`` (an int dividing the ranks), a 2-D
    ``DeviceMesh`` (replicate, shard) or ``"auto"`` (the planner chooses ``G``; :mod:`dpcomm.fsdp.mesh`);
    default FSDP over ``process_group``. ``unit_s``: FSDP2's fixed cost of a unit per pass, seconds, the
    planner's ``c`` (default: this device's, :mod:`dpcomm.planner.fsdp_unit`; measure yours with
    ``benchmarks/fsdp_unit_cost.py``); planner names only. ``fsdp_kw``: FSDP2's ``fully_shard`` keywords
    (``mp_policy``, ``offload_policy``, ``shard_placement_fn``, ``ignored_params``), checked
    (:mod:`dpcomm.fsdp.keywords`), given to every unit's call and the trial's copies. Build the optimizer
    after.

    A model built under ``torch.device("meta")`` is planned without materialising it (its units from a
    forward and backward on ``meta``, their times from FLOPs, :func:`dpcomm.fsdp.planning.plan_on_workers`)
    and sharded on ``meta``; materialise and initialise it after, as with ``fully_shard``
    (``model.to_empty(device=...)``, then your initialisation). The model's gradients, buffers, training
    flags and the random state are as they were (:mod:`dpcomm.utils.user_run`).
    """
    if not dist.is_initialized():
        raise UserError(
            "dpcomm.fsdp.shard needs torch.distributed initialised (dist.init_process_group(...))"
        )
    first_param(model, "dpcomm.fsdp.shard")
    check_dense(model)
    check_fsdp_keywords(model, fsdp_kw)
    c = unit_s_of(model) if unit_s is None else check_unit_s(unit_s, plan)  # the planner's cost per unit
    budget = budget_bytes(memory)
    check_same_weights(model, process_group, "dpcomm.fsdp.shard")
    trace = ag = rs = ar = trial = None
    precision, said = Precision.of(fsdp_kw.get("mp_policy")), []  # priced as FSDP2 will run it
    with (
        untouched(model) as as_given,
        planned_without(fsdp_kw),
    ):  # ignored_params: in no unit, as FSDP2 leaves them
        candidates = meshes(model, mesh, process_group)
        shardable = analysis = None  # one analysis of the model, rank 0's (trace/units.agree)
        zeros: tuple[str, ...] = ()  # parameters some rank may leave unused (fsdp/agreed, fsdp/unused)
        if example is not None:
            analysis = agree(
                model, on_model_device(model, example), loss_fn, process_group, "dpcomm.fsdp.shard"
            )
            shardable, zeros = agreed_shardable(model, example, analysis, process_group)
        apply_kw = {"zeros": zeros, "process_group": process_group, **fsdp_kw}  # the model's and the copies'
        if isinstance(plan, str):
            requested, trace, ag, rs, ar = plan_on_workers(
                model, plan, example=example, loss_fn=loss_fn, memory=budget, profile_iters=profile_iters,
                max_depth=max_depth, process_group=process_group, meshes=None if mesh is None else candidates,
                analysis=analysis, precision=precision, shardable=shardable, unit_s=c,
            )  # fmt: skip
            layer_params = tuple(tuple(x.param_names) for x in trace.layers)
        else:
            requested = given_on(plan, candidates, dist.get_world_size(process_group))
            if layer_params is None:
                layer_params = layer_params_of(model, analysis)
            layer_params = tuple(tuple(x) for x in layer_params)
        check_same_layout(model, layer_params, process_group, "dpcomm.fsdp.shard", "units")  # before mapping
        as_given()  # parameters a forward cast (a router's) as the user gave them, before any copy
        if trace is not None:
            requested = within_bound(str(plan).strip().lower(), requested, model, layer_params, trace, ag,
                                      rs, budget, max_depth, process_group, shardable, ar, precision,
                                      c)  # fmt: skip
        kept = requested
        why = "as given" if trace is None else f"planned by '{requested.method}'"
        on = candidates[requested.shard_group or max(candidates)]  # the mesh the plan runs on
        groups = shard_groups(model, kept, layer_params, shardable)
        run, bound = as_run(model, kept, groups, layer_params, trace, ag, rs, ar, precision)
        fits = budget is None or bound <= budget
        if not fits and trace is not None and kept.method != "per-block":
            block = per_block_within(model, trace, (ag, rs, ar), budget, max_depth, process_group,
                                    layer_params, shardable, [], kept.shard_group, precision, c)  # fmt: skip
            if block is not None:  # FSDP2 keeps a unit unsharded longer than planned (a tied parameter's)
                said.append(f"'{kept.method}' needs {bound:,} bytes unsharded as FSDP2 runs it (units held "
                            f"beyond their layers), over {budget:,}; running per-block")  # fmt: skip
                kept, why, fits = block, "per-block: the plan does not fit the budget as FSDP2 runs it", True
        timed = (fits and kept is requested and example is not None and verify_iters > 0
                 and requested.method == "optimal" and dist.get_world_size(process_group) > 1)  # fmt: skip
        if timed and is_meta(model):
            said.append("not timed against per-block: the model is on the meta device (nothing to run)")
        elif timed:
            block = per_block_within(model, trace, (ag, rs, ar), budget, max_depth, process_group,
                                     layer_params, shardable, said, kept.shard_group, precision,
                                     c)  # fmt: skip
            if block is not None and _shape(block) != _shape(requested):
                best, medians = timed_trial(model, [requested, block], layer_params, shardable, example,
                                            loss_fn, verify_iters, on, process_group, apply_kw)  # fmt: skip
                kept = [requested, block][best]
                trial = {"optimal": medians[0], "per-block": medians[1]}
                why = "fastest in the timed trial" if best == 0 else (
                    "per-block: the plan was not measurably (> 2%) faster in the timed trial")  # fmt: skip
        groups = shard_groups(model, kept, layer_params, shardable)
        run, bound = as_run(model, kept, groups, layer_params, trace, ag, rs, ar, precision)
        half = compute_dtype(precision)
        if half is not None and example is not None and not is_meta(model):  # FSDP2 casts at units only
            check_runs_as_planned(model, on_model_device(model, example), half, groups.modules, loss_fn,
                                  process_group)  # fmt: skip
    if budget is not None and bound > budget:
        notes = f" ({'; '.join(groups.notes)})" if groups.notes else ""
        raise UserError(
            f"FSDP plan '{kept.method}' needs {bound:,} bytes unsharded as FSDP2 runs it (frozen parameters "
            f"included), over the budget of {budget:,}{notes}"
        )
    layout = [(*groups.modules[k], "|", *(n for ns in layer_params[a : z + 1] for n in ns))
              for k in groups.order for a, z in [groups.units[k]]]  # fmt: skip
    check_same_layout(model, [*layout, (str(_shape(run)),)], process_group, "dpcomm.fsdp.shard", "units")
    apply_plan(model, run, groups, on, **apply_kw)
    model.dpcomm = Sharded(
        plan=run, requested=requested, groups=groups, layer_params=layer_params, peak_bound_bytes=bound,
        trace=trace, ag_cost=ag, rs_cost=rs, ar_cost=ar, trial=trial, overlap=overlap_of(model),
        said=tuple(said), why=why, precision=precision, nodes=dist.get_world_size(process_group),
    )  # fmt: skip
    if dist.get_rank(process_group) == 0:
        _log.info(model.dpcomm.headline())  # the verdict (planning DDP and dear) only when asked
        for line in said:
            _log.info("dpcomm.fsdp.shard: %s", line)
    return model
