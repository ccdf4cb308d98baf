"""Building DDP with a plan's buckets (:func:`build_ddp`), as :mod:`dpcomm.ddp.buckets` describes: the
caps for the walk DDP cuts its kept buckets in, and for a DDP that never rebuilds (walk ``assigned``) its
one call for construction-time buckets answered with the plan's groups; :class:`PlannedDDP` is what
dynamo reads a compiled DDP's bucket size from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dpcomm.errors import UserError

if TYPE_CHECKING:
    from dpcomm.ddp.buckets import BucketCaps

__all__ = ["DOUBLE_WRAPPED", "PlannedDDP", "build_ddp"]

DOUBLE_WRAPPED = (
    "dpcomm: this model is already DistributedDataParallel (dpcomm.ddp.wrap); a second DDP around it would "
    "all-reduce every gradient twice: hand the bare model to dpcomm.integrations.accelerate.prepare "
    "(Accelerate), dpcomm.integrations.hf.Trainer (Trainer) or dpcomm.integrations.lightning.DDPStrategy "
    "(Lightning) instead (docs/frameworks/)"
)
"""What a second DDP around a dpcomm one stops with."""


@contextlib.contextmanager
def _assigned(model: nn.Module, groups: tuple[tuple[str, ...], ...]) -> Iterator[None]:
    """While DDP is constructed, its one call for construction-time buckets gets ``groups`` (module
    docstring): indices into the parameter list DDP passes, groups in reverse communication order (DDP
    reverses the list it gets), each bucket's byte size as its limit."""
    compute = dist._compute_bucket_assignment_by_size
    ids = {n.removeprefix("_orig_mod."): id(p) for n, p in model.named_parameters()}  # torch.compile's

    def assignment(params: list[torch.Tensor], limits: Any, *args: Any, **kwargs: Any) -> Any:
        index = {id(p): i for i, p in enumerate(params)}
        buckets = [[index[ids[n]] for n in g if ids[n] in index] for g in groups]
        buckets = [b for b in buckets if b]
        if sorted(i for b in buckets for i in b) != list(range(len(params))):  # not the plan's parameters
            return compute(params, limits, *args, **kwargs)
        sizes = [sum(params[i].numel() * params[i].element_size() for i in b) for b in buckets]
        return buckets[::-1], sizes[::-1]

    dist._compute_bucket_assignment_by_size = assignment
    try:
        yield
    finally:
        dist._compute_bucket_assignment_by_size = compute


class PlannedDDP(DistributedDataParallel):
    """``DistributedDataParallel`` as :func:`build_ddp` builds it. After construction only dynamo reads
    ``bucket_bytes_cap`` (``DDPOptimizer(bucket_bytes_cap=...)``, when the DDP module is compiled). Compiled
    after ``wrap`` without :mod:`dpcomm.ddp.compiled`'s optimizer installed (``torch._dynamo`` not yet
    imported when ``wrap`` ran), dynamo's own rule splits the graph: it asserts on a cap under its 1 MiB
    first bucket (``wfbp``'s), so it reads at least that, and one line on rank 0 says so."""

    @property
    def bucket_bytes_cap(self) -> int:
        cap = self.__dict__.get("_dpcomm_cap", 0)
        if not self.__dict__.get("_dpcomm_built"):
            return cap
        from dpcomm.ddp import compiled

        if compiled.PlannedDDPOptimizer is not None:
            return cap
        if not self.__dict__.get("_dpcomm_said") and dist.get_rank(self.process_group) == 0:
            import logging

            logging.getLogger("dpcomm.ddp").info(
                "dpcomm: torch.compile after wrap: dynamo splits this DDP's graph by its own size rule, not "
                "at the plan's cuts (the buckets are still the plan's); compile the model first "
                "(docs/compile.md) to split at them"
            )
        self.__dict__["_dpcomm_said"] = True
        return max(cap, dist._DEFAULT_FIRST_BUCKET_BYTES)

    @bucket_bytes_cap.setter
    def bucket_bytes_cap(self, value: int) -> None:
        self.__dict__["_dpcomm_cap"] = value

    @property
    def _ddp_params_and_buffers_to_ignore(self) -> list[str]:
        """A second ``DistributedDataParallel`` around this one reads this first (torch 2.4-2.13,
        ``DistributedDataParallel.__init__``): it would all-reduce every gradient again after this DDP's
        buckets, twice the traffic, silently (``Accelerator.prepare``, ``Trainer(model=...)``). It stops
        there, in one line naming the integration that prepares the model as one DDP."""
        raise UserError(DOUBLE_WRAPPED)


def build_ddp(
    model: nn.Module, caps: BucketCaps, process_group: Any = None, **ddp_kwargs: Any
) -> DistributedDataParallel:
    """``DistributedDataParallel(model, bucket_cap_mb_list=..., **ddp_kwargs)`` running ``caps.plan``: for
    the walk ``assigned`` its construction-time buckets are the plan's groups (module docstring)."""
    with _assigned(model, caps.param_groups) if caps.walk == "assigned" else contextlib.nullcontext():
        ddp = PlannedDDP(model, process_group=process_group, **caps.ddp_kwargs(), **ddp_kwargs)
    ddp.__dict__["_dpcomm_built"] = True
    return ddp
