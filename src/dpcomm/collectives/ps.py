"""``ps``: the P2P parameter server, BML's baseline -- every rank is a worker and the server of ``1/p``.

Symbols: ``p`` ranks; shard ``j`` (the ``j``-th of ``p`` near-equal pieces, ``n_j`` elements) is served by
rank ``j``; ``S = N e`` bytes; ``alpha``, ``beta``, ``gamma``. A rank talks to the others in the order
``rank + 1, rank + 2, ..`` (mod ``p``) so that they do not all hit rank 0 first.

allreduce (push, then pull):
    1. push: send shard ``j`` to each server ``j != rank``; receive the ``p - 1`` other copies of the own
       shard (up to ``min(p - 1, N / n_rank)`` at once into a scratch buffer) and add them in;
    2. pull: send the summed own shard to every other rank; receive shard ``j`` from server ``j`` in place.
    Per rank: ``2 (p-1)`` messages, ``e (N - n_rank) + e (p-1) n_rank`` bytes (``2 (p-1)/p S`` if ``p | N``).
    ``T = 2 (p-1) alpha + 2 (p-1)/p beta S + (p-1)/p gamma S`` (BML sec. 2: ``2 (N-1)/N T_F``).
broadcast (dpcomm's choice, as :mod:`dpcomm.costmodel.ps`: the root pushes each shard to its server, which
    then serves it to the others):
    1. the root sends shard ``j`` to each ``j != root``;
    2. each server sends its shard to every rank but itself and the root (the root, server of its own
       shard, sends it to everyone); all receive in place.
    Per rank: root ``2 (p-1)`` messages, ``e (N - n_root) + e (p-1) n_root`` bytes; others ``p - 2``
    messages, ``e (p-2) n_rank`` bytes. ``T = 2 (p-1) alpha + 2 (p-1)/p beta S``.
reduce (push as in allreduce, then each server sends its summed shard to the root):
    Per rank: root ``p - 1`` messages, ``e (N - n_root)`` bytes; others ``p`` messages, ``S`` bytes.
    ``T = 2 (p-1) alpha + 2 (p-1)/p beta S + (p-1)/p gamma S``. Non-root tensors end as scratch.

The push (``p = 3``; ``sJ``: shard ``J``, served by rank ``J``; every rank sends to all others at once,
so each NIC carries ``p - 1`` flows each way; the pull is the same picture with summed shards)::

    rank 0: s1 --> rank 1, s2 --> rank 2      rank 1: s2 --> rank 2, s0 --> rank 0
    rank 2: s0 --> rank 0, s1 --> rank 1      (each server sums the p - 1 copies of its shard)

Schedule as data: :func:`steps` (allreduce: push, pull); :func:`dedicated_steps` is the same with
dedicated servers (ranks ``W .. W+S-1`` serve, ranks ``0 .. W-1`` work), which the network simulator prices
(BML's "two clusters" placement, sec. 2) and dpcomm does not run.

Extra memory per call: the push receives into at most ``min(p - 1, N / n_rank)`` shard buffers, never more
than ``S`` bytes (the thread's reused :func:`~dpcomm.collectives._p2p.scratch`); pulls receive in place.
``p = 1`` or ``N = 0``: nothing is sent.

Source: Gong et al., "BML: A High-performance, Low-cost Gradient Synchronization Algorithm for DML Training"
(NeurIPS 2018), sec. 2 ("P2P based PS synchronization") and the baseline of sec. 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.collectives._p2p import P2P, begin, chunk_bounds, reduce_into, scratch
from dpcomm.collectives.base import register
from dpcomm.schedules import ps_dedicated_steps as dedicated_steps
from dpcomm.schedules import ps_steps as steps

__all__ = ["ParameterServer", "dedicated_steps", "steps"]


def _push(comm: P2P, flat: torch.Tensor, bounds: list[tuple[int, int]]) -> None:
    """Send every shard to its server and sum the ``p - 1`` copies of the own shard as they arrive."""
    p, me = comm.size, comm.rank
    a, b = bounds[me]
    n = b - a
    slots = max(1, min(p - 1, flat.numel() // max(n, 1)))  # keep the buffer within one message
    buf = scratch(slots * n, flat.dtype)
    srcs = [(me - k) % p for k in range(1, p)]  # the rank that sends to me at its k-th push

    def post(i: int):
        off = (i % slots) * n
        return comm.irecv(buf[off : off + n], srcs[i], "push")

    recvs = {i: post(i) for i in range(min(slots, p - 1))}
    sends = [comm.isend(flat[slice(*bounds[(me + k) % p])], (me + k) % p, "push") for k in range(1, p)]
    for i in range(p - 1):
        comm.wait(recvs.pop(i))
        off = (i % slots) * n
        reduce_into(flat[a:b], buf[off : off + n])
        if i + slots < p - 1:
            recvs[i + slots] = post(i + slots)
    comm.wait(*sends)


@register("ps")
@dataclass(slots=True, kw_only=True)
class ParameterServer:
    """P2P parameter server: push shards to their servers, sum, pull (BML's baseline)."""

    name: str = "ps"

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        call = begin(self.name, "allreduce", tensor, group)
        if call is None:
            return
        comm, flat = call
        p, me = comm.size, comm.rank
        bounds = chunk_bounds(flat.numel(), p)
        _push(comm, flat, bounds)
        recvs = [comm.irecv(flat[slice(*bounds[(me - k) % p])], (me - k) % p, "pull") for k in range(1, p)]
        sends = [comm.isend(flat[slice(*bounds[me])], (me + k) % p, "pull") for k in range(1, p)]
        comm.wait(*recvs, *sends)

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "broadcast", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p, me = comm.size, comm.rank
        bounds = chunk_bounds(flat.numel(), p)
        if me == root:
            others = [(me + k) % p for k in range(1, p)]
            sends = [comm.isend(flat[slice(*bounds[j])], j, "scatter") for j in others]
            sends += [comm.isend(flat[slice(*bounds[me])], j, "serve") for j in others]  # root serves its own
            comm.wait(*sends)
            return
        comm.recv(flat[slice(*bounds[me])], root, "scatter")
        peers = [(me + k) % p for k in range(1, p)]  # the root serves its shard, others theirs
        recvs = [comm.irecv(flat[slice(*bounds[j])], j, "serve") for j in peers]
        sends = [comm.isend(flat[slice(*bounds[me])], j, "serve") for j in peers if j != root]
        comm.wait(*recvs, *sends)

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "reduce", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p, me = comm.size, comm.rank
        bounds = chunk_bounds(flat.numel(), p)
        _push(comm, flat, bounds)
        if me == root:
            others = [(me + k) % p for k in range(1, p)]
            comm.wait(*[comm.irecv(flat[slice(*bounds[j])], j, "gather") for j in others])
        else:
            comm.send(flat[slice(*bounds[me])], root, "gather")
