"""``ring``: reduce-scatter + allgather on a logical ring, built from point-to-point sends.

Symbols: ``P`` ranks on a ring (relative rank ``v = (rank - root) mod P``, successor ``v + 1``), ``N``
elements of ``e`` bytes, ``S = N e`` bytes; chunk ``j`` is the ``j``-th of ``P`` near-equal pieces
(:func:`~dpcomm.collectives._p2p.chunk_bounds`, ``n_j`` elements, the first ``N mod P`` one longer);
``alpha`` s per message, ``beta`` s/byte on the wire, ``gamma`` s/byte summed. Indices are mod ``P``.

allreduce (Patarasuk & Yuan 2009; MG-WFBP Table II "Ring"):
    1. reduce-scatter, steps ``s = 0..P-2``: send chunk ``v - s`` to ``v + 1``, receive chunk ``v - s - 1``
       from ``v - 1`` into a scratch buffer and add it in; rank ``v`` ends with the sum of chunk ``v + 1``;
    2. allgather, steps ``s = 0..P-2``: send chunk ``v + 1 - s``, receive chunk ``v - s`` in place.
    Per rank: ``2(P-1)`` messages, ``e (2N - n_{v+1} - n_{v+2})`` bytes (``2(P-1)/P S`` when ``P | N``).
    ``T = 2(P-1) alpha + 2(P-1)/P beta S + (P-1)/P gamma S``.
broadcast (scatter + ring allgather, Thakur, Rabenseifner & Gropp 2005 sec. 4; :mod:`dpcomm.costmodel.ring`):
    1. scatter: the root sends chunk ``v`` to each ``v = 1..P-1`` (``P - 1`` messages);
    2. ring allgather as above but every rank starts with chunk ``v``, and rank ``P - 1`` does not send to
       the root (the root has everything): steps ``s = 0..P-2``, send chunk ``v - s``, receive ``v - s - 1``.
    Per rank: root ``2(P-1)`` messages, ``e (2N - n_0 - n_1)`` bytes; ``v = 1..P-2``: ``P - 1`` messages,
    ``e (N - n_{v+1})`` bytes; ``v = P-1``: none. ``T = 2(P-1) alpha + 2(P-1)/P beta S``.
reduce (ring reduce-scatter + gather at the root):
    1. reduce-scatter as in allreduce (relative ranks); rank ``v`` ends with the sum of chunk ``v + 1``;
    2. gather: every ``v != 0`` sends its chunk ``v + 1`` to the root (received in place).
    Per rank: root ``P - 1`` messages, ``e (N - n_1)`` bytes; others ``P`` messages, ``e N`` bytes.
    ``T = 2(P-1) alpha + 2(P-1)/P beta S + (P-1)/P gamma S``. Non-root tensors end as scratch.
reduce_scatter (allreduce's phase 1 alone, for DeAR's backward; ``root = 1``, so ``v = r - 1`` and group rank
``r`` ends with the sum of chunk ``r``):
    steps ``s = 0..P-2``: send chunk ``r - 1 - s`` to ``r + 1``, receive chunk ``r - 2 - s`` from ``r - 1``
    into a scratch buffer and add it in. Per rank: ``P - 1`` messages, ``e (N - n_r)`` bytes (every chunk
    but its own; ``(P-1)/P S`` when ``P | N``). ``T = (P-1) alpha + (P-1)/P beta S + (P-1)/P gamma S``.
    The other chunks end as partial sums (scratch).
allgather (allreduce's phase 2 alone, for DeAR's next forward; rank ``r`` starts with chunk ``r``):
    steps ``s = 0..P-2``: send chunk ``r - s`` to ``r + 1``, receive chunk ``r - s - 1`` from ``r - 1`` in
    place. Per rank: ``P - 1`` messages, ``e (N - n_{r+1})`` bytes (every chunk but ``r + 1``; ``(P-1)/P S``
    when ``P | N``). ``T = (P-1) alpha + (P-1)/P beta S``. Chunks other than ``r`` may hold anything before.

One reduce-scatter step (``s = 0``, ``P = 4``; ``cK`` is chunk ``K``, ``+=`` adds into the own copy)::

    rank 0 --c0--> rank 1 --c1--> rank 2 --c2--> rank 3 --c3--> rank 0
    rank v: c(v-1) += received                       every link busy, S/P bytes each

Schedule as data: :func:`steps` (allreduce; the messages the code above posts, step by step).

Option ``segment_bytes`` (default None): the reduce-scatter sends chunk ``j`` as ``ceil(n_j e / g)``
segments of ``g = segment_bytes`` bytes (whole elements, capped at the largest chunk; at least one) and adds
segment ``k`` while ``k + 1`` arrives; the allreduce, reduce and reduce_scatter message counts grow by that
(the ``P - 1`` reduce-scatter messages become ``sum_s ceil(n_{v-s} e / g)``, an empty chunk one message), the
bytes do not; the allgather is not segmented.

Extra memory per call: one receive buffer of ``ceil(N / P)`` elements (reduce-scatter; two
segments with ``segment_bytes``; the thread's reused :func:`~dpcomm.collectives._p2p.scratch`); the allgather,
scatter and gather receive in place. ``P = 1`` or ``N = 0``: nothing is sent.

Source: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009; R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of collective communication operations in
MPICH", IJHPCA 2005.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.collectives._p2p import P2P, begin, block_bounds, chunk_bounds, reduce_into, scratch
from dpcomm.collectives.base import register
from dpcomm.schedules import ring_steps as steps

__all__ = ["Ring", "ring_allgather", "ring_reduce_scatter", "steps"]


def ring_reduce_scatter(
    comm: P2P,
    flat: torch.Tensor,
    bounds: list[tuple[int, int]],
    root: int = 0,
    segment_bytes: int | None = None,
) -> None:
    """Steps ``0..P-2`` of the ring reduce-scatter on relative ranks; rank ``v`` ends owning chunk ``v+1``.

    Each step's chunk moves as segments of ``segment_bytes`` (None: one message per chunk); segment ``k + 1``
    is received while segment ``k`` is added in, into two segment-sized buffers."""
    p = comm.size
    v = (comm.rank - root) % p
    right, left = (comm.rank + 1) % p, (comm.rank - 1) % p
    e = flat.element_size()
    most = max(b - a for a, b in bounds)
    seg = most if segment_bytes is None else max(1, min(most, segment_bytes // e))
    buf = scratch(min(2 * seg, most) if seg < most else most, flat.dtype)

    def segments(j: int) -> list[tuple[int, int]]:
        a, b = bounds[j]
        return [(a + x, a + y) for x, y in block_bounds(b - a, 1, max(seg, 1))]

    def slot(k: int, a: int, b: int) -> torch.Tensor:
        return buf[(k % 2) * seg : (k % 2) * seg + b - a]

    sends = []  # a sent chunk is not written again in this phase: wait for the sends only at its end, so a
    for s in range(p - 1):  # rank moves on as soon as its step's data is in (less lock-step on a busy CPU)
        got = segments((v - s - 1) % p)
        pending = [comm.irecv(slot(k, *got[k]), left, s) for k in range(min(2, len(got)))]
        sends += [comm.isend(flat[a:b], right, s) for a, b in segments((v - s) % p)]
        for k, (a, b) in enumerate(got):
            comm.wait(pending[k])
            reduce_into(flat[a:b], slot(k, a, b))
            if k + 2 < len(got):  # the slot just summed takes segment k + 2; k + 1 is in flight
                pending.append(comm.irecv(slot(k + 2, *got[k + 2]), left, s))
    comm.wait(*sends)


def ring_allgather(
    comm: P2P,
    flat: torch.Tensor,
    bounds: list[tuple[int, int]],
    *,
    root: int = 0,
    own: int = 0,
    first_step: int = 0,
    skip_root: bool = False,
) -> None:
    """Ring allgather on relative ranks where rank ``v`` starts with chunk ``v + own``; ``skip_root``: the
    root already holds every chunk, so rank ``P - 1`` sends it nothing."""
    p = comm.size
    v = (comm.rank - root) % p
    right, left = (comm.rank + 1) % p, (comm.rank - 1) % p
    send_ok = not (skip_root and v == p - 1)
    recv_ok = not (skip_root and v == 0)
    sends = []  # chunks sent here are never written again: wait for the sends at the end
    for s in range(p - 1):
        sa, sb = bounds[(v + own - s) % p]
        ra, rb = bounds[(v + own - s - 1) % p]
        r = comm.irecv(flat[ra:rb], left, first_step + s) if recv_ok else None
        if send_ok:
            sends.append(comm.isend(flat[sa:sb], right, first_step + s))
        comm.wait(r)
    comm.wait(*sends)


@register("ring")
@dataclass(slots=True, kw_only=True)
class Ring:
    """Ring allreduce (reduce-scatter + allgather); broadcast = scatter + ring allgather; reduce = ring
    reduce-scatter + gather; ``reduce_scatter`` and ``allgather`` alone (group rank ``r`` owns chunk ``r`` of
    :func:`~dpcomm.collectives._p2p.chunk_bounds`). See the module docstring for steps and bytes."""

    segment_bytes: int | None = None
    """Reduce-scatter messages are cut into segments of this many bytes so the sum of one overlaps the
    transfer of the next; None: one message per chunk."""
    name: str = "ring"

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        call = begin(self.name, "allreduce", tensor, group)
        if call is None:
            return
        comm, flat = call
        bounds = chunk_bounds(flat.numel(), comm.size)
        ring_reduce_scatter(comm, flat, bounds, segment_bytes=self.segment_bytes)
        ring_allgather(comm, flat, bounds, own=1, first_step=comm.size - 1)

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "broadcast", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p = comm.size
        bounds = chunk_bounds(flat.numel(), p)
        v = (comm.rank - root) % p
        if v == 0:  # scatter: chunk j to relative rank j
            sends = [comm.isend(flat[a:b], (root + j) % p, "scatter") for j, (a, b) in enumerate(bounds) if j]
            comm.wait(*sends)
        else:
            a, b = bounds[v]
            comm.recv(flat[a:b], root, "scatter")
        ring_allgather(comm, flat, bounds, root=root, first_step=1, skip_root=True)

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "reduce", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p = comm.size
        bounds = chunk_bounds(flat.numel(), p)
        ring_reduce_scatter(comm, flat, bounds, root, self.segment_bytes)
        v = (comm.rank - root) % p
        if v == 0:  # gather chunk u + 1 from relative rank u
            recvs = []
            for u in range(1, p):
                a, b = bounds[(u + 1) % p]
                recvs.append(comm.irecv(flat[a:b], (root + u) % p, "gather"))
            comm.wait(*recvs)
        else:
            a, b = bounds[(v + 1) % p]
            comm.send(flat[a:b], root, "gather")

    def reduce_scatter(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        """In place: group rank ``r``'s chunk ``chunk_bounds(N, P)[r]`` ends as the sum over the group of
        that chunk; the other chunks end as partial sums (scratch)."""
        call = begin(self.name, "reduce_scatter", tensor, group)
        if call is None:
            return
        comm, flat = call
        bounds = chunk_bounds(flat.numel(), comm.size)
        # relative rank v = rank - root owns chunk v + 1 at the end: root 1 makes that chunk `rank`
        ring_reduce_scatter(comm, flat, bounds, 1 % comm.size, self.segment_bytes)

    def allgather(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        """In place: group rank ``r``'s chunk ``chunk_bounds(N, P)[r]`` is copied to every rank, so every
        rank ends with every chunk (what the other chunks held before does not matter)."""
        call = begin(self.name, "allgather", tensor, group)
        if call is None:
            return
        comm, flat = call
        bounds = chunk_bounds(flat.numel(), comm.size)
        ring_allgather(comm, flat, bounds, root=0, own=0, first_step=0)
