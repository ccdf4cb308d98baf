"""Keys of a parameter server: which piece of which tensor each server holds (a pure function).

A *key* is ``(tensor, shard)``: the ``shard``-th piece of tensor ``tensor`` (model parameter order), the
elements ``start..stop-1`` of its flattened view, held by server ``server``. :func:`assign_keys` lays every
tensor end to end (the model's parameters in order, as one vector of ``n`` elements) and cuts that vector
into ``S`` pieces of ``floor(n/S)`` or ``ceil(n/S)`` elements (one dtype, so bytes are even too); a
tensor that straddles a cut is split into one key per server it touches. So the servers' loads differ by at
most one element, and a key never spans two servers.

Source: the key-value view of ps-lite (Li et al., OSDI 2014) and BytePS's even partitioning; the iBatch
paper's BigDL parameter manager shards the flattened parameters the same way, one slice per node.
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
    cuts = _bounds(sum(numels), servers)
    keys: list[Key] = []
    base = 0  # offset of the tensor in the whole vector
    s = 0
    for t, n in enumerate(numels):
        at, shard = 0, 0
        while at < n:
            while cuts[s + 1] <= base + at:  # skip servers whose piece ends before here (empty ones too)
                s += 1
            stop = min(n, cuts[s + 1] - base)
            keys.append(Key(t, shard, at, stop, s))
            at, shard = stop, shard + 1
        base += n
    return keys


def server_loads(keys: Sequence[Key], servers: int) -> list[int]:
    """Elements per server."""
    loads = [0] * servers
    for k in keys:
        loads[k.server] += k.numel
    return loads
