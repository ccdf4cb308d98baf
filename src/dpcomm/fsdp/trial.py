"""The timed trial of :func:`dpcomm.fsdp.shard` (its step 4): the planned plan and ``per-block`` applied to
sharded copies of the model, timed round-robin on the example, the faster kept (``per-block``, what users
write, within 2%).

A copy never holds the whole model (:func:`sharded_copy`: built on ``meta``, given only its shards) and is
sharded exactly as the model will be (the same units, FSDP2 keywords, zeros for unused parameters:
:func:`dpcomm.fsdp.shard.apply_plan`), so the trial runs what the model will run (issue 54, finding 2). The
copies are gone when the trial returns or raises: FSDP2's states are reference cycles, and left to the
interpreter's teardown they end jobs on gloo with SIGABRT (issue 46, finding 3).
"""

from __future__ import annotations

import copy
import gc
import statistics
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.fsdp.groups import mixed_dtypes, shard_groups
from dpcomm.fsdp.planning import call_model, target_device
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.utils.user_run import on_every_rank

__all__ = ["sharded_copy", "timed_trial"]

_PREFER_WITHIN = 0.02  # per-block is kept unless the plan is measurably (> 2%) faster, as ddp.wrap does


def sharded_copy(
    model: nn.Module, plan: FsdpPlan, layer_params: Any, shardable: Any, mesh: Any, **apply_kw: Any
) -> nn.Module:
    """A copy of ``model`` sharded by ``plan`` that never holds the whole model: the modules copied with
    their parameters and buffers on ``meta``, sharded as the model will be (``apply_kw``: what
    :func:`apply_plan` is given for it, the zeros and FSDP2's keywords), given shards' storage
    (``to_empty``), then filled from the model's own tensors (each rank keeps its shard; buffers copied
    whole)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    shadow = copy.deepcopy(model, memo)  # the modules, no tensor data (tied parameters stay tied)
    if apply_kw.get("ignored_params"):  # the user's parameters, as the copy's
        apply_kw = {**apply_kw, "ignored_params": {memo[id(p)] for p in apply_kw["ignored_params"]}}
    from dpcomm.fsdp.shard import apply_plan  # shard imports this module

    apply_plan(shadow, plan, shard_groups(shadow, plan, layer_params, shardable), mesh, **apply_kw)
    shadow.to_empty(device=target_device(model))
    params = {n: p.detach() for n, p in model.named_parameters()}
    set_model_state_dict(shadow, params, options=StateDictOptions(full_state_dict=True, strict=False))
    with torch.no_grad():
        for (_, b), (_, src) in zip(shadow.named_buffers(), model.named_buffers(), strict=True):
            b.copy_(src)
    return shadow


def timed_trial(model, plans, layer_params, shardable, example, loss_fn, iters, mesh, group, apply_kw):
    """Step 4: each plan applied to a copy of ``model`` as it will be applied to the model (``apply_kw``),
    timed round-robin; the kept index and medians. FSDP2 failing on a copy is one :class:`UserError` on
    every rank, and the copies are gone when it returns or raises."""
    from dpcomm.timing import now, slowest
    from dpcomm.trace.profiler import default_loss

    for p in plans:  # FSDP2 asserts one dtype per call: the user's line, before any copy is made
        mixed = mixed_dtypes(model, shard_groups(model, p, layer_params, shardable))
        if mixed:
            raise UserError(mixed)
    copies: list[nn.Module] = []
    device = target_device(model)
    times: list[list[float]] = [[] for _ in plans]

    def run() -> None:
        copies.extend(sharded_copy(model, p, layer_params, shardable, mesh, **apply_kw) for p in plans)
        for step in range(len(plans) * (1 + iters)):  # one untimed pass each: FSDP2's lazy init
            k = step % len(plans)
            for p in copies[k].parameters():
                p.grad = None
            t0 = now(device)
            (loss_fn or default_loss)(call_model(copies[k], example)).backward()
            t1 = now(device)  # CUDA runs kernels after the calls return: read the clock once they ran
            if step >= len(plans):
                times[k].append(t1 - t0)

    try:
        on_every_rank(run, group, "dpcomm.fsdp.shard: the timed trial (the plans under FSDP2)")
    finally:
        copies.clear()
        gc.collect()  # the copies' FSDP2 states (cycles) go now, not in the interpreter's teardown (SIGABRT)
    medians = slowest([statistics.median(t) for t in times], group)
    best = min(range(len(plans)), key=medians.__getitem__)
    if medians[-1] <= medians[best] * (1 + _PREFER_WITHIN):
        best = len(plans) - 1  # the last candidate is per-block
    return best, medians
