"""Keys of a parameter server: which piece of which tensor each server holds (a pure function).

A *key* is ``(tensor, shard)``: the ``shard``-th piece of tensor ``tensor`` (model parameter order), the
elements ``start..stop-1`` of its flattened view, held by server ``server``. :func:`assign_keys` *stripes*
every tensor over the servers: a tensor of ``n`` elements is cut into ``S`` consecutive pieces of
``floor(n/S)`` or ``ceil(n/S)`` elements, piece ``j`` on server ``j`` (an empty piece is no key). The
``n % S`` larger pieces go round-robin, continuing where the previous tensor stopped, so the servers' loads
differ by at most one element in all (one dtype: bytes are even too).

Why striped and not one run of whole layers per server: a pull batch (a run of layers) then comes from every
server in equal parts, and as every server sends its parts in plan order, the batches reach a worker in
forward order, back to back on its link, which is what the pull model assumes (:mod:`dpcomm.planner.pull`).
With one contiguous run per server (our first layout, and BigDL's), server 0 holds the first layers and
server ``S-1`` the last, so the last batches travel at the same time as the first and batch 1 arrives up to
``S-1`` times later than modelled: measured on the emulated cluster, ``docs/ps.md``.

Source: the key-value view of ps-lite (Li et al., OSDI 2014), which also splits a large tensor over every
server; BytePS partitions tensors evenly the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Key", "assign_keys", "server_loads"]


@dataclass(frozen=True, slots=True)
class Key:
    """One piece of one tensor on one server."""

    tensor: int
    """Index of the tensor (parameter order)."""
    shard: int
    """Piece number within the tensor (0, 1, ..)."""
    start: int
    """First element of the piece in the tensor's flattened view."""
    stop: int
    """One past its last element."""
    server: int
    """Server (0..S-1) that holds it."""

    @property
    def numel(self) -> int:
        return self.stop - self.start


def _bounds(n: int, parts: int) -> list[int]:
    """Cut points of ``n`` elements into ``parts`` near-equal pieces (the first ``n % parts`` one more)."""
    q, r = divmod(n, parts)
    cuts, at = [0], 0
    for j in range(parts):
        at += q + (1 if j < r else 0)
        cuts.append(at)
    return cuts


def assign_keys(numels: Sequence[int], servers: int) -> list[Key]:
    """Keys for tensors of ``numels`` elements over ``servers`` servers, in tensor then element order."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if any(n < 0 for n in numels):
        raise ValueError("tensor sizes must be >= 0")
    keys: list[Key] = []
    extra = 0  # the server that takes the next larger piece (round-robin over tensors)
    for t, n in enumerate(numels):
        q, r = divmod(n, servers)
        at, shard = 0, 0
        for s in range(servers):
            size = q + (1 if (s - extra) % servers < r else 0)
            if size:
                keys.append(Key(t, shard, at, at + size, s))
                at, shard = at + size, shard + 1
        extra = (extra + r) % servers
    return keys


def server_loads(keys: Sequence[Key], servers: int) -> list[int]:
    """Elements per server."""
    loads = [0] * servers
    for k in keys:
        loads[k.server] += k.numel
    return loads
