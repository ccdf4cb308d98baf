"""dpcomm inside stock PyTorch ``DistributedDataParallel``: plans as DDP buckets, collectives as comm hooks.

- :func:`bucket_caps` (:mod:`dpcomm.ddp.buckets`): the ``bucket_cap_mb_list`` that makes DDP form a plan's
  groups, or the nearest plan it can form;
- :func:`wrap` (:mod:`dpcomm.ddp.wrap`): DDP built with a plan or a planner name decided on the workers;
- :func:`collective_hook` (:mod:`dpcomm.ddp.hooks`): a dpcomm collective as ``hook(state, bucket)``;
- :class:`Inputs`: an ``example=`` with positional and keyword arguments (a dict alone is keyword ones);
- ``dpcomm train --schedule ddp:PLANNER`` is the training loop's kind :mod:`dpcomm.train.ddp_plan_replica`.
"""

from __future__ import annotations

from dpcomm.ddp.buckets import BucketCaps, bucket_caps, expressible_plan, ready_order
from dpcomm.ddp.hooks import HookState, collective_hook
from dpcomm.ddp.wrap import Wrapped, plan_on_workers, wrap
from dpcomm.utils.user_run import Inputs

__all__ = [
    "BucketCaps",
    "HookState",
    "Inputs",
    "Wrapped",
    "bucket_caps",
    "collective_hook",
    "expressible_plan",
    "plan_on_workers",
    "ready_order",
    "wrap",
]
