"""``native``: torch.distributed's own collectives (gloo on CPU, NCCL on GPU) -- the reference and baseline.

Symbols: P ranks, S bytes. What goes on the wire is the backend's choice (gloo's all_reduce on CPU runs its
ring/bcube implementations; NCCL picks ring or tree by size), so no message count is stated or tested.
Extra memory per call: whatever the backend allocates (gloo: up to one message-sized buffer).

1. ``allreduce``: ``dist.all_reduce(tensor, SUM)``.
2. ``broadcast``: ``dist.broadcast(tensor, src=root)``.
3. ``reduce``: ``dist.reduce(tensor, dst=root, SUM)``.
4. ``reduce_scatter`` / ``allgather`` (group rank ``r`` owns chunk ``r`` of
   :func:`~dpcomm.collectives._p2p.chunk_bounds`, as :class:`~dpcomm.collectives.ring.Ring`'s): on an NCCL
   group ``dist.reduce_scatter_tensor`` / ``dist.all_gather_into_tensor`` on ``P`` equal chunks of
   ``ceil(N / P)`` elements. Where ``P`` does not divide ``N`` the chunks are laid out padded in a temporary
   buffer (chunk ``j`` at ``j ceil(N / P)``, zeros after it) and the result copied back, so the layout stays
   ``chunk_bounds(N, P)``; extra memory ``S + S/P`` (padded) or ``S/P`` (the received or own chunk). On any
   other backend ``Ring``'s point-to-point schedule runs instead (its messages are counted, errors name
   ``native``): gloo's reduce-scatter is an all-reduce followed by a slice, so it would move an all-reduce's
   bytes where the ring moves ``(P-1)/P S``.

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

from dpcomm.collectives._p2p import CollectiveError, chunk_bounds, flat_view, global_rank
from dpcomm.collectives.base import register
from dpcomm.collectives.ring import Ring
from dpcomm.errors import first_line

__all__ = ["Native"]


@register("native")
@dataclass(slots=True, kw_only=True)
class Native:
    """torch.distributed's collectives on the given group (``reduce_scatter``/``allgather``: NCCL's, else
    ``Ring``'s; see the module docstring)."""

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

    def reduce_scatter(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        """In place: group rank ``r``'s chunk ``chunk_bounds(N, P)[r]`` ends as the sum over the group; the
        other chunks are left as they were (NCCL) or as partial sums (ring)."""
        if dist.get_backend(group) != "nccl":
            Ring(name=self.name).reduce_scatter(tensor, group=group)
            return
        flat = flat_view(tensor, self.name)
        self._run("reduce_scatter", lambda: _reduce_scatter_equal(flat, group))

    def allgather(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        """In place: group rank ``r``'s chunk ``chunk_bounds(N, P)[r]`` is copied to every rank."""
        if dist.get_backend(group) != "nccl":
            Ring(name=self.name).allgather(tensor, group=group)
            return
        flat = flat_view(tensor, self.name)
        self._run("allgather", lambda: _allgather_equal(flat, group))


# ---------------------------------------------------------------------------------------------------------
# NCCL's reduce-scatter and all-gather take P equal chunks; chunk_bounds' first N mod P chunks are one
# element longer than the rest. Both functions only call torch.distributed, so they run on gloo too (the
# tests check them there).


def _padded(flat: torch.Tensor, p: int) -> torch.Tensor:
    """``flat``'s ``chunk_bounds`` chunks, chunk ``j`` at ``j * ceil(N / P)`` and zeros after it (a copy)."""
    q, rem = divmod(flat.numel(), p)  # rem chunks of q + 1 elements, then p - rem of q
    out = torch.empty(p, q + (rem > 0), dtype=flat.dtype, device=flat.device)
    if rem:
        out[:rem].copy_(flat[: rem * (q + 1)].view(rem, q + 1))
    out[rem:, :q].copy_(flat[rem * (q + 1) :].view(p - rem, q))
    out[rem:, q:].zero_()
    return out.view(-1)


def _unpad(padded: torch.Tensor, flat: torch.Tensor, p: int) -> None:
    """Copy :func:`_padded`'s layout back into ``flat`` (the inverse)."""
    q, rem = divmod(flat.numel(), p)
    rows = padded.view(p, q + (rem > 0))
    if rem:
        flat[: rem * (q + 1)].view(rem, q + 1).copy_(rows[:rem])
    flat[rem * (q + 1) :].view(p - rem, q).copy_(rows[rem:, :q])


def _reduce_scatter_equal(flat: torch.Tensor, group: Any) -> None:
    p, rank, n = dist.get_world_size(group), dist.get_rank(group), flat.numel()
    if p == 1 or n == 0:
        return
    c = -(-n // p)
    a, b = chunk_bounds(n, p)[rank]
    out = torch.empty(c, dtype=flat.dtype, device=flat.device)
    src = flat if n % p == 0 else _padded(flat, p)
    dist.reduce_scatter_tensor(out, src, op=dist.ReduceOp.SUM, group=group)
    flat[a:b].copy_(out[: b - a])


def _allgather_equal(flat: torch.Tensor, group: Any) -> None:
    p, rank, n = dist.get_world_size(group), dist.get_rank(group), flat.numel()
    if p == 1 or n == 0:
        return
    c = -(-n // p)
    a, b = chunk_bounds(n, p)[rank]
    own = torch.zeros(c, dtype=flat.dtype, device=flat.device)  # a copy: the output must not alias it
    own[: b - a].copy_(flat[a:b])
    if n % p == 0:
        dist.all_gather_into_tensor(flat, own, group=group)
        return
    out = torch.empty(p * c, dtype=flat.dtype, device=flat.device)
    dist.all_gather_into_tensor(out, own, group=group)
    _unpad(out, flat, p)
