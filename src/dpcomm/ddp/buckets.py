"""A dpcomm plan as DistributedDataParallel buckets: ``bucket_cap_mb_list``, one cap per bucket.

How torch 2.13's DDP cuts buckets (``torch/nn/parallel/distributed.py``, ``_BucketCapacityConfig``, and the
reducer's ``compute_bucket_assignment_by_size``): it walks the parameters in an order, adds each one's
gradient bytes to the open bucket, and closes the bucket as soon as it holds ``>=`` that bucket's cap; the
``k``-th bucket gets ``bucket_cap_mb_list[k]`` (the last cap repeats). After the first iteration the reducer
*rebuilds* its buckets in the order the gradients became ready in that backward pass, with the same list, and
keeps them. With ``bucket_cap_mb_list`` given, the first bucket has no separate cap (the list's first entry is
its cap). So a plan's groups, in communication order (the backward order MG-WFBP merges in), become DDP's
buckets when

- the caps are the groups' exact byte sizes, in communication order (``int(cap_mb * 2**20)`` is exact for
  ``cap_mb = bytes / 2**20``: dividing by a power of two loses nothing), and
- every group's gradients are ready before any later group's (then the running sum meets each cap exactly at
  the group's last parameter).

The second condition is about the model, not the plan: a layer whose parameters are used at two places of
the forward pass (a module using one weight early and another late) has gradients ready at two times, with
other layers' in between. A cut DDP cannot make there is dropped (the two groups around it merge) and
:class:`BucketCaps` says so in one line, with the cost model's price of the difference when a trace and a
cost are given. The first iteration (before the rebuild) cuts the same caps in registration order; its
buckets differ from the plan, its sums do not.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.plan import Plan
from dpcomm.trace.format import Trace

__all__ = ["BucketCaps", "bucket_caps", "expressible_plan", "ready_order"]

_MIB = 1 << 20
"""Bytes per MiB: DDP's ``bucket_cap_mb`` unit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketCaps:
    """What to pass to DDP so that it runs ``plan``, and how that plan relates to the one asked for."""

    bucket_cap_mb_list: list[float]
    """One cap per bucket in MiB (communication order): each group's exact gradient bytes / 2**20."""
    plan: Plan
    """The plan DDP will run: ``requested`` itself, or its nearest coarsening DDP can express."""
    requested: Plan
    """The plan asked for."""
    dropped: tuple[int, ...] = ()
    """Cuts of ``requested`` DDP cannot make, each as layer ``l`` of the cut ``l|l-1``."""
    extra_s: float | None = None
    """Cost-model price of running ``plan`` instead of ``requested`` (seconds per iteration), if priced."""

    @property
    def exact(self) -> bool:
        """DDP forms exactly the requested groups."""
        return not self.dropped

    @property
    def note(self) -> str | None:
        """One line saying what DDP runs instead, None when it runs the requested plan."""
        if self.exact:
            return None
        cuts = ", ".join(f"{g}|{g - 1}" for g in self.dropped)
        price = "" if self.extra_s is None else f"; the cost model prices it at {self.extra_s * 1e3:+.3f} ms"
        return (
            f"DDP cannot cut plan '{self.requested.schedule}' between layers {cuts} (gradients of those "
            f"layers become ready out of layer order); running {len(self.plan.groups)} buckets instead of "
            f"{len(self.requested.groups)}{price}"
        )

    def ddp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DistributedDataParallel(...)``."""
        return {"bucket_cap_mb_list": list(self.bucket_cap_mb_list)}


def _layers(model: nn.Module, example: Any | None) -> list[list[nn.Parameter]]:
    params = layer_params(model, learnable_layers(model, example))
    if not params:
        raise UserError("the model has no learnable layer (no parameter requires grad)")
    return params


def ready_order(
    model: nn.Module,
    example: Any,
    loss_fn: Any = None,
    params_per_layer: list[list[nn.Parameter]] | None = None,
) -> list[int]:
    """Layer index of each parameter, in the order their gradients became ready in one local backward pass
    (the order DDP's reducer rebuilds its buckets in). Parameters, gradients and buffers are restored."""
    from dpcomm.trace.profiler import default_loss

    per_layer = params_per_layer if params_per_layer is not None else _layers(model, example)
    layer_of = {id(p): i for i, ps in enumerate(per_layer) for p in ps}
    order: list[int] = []
    grads = {id(p): p.grad for ps in per_layer for p in ps}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    handles = [
        p.register_post_accumulate_grad_hook(lambda q: order.append(layer_of[id(q)]))
        for ps in per_layer
        for p in ps
    ]
    try:
        for ps in per_layer:
            for p in ps:
                p.grad = None
        out = model(*example) if isinstance(example, tuple) else model(example)
        (loss_fn or default_loss)(out).backward()
    finally:
        for h in handles:
            h.remove()
        for ps in per_layer:
            for p in ps:
                p.grad = grads[id(p)]
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    return order


def expressible_plan(
    plan: Plan, order: list[int], group_bytes: list[int] | None = None
) -> tuple[Plan, tuple]:
    """The finest coarsening of ``plan`` whose groups DDP can form when gradients are ready in ``order``
    (layer index per parameter, see :func:`ready_order`), and the cuts it drops.

    A cut after communication group ``k`` is possible when every parameter of groups ``0..k`` is ready
    before every parameter of the later groups (and group ``k`` is not empty in bytes: a zero cap would
    close an empty bucket).
    """
    group_of = {layer: k for k, g in enumerate(plan.groups) for layer in g}
    first = [len(order)] * len(plan.groups)
    last = [-1] * len(plan.groups)
    for pos, layer in enumerate(order):
        k = group_of[layer]
        first[k], last[k] = min(first[k], pos), max(last[k], pos)
    sizes, dropped, run, latest = [], [], 0, -1
    for k, g in enumerate(plan.groups):
        run += len(g)
        latest = max(latest, last[k])
        if k == len(plan.groups) - 1:
            sizes.append(run)
            break
        later = min(first[k + 1 :])
        empty = group_bytes is not None and group_bytes[k] == 0
        if latest < later and not empty:
            sizes.append(run)
            run = 0
        else:
            dropped.append(g[0])
    if not dropped:
        return plan, ()
    meta = {**plan.meta, "ddp_from": plan.schedule}
    return Plan.from_sizes(plan.schedule, sizes, plan.num_layers, **meta), tuple(dropped)


def bucket_caps(
    plan: Plan,
    model: nn.Module,
    *,
    example: Any | None = None,
    loss_fn: Any = None,
    trace: Trace | None = None,
    cost: CommCost | None = None,
    nodes: int | None = None,
    warn: bool = True,
) -> BucketCaps:
    """The ``bucket_cap_mb_list`` that makes DDP form ``plan``'s groups (see module docstring).

    Layers are :func:`dpcomm.models.learnable_layers` of ``model`` in forward order when ``example`` (one
    input batch) is given, else in registration order; ``plan.num_layers`` must match. With ``example``, one
    local forward/backward finds the gradient-ready order and cuts DDP cannot make are dropped (a warning
    says so, priced by :func:`dpcomm.sim.simulate` when ``trace``, ``cost`` and ``nodes`` are given);
    without it, the ready order is taken to be the reverse of the layer order.
    """
    per_layer = _layers(model, example)
    if plan.num_layers != len(per_layer):
        raise UserError(
            f"plan '{plan.schedule}' has {plan.num_layers} layers, the model {len(per_layer)} learnable ones"
        )
    keys = {(p.dtype, p.device) for ps in per_layer for p in ps}
    if len(keys) > 1:
        raise UserError(
            "DDP cuts buckets per (dtype, device) with separate caps; a plan needs one dtype and one device, "
            f"the model has {sorted(str(k) for k in keys)}"
        )
    layer_bytes = [sum(p.numel() * p.element_size() for p in ps) for ps in per_layer]
    if example is not None:
        order = ready_order(model, example, loss_fn, per_layer)
    else:
        order = [layer for layer in reversed(range(len(per_layer))) for _ in per_layer[layer]]
    group_bytes = [sum(layer_bytes[layer] for layer in g) for g in plan.groups]
    runs, dropped = expressible_plan(plan, order, group_bytes)
    extra = None
    if dropped and trace is not None and cost is not None and nodes is not None:
        from dpcomm.sim import simulate

        extra = simulate(trace, runs, cost, nodes).t_iter_s - simulate(trace, plan, cost, nodes).t_iter_s
    caps = [sum(layer_bytes[layer] for layer in g) / _MIB for g in runs.groups]
    out = BucketCaps(bucket_cap_mb_list=caps, plan=runs, requested=plan, dropped=dropped, extra_s=extra)
    if out.note and warn:
        warnings.warn(f"dpcomm: {out.note}", stacklevel=2)
    return out
