"""Steps 1-3 of :func:`dpcomm.fsdp.shard` on the workers: profile the units, fit the two collectives, plan
on rank 0 over the model's atoms (:func:`dpcomm.fsdp.groups.layer_atoms`: every unit one ``fully_shard``
call) with FSDP2's fixed cost per unit (:mod:`dpcomm.planner.fsdp_unit`) and check the plan's hash on every
rank. Modules holding only frozen parameters are layers too (:mod:`dpcomm.fsdp.frozen`: no gradient unit
holds them), each placed where its forward runs. The plan's peak as FSDP2 runs it, and planning again under
it, is :mod:`dpcomm.fsdp.bound`; applying a plan is :mod:`dpcomm.fsdp.shard`'s, the trial
:mod:`dpcomm.fsdp.trial`'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.fsdp.costs import fsdp_costs
from dpcomm.fsdp.groups import layer_atoms
from dpcomm.planner.fsdp import FSDP_MAX_DEPTH, plan_fsdp
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.planner.fsdp_precision import Precision
from dpcomm.planner.fsdp_unit import unit_s_for
from dpcomm.trace.format import Layer, Trace
from dpcomm.utils.sizes import parse_size
from dpcomm.utils.user_run import batch_size, call, map_tensors, on_every_rank

__all__ = [
    "budget_bytes",
    "compute_dtype",
    "call_model",
    "overlap_of",
    "plan_on_root",
    "plan_on_workers",
    "unit_s_of",
]


def target_device(model: nn.Module) -> torch.device:
    """Where ``model`` trains: its parameters' device, or for a model built on ``meta`` (to be materialised
    after sharding, ``model.to_empty(device=...)``), the current CUDA device under NCCL, else the CPU."""
    dev = next(model.parameters()).device
    if dev.type != "meta":
        return dev
    if dist.is_initialized() and dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def is_meta(model: nn.Module) -> bool:
    return next(model.parameters()).device.type == "meta"


def overlap_of(model: nn.Module) -> str:
    """The FSDP model's overlap for where ``model`` trains: ``gathers`` on CPU (asynchronous all-gathers,
    blocking reduce-scatters), ``streams`` elsewhere (:mod:`dpcomm.fsdp.shard`)."""
    return "gathers" if target_device(model).type == "cpu" else "streams"


def unit_s_of(model: nn.Module) -> float:
    """FSDP2's fixed cost of a unit per pass where ``model`` trains, seconds
    (:func:`dpcomm.planner.fsdp_unit.unit_s_for`)."""
    return unit_s_for(target_device(model).type)


def on_model_device(model: nn.Module, example: Any) -> Any:
    """``example`` on ``meta`` for a meta-device model (its forward then costs nothing), else as given."""
    return example if not is_meta(model) else map_tensors(example, lambda t: t.to("meta"))


def _flops_per_s(device: torch.device, dtype: torch.dtype | None = None) -> float:
    """Measured matrix-multiply rate of ``device`` (FLOP/s): 3 products of 256 x 256 matrices in ``dtype``
    (None: fp32; a mixed-precision policy's ``param_dtype``, what the units compute in), read on the
    device's clock (:func:`dpcomm.timing.now`; no random numbers drawn)."""
    from dpcomm.timing import now

    a = torch.full((256, 256), 0.5, device=device, dtype=dtype or torch.float32)
    a @ a  # warm-up
    t0 = now(device)
    for _ in range(3):
        a @ a
    return 3 * 2 * 256**3 / max(now(device) - t0, 1e-9)


def _analytic_profile(model: nn.Module, example: Any, units: Any, group: Any, dtype: Any = None) -> Trace:
    """Step 1 for a meta-device model: the gradient units from one forward and backward on ``meta`` (no
    memory, no compute), each timed as its layers' FLOPs (:func:`dpcomm.trace.analytic.layer_costs`, shared
    among a layer's units by parameters) over the device's measured matrix-multiply rate in ``dtype`` (a
    policy's ``param_dtype``; None: fp32), averaged over ranks. No parameter is materialised."""
    from dpcomm.planner.autoplan import rank_mean
    from dpcomm.trace.analytic import layer_costs

    costs = {c.name: c for c in layer_costs(model, example)}
    named = dict(model.named_parameters())
    sizes = [sum(named[n].numel() for n in u.param_names) for u in units]
    per_module: dict[str, int] = {}
    for u, n in zip(units, sizes, strict=True):
        per_module[u.module] = per_module.get(u.module, 0) + n
    rate = rank_mean([_flops_per_s(target_device(model), dtype)], group)[0]
    rows = []
    for u, n in zip(units, sizes, strict=True):
        c = costs.get(u.module)
        share = n / per_module[u.module] if per_module[u.module] else 1.0
        f, b = (c.fwd_flops * share, c.bwd_flops * share) if c is not None else (2.0 * n, 4.0 * n)
        rows.append(Layer(name=u.name, params=n, forward_s=f / rate, backward_s=b / rate,
                          param_names=u.param_names, unused=u.unused))  # fmt: skip
    return Trace(
        model=type(model).__name__, batch_size=batch_size(example),
        device=f"analytic:{target_device(model).type}", dtype_bytes=next(model.parameters()).element_size(),
        layers=tuple(rows), extra={"measured_by": "dpcomm.fsdp.shard (meta: FLOPs / measured rate)"},
    )  # fmt: skip


def compute_dtype(precision: Precision | None) -> torch.dtype | None:
    """The half dtype a policy's units compute in (``param_dtype`` bf16 or fp16), else None (as stored)."""
    name = precision.param_dtype if precision is not None else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name or "")


def budget_bytes(memory: int | str | None) -> int | None:
    if memory is None:
        return None
    if isinstance(memory, str):
        return parse_size(memory, what="FSDP memory budget", minimum=0)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise UserError(f"FSDP memory budget must be a number of bytes >= 0, got {memory!r}")
    return memory


def call_model(model: nn.Module, example: Any) -> Any:
    return call(model, example)


def _profile_local(
    model: nn.Module, example: Any, loss_fn: Any, iters: int, dtype: Any = None, units: Any = None
) -> Trace:
    """Step 1 on this rank: the gradient units' times (the caller restores the model: ``untouched``).
    ``dtype``: a mixed-precision policy's ``param_dtype``, the parameters and floating inputs cast to it as
    FSDP2 runs them (:func:`dpcomm.fsdp.keywords.as_fsdp2_computes`); the trace keeps the stored bytes."""
    from dpcomm.fsdp.keywords import as_fsdp2_computes
    from dpcomm.trace.profiler import profile

    stored = next(model.parameters()).element_size()
    with as_fsdp2_computes(model, example, dtype) as cast:
        trace = profile(model, cast, iters=iters, warmup=1, device=next(model.parameters()).device,
                        loss_fn=loss_fn, units=units)  # fmt: skip
    return trace if dtype is None else replace(trace, dtype_bytes=stored)


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


def plan_on_root(method: str, trace: Trace, ag: CommCost, rs: CommCost, memory: int | None, max_depth: int,
                 group: Any, overlap: str, ar: CommCost | None = None,
                 choices: dict[int, Any] | None = None,
                 precision: Precision | None = None, atoms: Any = None,
                 unit_s: float = 0.0) -> FsdpPlan:  # fmt: skip
    """Step 3: rank 0 plans, every rank gets the plan (its ``meta`` too: a certified bound) or rank 0's
    one-line error, and checks the hash. ``ar``: HSDP's all-reduce across the replicas. ``choices``:
    ``{G: (T_ag, T_rs, T_ar)}`` for several shard-group sizes, the planner choosing among them
    (:func:`dpcomm.planner.hsdp.plan_hsdp`; ``ag``, ``rs`` and ``ar`` are then unused). ``precision``:
    FSDP2's mixed-precision policy, priced (:mod:`dpcomm.planner.fsdp_precision`). ``atoms``: the runs of
    layers no unit may split (:func:`dpcomm.fsdp.groups.layer_atoms`); ``unit_s``: each unit's fixed cost
    per pass, seconds."""
    box: list[Any] = [None]
    if dist.get_rank(group) == 0:
        try:
            if choices is not None and len(choices) > 1:
                from dpcomm.planner.hsdp import plan_hsdp

                p = plan_hsdp(
                    method,
                    trace,
                    lambda G: choices[G],
                    world=dist.get_world_size(group),
                    shards=sorted(choices),
                    memory=memory,
                    max_depth=max_depth,
                    overlap=overlap,
                    precision=precision,
                    unit_s=unit_s,
                    atoms=atoms,
                )
            else:
                p = plan_fsdp(method, trace, ag, rs, memory=memory, max_depth=max_depth, overlap=overlap,
                              ar_cost=ar, precision=precision, unit_s=unit_s, atoms=atoms)  # fmt: skip
            box[0] = {"plan": p.to_dict(), "time_s": p.time_s, "peak_bytes": p.peak_bytes, "meta": p.meta}
        except UserError as exc:
            box[0] = {"error": str(exc)}
    dist.broadcast_object_list(
        box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group
    )
    if "error" in box[0]:
        raise UserError(box[0]["error"])
    got = box[0]
    plan = replace(FsdpPlan.from_dict(got["plan"]), time_s=got["time_s"], peak_bytes=got["peak_bytes"],
                   meta=dict(got["meta"]))  # fmt: skip
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
    meshes: dict[int, Any] | None = None,
    analysis: Any = None,
    precision: Precision | None = None,
    shardable: Any = None,
    unit_s: float | None = None,
) -> tuple[FsdpPlan, Trace, CommCost, CommCost, CommCost | None]:
    """Steps 1-3 of :mod:`dpcomm.fsdp.shard` on every rank of ``process_group``: ``(plan, trace, T_ag,
    T_rs, T_ar)``, the same on every rank. ``optimal`` needs ``example`` (one input batch). ``meshes``:
    HSDP, ``{G: DeviceMesh}`` over every rank (:func:`dpcomm.fsdp.mesh.meshes`), each one's collectives
    measured; with several the planner chooses ``G`` (the plan's ``shard_group``), and ``T_ar`` is that
    mesh's all-reduce across the replicas (``None``: FSDP). ``analysis``: the units every rank agreed on
    (:func:`dpcomm.trace.units.agree`; with ``example``, made here if not given). ``precision``: FSDP2's
    mixed-precision policy: the units timed computing in its ``param_dtype``, the plan priced in its
    dtypes. ``shardable``: the modules that may be a unit (:func:`dpcomm.fsdp.agreed.agreed_shardable`;
    None: every module with a forward); the plan is made over the atoms they leave. ``unit_s``: FSDP2's
    fixed cost of a unit per pass (default: :func:`unit_s_of` the model)."""
    name = str(method).strip().lower()
    dtype = compute_dtype(precision)
    if example is None and name == "optimal":
        raise UserError("FSDP planner 'optimal' needs the units' times: pass example=<one input batch>")
    if example is None:
        trace = _sizes_trace(model)
    else:
        from dpcomm.ddp.planning import agreed_trace
        from dpcomm.trace.units import agree

        example = on_model_device(model, example)
        if analysis is None:
            analysis = agree(model, example, loss_fn, process_group, "dpcomm.fsdp.shard")
        if is_meta(model):
            trace = on_every_rank(
                lambda: _analytic_profile(model, example, analysis.units, process_group, dtype),
                process_group, "dpcomm.fsdp.shard: running the meta-device model on the example",
            )  # fmt: skip
        else:
            local = on_every_rank(
                lambda: _profile_local(model, example, loss_fn, profile_iters, dtype, analysis.units),
                process_group,
                "dpcomm.fsdp.shard: profiling the model on the example",
            )  # fmt: skip
            trace = agreed_trace(model, local, analysis.units, process_group, "dpcomm.fsdp.shard")
        if dtype is not None:  # what the units' times were measured computing in
            trace = replace(trace, extra={**trace.extra, "computed_in": str(dtype).removeprefix("torch.")})
    from dpcomm.fsdp.frozen import with_frozen  # it plans with this module's helpers

    trace = with_frozen(model, trace, example, shardable, process_group)  # frozen-only modules: units too
    total = sum(trace.layer_bytes(i) for i in range(trace.num_layers))
    basis = {"precision": precision, "unit_s": unit_s_of(model) if unit_s is None else unit_s,
             "atoms": layer_atoms(model, [x.param_names for x in trace.layers], shardable)}  # fmt: skip
    if meshes is None:
        ag, rs, _, _ = fsdp_costs(total, process_group)
        plan = plan_on_root(name, trace, ag, rs, budget_bytes(memory), max_depth, process_group,
                            overlap_of(model), **basis)  # fmt: skip
        return plan, trace, ag, rs, None
    from dpcomm.fsdp.mesh import mesh_costs

    choices = {G: mesh_costs(total, m) for G, m in sorted(meshes.items())}
    G = next(iter(choices))
    plan = plan_on_root(name, trace, *choices[G][:2], budget_bytes(memory), max_depth, process_group,
                        overlap_of(model), ar=choices[G][2], choices=choices, **basis)  # fmt: skip
    G = plan.shard_group or G
    world = dist.get_world_size(process_group)
    return replace(plan, shard_group=None if G == world else G), trace, *choices[G]
