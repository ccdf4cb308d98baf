"""Gradient-merge planners: which layers' gradients travel in one all-reduce, and in what order.

Every planner has one signature, ``plan_xxx(trace, cost, nodes, **opts) -> Plan`` (a :class:`Plan` lists
contiguous layer groups in communication order); :func:`make_plan` picks one by name:

=============  ==========================================================================================
``wfbp``       one group per layer (wait-free backpropagation; MG-WFBP sec. II-C)
``single``     one group after the backward pass (SyncEASGD; You et al. SC'17)
``bucket:SZ``  close a group once it holds >= SZ bytes, backward order (DDP 25MB, Horovod 128MB)
``ddp``        PyTorch DDP's default buckets: 1 MiB first, then 25 MiB, backward order
``mgwfbp``     MG-WFBP Algorithm 1 (Shi & Chu, sec. IV), the paper's greedy merge test
``optimal``    the exact minimum of t_iter over all contiguous partitions (dynamic program)
``dear``       DeAR: groups reduce-scattered in backward, all-gathered in the next forward (exact program)
=============  ==========================================================================================

Pull plans for a parameter server (which layers' parameters are pulled together before forward; the
iBatch paper) are :func:`plan_pulls` in :mod:`dpcomm.planner.pull` (``all``, ``layer``, ``ibatch``,
``optimal``).

The timing model they share is MG-WFBP Eq. 6-8/19-21; :func:`dpcomm.sim.simulate` evaluates a plan.
"""

from __future__ import annotations

from collections.abc import Callable

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes
from dpcomm.planner.bucket import (
    DDP_BUCKET_BYTES,
    HOROVOD_FUSION_BYTES,
    parse_bucket_size,
    plan_bucket,
    plan_ddp,
)
from dpcomm.planner.bucket_auto import plan_bucket_auto
from dpcomm.planner.dear import plan_dear
from dpcomm.planner.mgwfbp import plan_mgwfbp
from dpcomm.planner.optimal import optimal_partition, plan_optimal
from dpcomm.planner.pull import PULL_METHODS, PullPlan, plan_pulls
from dpcomm.planner.single import plan_single
from dpcomm.planner.wfbp import plan_wfbp
from dpcomm.trace.format import Trace

__all__ = [
    "check_nodes",
    "DDP_BUCKET_BYTES",
    "HOROVOD_FUSION_BYTES",
    "PULL_METHODS",
    "SCHEDULES",
    "Plan",
    "PullPlan",
    "make_plan",
    "optimal_partition",
    "parse_schedules",
    "parse_bucket_size",
    "plan_bucket",
    "plan_bucket_auto",
    "plan_dear",
    "plan_ddp",
    "plan_mgwfbp",
    "plan_optimal",
    "plan_pulls",
    "plan_single",
    "plan_wfbp",
]

Planner = Callable[..., Plan]

SCHEDULES: dict[str, Planner] = {
    "wfbp": plan_wfbp,
    "single": plan_single,
    "bucket": plan_bucket,  # needs a size: bucket:25MB, or bucket:auto (the best single size)
    "ddp": plan_ddp,
    "mgwfbp": plan_mgwfbp,
    "optimal": plan_optimal,
    "dear": plan_dear,
}
"""Planner per schedule name; ``bucket`` is written ``bucket:SIZE`` or ``bucket:auto``
(:mod:`dpcomm.planner.bucket_auto`)."""


def _split(schedule: str) -> tuple[str, str | None]:
    name, sep, arg = str(schedule).strip().partition(":")
    name = name.strip().lower()
    if name not in SCHEDULES:
        known = ", ".join(f"{k}:SIZE, {k}:auto" if k == "bucket" else k for k in SCHEDULES)
        raise UserError(f"unknown schedule {schedule!r}: use one of {known}")
    if name == "bucket" and not sep:
        raise UserError("schedule 'bucket' needs a size, e.g. bucket:25MB (DDP) or bucket:128MB (Horovod)")
    if name != "bucket" and sep:
        raise UserError(f"schedule {name!r} takes no argument, got {schedule!r}")
    return name, arg.strip() if sep else None


def parse_schedules(text: str) -> list[str]:
    """``"wfbp,single,bucket:25MB"`` -> validated names; a bad one is a one-line :class:`UserError`."""
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    if not names:
        raise UserError("no schedule given: use e.g. wfbp,single,mgwfbp,optimal")
    for s in names:
        name, arg = _split(s)
        if arg is not None and arg.lower() != "auto":
            parse_bucket_size(arg)
    return names


def make_plan(schedule: str, trace: Trace, cost: CommCost, nodes: int) -> Plan:
    """Plan ``trace`` with a schedule name: wfbp, single, bucket:25MB, mgwfbp or optimal."""
    check_nodes(nodes)
    name, arg = _split(schedule)
    if name == "bucket" and str(arg).lower() == "auto":
        return plan_bucket_auto(trace, cost, nodes)
    if name == "bucket":
        return plan_bucket(trace, cost, nodes, size_bytes=parse_bucket_size(arg), name=f"bucket:{arg}")
    return SCHEDULES[name](trace, cost, nodes)
