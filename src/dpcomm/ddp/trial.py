"""The timed trial of :func:`dpcomm.ddp.wrap` (its step 4): the planned plan, ``single`` and DDP's default
buckets built as real DDP modules around the user's module, one at a time (each torn down before the next is
built: plain torch cannot run several DDPs around one module whose parameters go unused, issue 54), each
timed on the example, the fastest as the slowest rank saw it kept (:class:`dpcomm.planner.autoplan.Trial`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from dpcomm.ddp.buckets import bucket_caps, build_ddp
from dpcomm.timing import now
from dpcomm.utils.user_run import call, first_param

__all__ = ["timed_trial", "walk_kwargs"]


def walk_kwargs(ddp_kwargs: dict[str, Any]) -> dict[str, bool]:
    """The DDP arguments that decide the order DDP cuts its buckets in (:func:`dpcomm.ddp.ddp_walk`)."""
    return {k: bool(ddp_kwargs.get(k, False)) for k in ("find_unused_parameters", "static_graph")}


def _trial_kwargs(ddp_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The candidates' DDP options: the user's, except that ``static_graph`` (whose bookkeeping assumes
    one DDP per backward) becomes ``find_unused_parameters=True`` (the same parameters may go unused),
    under which every candidate is built with its plan's buckets (walk ``assigned``), and that no candidate
    broadcasts the parameters at construction (``init_sync=False``: they were checked equal on every rank,
    and each candidate would send the whole model once more)."""
    out = {k: v for k, v in ddp_kwargs.items() if k != "static_graph"}
    if ddp_kwargs.get("static_graph"):
        out["find_unused_parameters"] = True
    return out | {"init_sync": False}


def timed_trial(model, caps, trace, cost, example, loss_fn, iters, group, ddp_kwargs, analysis):
    """Time the planned plan, ``single`` and DDP's default buckets as real DDP modules, one after the other
    (each built, timed and torn down before the next is built: plain torch cannot run several DDPs around
    one module whose parameters go unused, issue 54); return the kept plan's caps (for the user's DDP
    options), each candidate's median (see step 4) and the cost model's price of each. The candidates' DDPs
    are gone when it returns, and their hooks with them."""
    import gc

    from dpcomm.planner.autoplan import Trial, candidates, ddp_default_plan
    from dpcomm.sim import simulate
    from dpcomm.trace.profiler import default_loss

    world = dist.get_world_size(group)
    kwargs = _trial_kwargs(ddp_kwargs)
    plans = [caps.plan] + candidates(caps.plan, trace, cost, world)[1:]
    plans = [p for k, p in enumerate(plans) if all(p.groups != o.groups for o in plans[:k])]
    options = [
        bucket_caps(p, model, trace=trace, warn=False, assign=True, analysis=analysis, **walk_kwargs(kwargs))
        for p in plans
    ]  # fmt: skip
    device = first_param(model, "dpcomm.ddp.wrap").device
    trial = Trial([c.plan for c in options], iters)
    params = [p for p in model.parameters() if p.requires_grad]
    for k, c in enumerate(options):  # one DDP at a time: reducers sharing a module's hooks can fail
        ddp = build_ddp(model, c, group, **kwargs)
        try:
            for step in range(2 + iters):  # two untimed passes: DDP rebuilds its buckets after the first
                for p in params:
                    p.grad = None
                t0 = now(device)
                out = call(ddp, example)
                (loss_fn or default_loss)(out).backward()
                t1 = now(device)  # CUDA runs kernels after the calls return: read the clock once they ran
                if step >= 2:
                    trial.times[k].append(t1 - t0)
                del out
        finally:
            del ddp
            gc.collect()  # this candidate's reducer, and its gradient hooks, go before the next is built
    # DDP's own buckets are what the user had: kept unless a plan is measurably (> 2%) faster
    default = ddp_default_plan(trace, cost, world).groups
    best, medians = trial.choose(group, prefer=next(
        (i for i, c in enumerate(options) if c.plan.groups == default), None
    ))  # fmt: skip
    kept = options[[c.plan for c in options].index(best)]
    predicted = {c.plan.schedule: simulate(trace, c.plan, cost, world).t_iter_s for c in options}
    if kept.plan.groups != caps.plan.groups:  # the winner's caps for the user's own DDP options
        caps = bucket_caps(
            kept.plan, model, trace=trace, cost=cost, nodes=world, warn=False, assign=True, analysis=analysis,
            **walk_kwargs(ddp_kwargs),
        )  # fmt: skip
    return caps, {c.plan.schedule: m for c, m in zip(options, medians, strict=True)}, predicted
