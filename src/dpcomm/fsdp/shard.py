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
3. rank 0 plans (:func:`dpcomm.planner.fsdp.plan_fsdp`, under ``memory`` bytes of unsharded parameters)
   and broadcasts the plan, or its one-line error (a budget nothing fits); every rank checks its sha256;
4. for ``optimal``, the model is checked where it may be wrong: the plan and ``per-block`` are applied to
   copies of the model and timed round-robin on ``example`` (``verify_iters`` forward and backward passes
   each, the slowest rank's median); the faster is kept, ``per-block`` (what users write) within 2%;
5. the kept plan's units become ``fully_shard`` calls (:mod:`dpcomm.fsdp.groups`: children first, the
   root last, units merged where FSDP2 cannot cut them), the last unit with ``reshard_after_forward=False``
   (the model's rule), the others with the plan's choice, and each unit prefetches the next ``depth`` units
   in forward and the previous ``depth`` in backward (``set_modules_to_forward_prefetch`` /
   ``set_modules_to_backward_prefetch``). Depth 0 leaves FSDP2's defaults: none in forward, one unit in
   backward (an empty list means "default" to FSDP2).

On CPU the all-gathers are made asynchronous (FSDP2's ``_set_unshard_async_op(True)``: gloo has no
streams, and FSDP2's default ``async_op=False`` would block the thread on every gather, prefetched or not),
and the plan is made under the model's ``overlap="gathers"``: the reduce-scatters still block
(:mod:`dpcomm.planner.fsdp_model`). On GPUs FSDP2's streams overlap both: ``overlap="streams"``.

What was decided is ``model.dpcomm`` (:class:`Sharded`). A plan whose peak (the model's, plus the bytes of
units FSDP2 keeps unsharded longer, a tied weight's: :attr:`Sharded.peak_bound_bytes`) exceeds ``memory``
is planned again under a budget lowered by the excess (a planner name), else refused in one line before
anything is sharded.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.fsdp.costs import fsdp_costs
from dpcomm.fsdp.groups import ROOT, ShardGroups, shard_groups
from dpcomm.planner.fsdp import FSDP_MAX_DEPTH, Modules, fsdp_time, peak_memory, plan_fsdp
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.trace.format import Layer, Trace
from dpcomm.utils.sizes import parse_size

__all__ = ["Sharded", "apply_plan", "overlap_of", "plan_on_workers", "shard"]

_PREFER_WITHIN = 0.02  # per-block is kept unless the plan is measurably (> 2%) faster, as ddp.wrap does


@dataclass(slots=True, kw_only=True)
class Sharded:
    """What :func:`shard` decided, kept on the model as ``model.dpcomm``."""

    plan: FsdpPlan
    """The plan FSDP2 runs: the kept one, its units merged where FSDP2 cannot cut (``groups.notes``)."""
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
    trial: dict[str, float] | None = None
    """Median forward+backward seconds per candidate (slowest rank), if the trial ran."""
    overlap: str = "streams"
    """The model's overlap the plan was made and timed under: ``gathers`` on CPU, else ``streams``."""


def overlap_of(model: nn.Module) -> str:
    """The FSDP model's overlap for where ``model`` lives: ``gathers`` on CPU (asynchronous all-gathers,
    blocking reduce-scatters), ``streams`` elsewhere (module docstring)."""
    return "gathers" if next(model.parameters()).device.type == "cpu" else "streams"


def _budget(memory: int | str | None) -> int | None:
    if memory is None:
        return None
    if isinstance(memory, str):
        return parse_size(memory, what="FSDP memory budget", minimum=0)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise UserError(f"FSDP memory budget must be a number of bytes >= 0, got {memory!r}")
    return memory


def _call(model: nn.Module, example: Any) -> Any:
    return model(*example) if isinstance(example, tuple) else model(example)


def _profile(model: nn.Module, example: Any, loss_fn: Any, iters: int, group: Any) -> Trace:
    """Step 1: the gradient units' times on every rank, averaged; buffers and RNG as they were."""
    from dpcomm.planner.autoplan import rank_mean
    from dpcomm.trace.profiler import profile

    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[]):
        local = profile(model, example, iters=iters, warmup=1, device=next(model.parameters()).device,
                        loss_fn=loss_fn)  # fmt: skip
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
    n = local.num_layers
    fb = rank_mean([x.forward_s for x in local.layers] + [x.backward_s for x in local.layers], group)
    layers = tuple(
        replace(x, forward_s=fb[i], backward_s=fb[n + i], extra={}) for i, x in enumerate(local.layers)
    )
    return replace(
        local, model=type(model).__name__, layers=layers, extra={"measured_by": "dpcomm.fsdp.shard"}
    )


def _sizes_trace(model: nn.Module) -> Trace:
    """Sizes only: the learnable layers in registration order (no example to run)."""
    from dpcomm.models.layers import learnable_layers
    from dpcomm.trace.units import layer_units, unit_params

    units = layer_units(model, learnable_layers(model))
    rows = tuple(
        Layer(name=u.name, params=sum(p.numel() for p in ps), forward_s=0.0, backward_s=0.0,
              param_names=u.param_names)
        for u, ps in zip(units, unit_params(model, units), strict=True)
    )  # fmt: skip
    dtype_bytes = next(model.parameters()).element_size()
    return Trace(
        model=type(model).__name__, batch_size=1, device="none", dtype_bytes=dtype_bytes, layers=rows
    )


def _on_root(method: str, trace: Trace, ag: CommCost, rs: CommCost, memory: int | None, max_depth: int,
             group: Any, overlap: str) -> FsdpPlan:  # fmt: skip
    """Step 3: rank 0 plans, every rank gets the plan or rank 0's one-line error, and checks the hash."""
    box: list[Any] = [None]
    if dist.get_rank(group) == 0:
        try:
            p = plan_fsdp(method, trace, ag, rs, memory=memory, max_depth=max_depth, overlap=overlap)
            box[0] = {"plan": p.to_dict(), "time_s": p.time_s, "peak_bytes": p.peak_bytes}
        except UserError as exc:
            box[0] = {"error": str(exc)}
    dist.broadcast_object_list(
        box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group
    )
    if "error" in box[0]:
        raise UserError(box[0]["error"])
    plan = replace(
        FsdpPlan.from_dict(box[0]["plan"]), time_s=box[0]["time_s"], peak_bytes=box[0]["peak_bytes"]
    )
    hashes: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hashes, plan.sha256(), group=group)
    if len(set(hashes)) > 1:
        raise UserError(f"ranks hold different FSDP plans (sha256 {', '.join(h[:12] for h in hashes)})")
    return plan


def plan_on_workers(
    model: nn.Module,
    method: str,
    *,
    example: Any | None = None,
    loss_fn: Any = None,
    memory: int | str | None = None,
    profile_iters: int = 3,
    max_depth: int = FSDP_MAX_DEPTH,
    process_group: Any = None,
) -> tuple[FsdpPlan, Trace, CommCost, CommCost]:
    """Steps 1-3 of the module docstring on every rank of ``process_group``: ``(plan, trace, T_ag, T_rs)``,
    the same on every rank. ``optimal`` needs ``example`` (one input batch)."""
    name = str(method).strip().lower()
    if example is None and name == "optimal":
        raise UserError("FSDP planner 'optimal' needs the units' times: pass example=<one input batch>")
    trace = _sizes_trace(model) if example is None else _profile(model, example, loss_fn, profile_iters,
                                                                  process_group)  # fmt: skip
    total = sum(trace.layer_bytes(i) for i in range(trace.num_layers))
    ag, rs, _, _ = fsdp_costs(total, process_group)
    plan = _on_root(name, trace, ag, rs, _budget(memory), max_depth, process_group, overlap_of(model))
    return plan, trace, ag, rs


def _mesh(model: nn.Module, group: Any) -> Any:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    kind = next(model.parameters()).device.type
    if group is None:
        return init_device_mesh(kind, (dist.get_world_size(),))
    return DeviceMesh.from_group(group, kind)


def _run_plan(
    model: nn.Module,
    plan: FsdpPlan,
    groups: ShardGroups,
    layer_params: Any,
    trace: Trace | None,
    ag: Any,
    rs: Any,
) -> tuple[FsdpPlan, int]:
    """The plan with the units FSDP2 runs (re-modelled where merged and the trace is known), and the peak
    bound: the model's peak plus the spanning units' bytes (bytes from the model's own parameters)."""
    size = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    m = np.array([sum(size[n] for n in names) for names in layer_params], dtype=float)
    run = replace(plan, units=groups.units) if tuple(plan.units) != groups.units else plan
    d, r = run.depth, run.reshard_after_forward
    peak = peak_memory(list(run.units), m, depth=d, reshard=r)
    if run is not plan:
        t = float("nan")
        if trace is not None and ag is not None:
            f, b, _ = Modules.from_trace(trace).arrays
            t = fsdp_time(list(run.units), f, b, m, ag, rs, depth=d, reshard=r, overlap=overlap_of(model))
        run = replace(run, time_s=t, peak_bytes=int(peak))
    spans = sum(int(m[a : z + 1].sum()) for k, (a, z) in enumerate(run.units) if k in groups.spanning)
    return run, int(peak) + spans


def apply_plan(model: nn.Module, plan: FsdpPlan, groups: ShardGroups, mesh: Any) -> nn.Module:
    """Step 5: ``fully_shard`` per unit in ``groups.order``, the root last; prefetch and reshard set."""
    from torch.distributed.fsdp import fully_shard

    mods = dict(model.named_modules())
    last = len(groups.units) - 1
    handles: dict[int, Any] = {}
    for k in groups.order:
        paths = groups.modules[k]
        keep = plan.reshard_after_forward and k != last
        if paths == (ROOT,):
            continue  # the root call comes last
        target = [mods[p] for p in paths]
        fully_shard(target if len(target) > 1 else target[0], mesh=mesh, reshard_after_forward=keep)
        handles[k] = mods[paths[0]]
    root = groups.root_unit
    fully_shard(
        model, mesh=mesh, reshard_after_forward=bool(plan.reshard_after_forward and root not in (None, last))
    )
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
    return model


def _layer_params(model: nn.Module, example: Any, loss_fn: Any) -> tuple[tuple[str, ...], ...]:
    from dpcomm.models.layers import learnable_layers
    from dpcomm.trace.units import gradient_units, layer_units

    if example is None:
        return tuple(u.param_names for u in layer_units(model, learnable_layers(model)))
    with torch.random.fork_rng(devices=[]):
        return tuple(u.param_names for u in gradient_units(model, example, loss_fn))


def _trial(model, plans, layer_params, example, loss_fn, iters, mesh, group) -> tuple[int, list[float]]:
    """Step 4: each plan applied to a copy of ``model``, timed round-robin; the kept index and medians."""
    from dpcomm.timing import slowest
    from dpcomm.trace.profiler import default_loss

    copies = [copy.deepcopy(model) for _ in plans]
    for c, p in zip(copies, plans, strict=True):
        apply_plan(c, p, shard_groups(c, p, layer_params), mesh)
    times: list[list[float]] = [[] for _ in plans]
    with torch.random.fork_rng(devices=[]):
        for step in range(len(plans) * (1 + iters)):  # one untimed pass each: FSDP2's lazy init
            k = step % len(plans)
            for p in copies[k].parameters():
                p.grad = None
            t0 = time.perf_counter()
            (loss_fn or default_loss)(_call(copies[k], example)).backward()
            if step >= len(plans):
                times[k].append(time.perf_counter() - t0)
    medians = slowest([statistics.median(t) for t in times], group)
    best = min(range(len(plans)), key=medians.__getitem__)
    if medians[-1] <= medians[best] * (1 + _PREFER_WITHIN):
        best = len(plans) - 1  # the last candidate is per-block
    return best, medians


def _shape(p: FsdpPlan) -> tuple[Any, ...]:
    return (p.units, p.depth, p.reshard_after_forward)


REPLANS = 4
"""At most this many plans again under a lowered budget when FSDP2's peak exceeds the model's
(:func:`_within_bound`)."""


def _within_bound(
    method: str, plan: FsdpPlan, model: nn.Module, layer_params: Any, trace: Trace, ag: Any, rs: Any,
    budget: int | None, max_depth: int, group: Any,
) -> FsdpPlan:  # fmt: skip
    """``plan`` (planner ``method``'s), or ``method``'s plan under a budget lowered by what FSDP2 keeps
    unsharded beyond the model's peak (a tied weight's unit, kept to its last module's forward:
    :attr:`Sharded.peak_bound_bytes`) until that bound fits ``budget`` (at most :data:`REPLANS` times; every
    rank alike, the bound is a function of the plan). A plan that still does not fit is returned, and
    ``shard`` refuses it in one line."""
    if budget is None:
        return plan
    lowered = budget
    for _ in range(REPLANS):
        groups = shard_groups(model, plan, layer_params)
        over = _run_plan(model, plan, groups, layer_params, trace, ag, rs)[1] - budget
        if over <= 0 or lowered - over < 0:
            return plan
        lowered -= over
        try:
            plan = _on_root(method, trace, ag, rs, lowered, max_depth, group, overlap_of(model))
        except UserError:  # nothing fits the lowered budget
            return plan
    return plan


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
) -> nn.Module:
    """``model`` sharded by FSDP2 as ``plan`` says (see the module docstring); returns it (the same object).

    ``plan``: an :class:`FsdpPlan` or a planner name (``optimal`` needs ``example``). ``example``: one input
    batch (a tensor or a tuple) to time the units on and find their gradient-ready order. ``memory``: the
    budget of unsharded parameter bytes (an int or ``"64MB"``). ``verify_iters``: timed passes per
    candidate in the trial (``optimal`` only; 0: keep the planned plan untimed). ``layer_params``: with a
    given plan, the parameter names of each of its layers (default: the gradient units of ``example``, else
    the learnable layers). Build the optimizer after.
    """
    if not dist.is_initialized():
        raise UserError(
            "dpcomm.fsdp.shard needs torch.distributed initialised (dist.init_process_group(...))"
        )
    budget = _budget(memory)
    trace = ag = rs = None
    trial = None
    if isinstance(plan, str):
        requested, trace, ag, rs = plan_on_workers(
            model, plan, example=example, loss_fn=loss_fn, memory=budget, profile_iters=profile_iters,
            max_depth=max_depth, process_group=process_group,
        )  # fmt: skip
        layer_params = tuple(tuple(x.param_names) for x in trace.layers)
    else:
        requested = plan
        if layer_params is None:
            layer_params = _layer_params(model, example, loss_fn)
        layer_params = tuple(tuple(x) for x in layer_params)
    if trace is not None:
        requested = _within_bound(str(plan).strip().lower(), requested, model, layer_params, trace, ag, rs,
                                  budget, max_depth, process_group)  # fmt: skip
    kept = requested
    mesh = _mesh(model, process_group)
    if (trace is not None and example is not None and verify_iters > 0 and requested.method == "optimal"
            and dist.get_world_size(process_group) > 1):  # fmt: skip
        try:
            block = _on_root("per-block", trace, ag, rs, budget, max_depth, process_group, overlap_of(model))
            block = _within_bound("per-block", block, model, layer_params, trace, ag, rs, budget, max_depth,
                                  process_group)  # fmt: skip
        except UserError:  # no blocks, or per-block does not fit: nothing to time against
            block = None
        if block is not None and _shape(block) != _shape(requested):
            best, medians = _trial(model, [requested, block], layer_params, example, loss_fn, verify_iters,
                                   mesh, process_group)  # fmt: skip
            kept = [requested, block][best]
            trial = {"optimal": medians[0], "per-block": medians[1]}
    groups = shard_groups(model, kept, layer_params)
    run, bound = _run_plan(model, kept, groups, layer_params, trace, ag, rs)
    if budget is not None and bound > budget:
        raise UserError(
            f"FSDP plan '{kept.method}' needs {bound:,} bytes unsharded as FSDP2 runs it, over the budget of "
            f"{budget:,} ({'; '.join(groups.notes)})"
        )
    apply_plan(model, run, groups, mesh)
    model.dpcomm = Sharded(
        plan=run, requested=requested, groups=groups, layer_params=layer_params, peak_bound_bytes=bound,
        trace=trace, ag_cost=ag, rs_cost=rs, trial=trial, overlap=overlap_of(model),
    )  # fmt: skip
    return model
