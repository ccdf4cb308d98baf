"""``native``: torch.distributed's own collectives (gloo on CPU, NCCL on GPU) -- the reference and baseline.

Symbols: P ranks, S bytes. What goes on the wire is the backend's choice (gloo's all_reduce on CPU runs its
ring/bcube implementations; NCCL picks ring or tree by size), so no message count is stated or tested.
Extra memory per call: whatever the backend allocates (gloo: up to one message-sized buffer).

1. ``allreduce``: ``dist.all_reduce(tensor, SUM)``.
2. ``broadcast``: ``dist.broadcast(tensor, src=root)``.
3. ``reduce``: ``dist.reduce(tensor, dst=root, SUM)``.

One call, as dpcomm sees it: a single step handed to the backend, which runs its own schedule inside::

    rank 0 --+                         +--> rank 0
    rank 1 --+--> dist.all_reduce --+--> rank 1     (gloo: its ring; NCCL: ring or tree)
    rank 2 --+    (one blocking call) +--> rank 2

Cost (as dpcomm prices it, :mod:`dpcomm.costmodel`): ring's for allreduce, the binomial tree's (``mst``)
for broadcast and reduce.

A backend failure (dead or absent peer, group timeout) becomes a :class:`CollectiveError` naming the op.

``allreduce_async`` starts the backend's all-reduce with ``async_op=True`` and returns its work handle: the
backend's own threads make progress, so the runtime needs no Python communication thread for it (what DDP's
reducer does). Only ``native`` has it; the point-to-point algorithms are Python loops and run on the
runtime's communication thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.collectives._p2p import CollectiveError, global_rank
from dpcomm.collectives.base import register
from dpcomm.errors import first_line

__all__ = ["Native"]


@register("native")
@dataclass(slots=True, kw_only=True)
class Native:
    """torch.distributed's collectives on the given group."""

    name: str = "native"

    def _run(self, op: str, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:
            raise CollectiveError(f"native {op}: step 1: backend collective: {first_line(exc)}") from exc

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        self._run("allreduce", lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group))

    def allreduce_async(self, tensor: torch.Tensor, *, group: Any = None) -> Any:
        """Start ``allreduce`` on the backend's threads; returns its work handle (``wait()``)."""
        try:
            return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
        except Exception as exc:
            raise CollectiveError(f"native allreduce: step 1: backend collective: {first_line(exc)}") from exc

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        src = global_rank(group, root)
        self._run("broadcast", lambda: dist.broadcast(tensor, src=src, group=group))

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        dst = global_rank(group, root)
        self._run("reduce", lambda: dist.reduce(tensor, dst=dst, op=dist.ReduceOp.SUM, group=group))
