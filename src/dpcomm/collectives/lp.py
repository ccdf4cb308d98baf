"""``lp``: the Linear Pipeline collectives of the LP paper (sec. 3, Fig. 2, Table 1, Theorem 3.1).

Symbols (paper's names): ``p`` ranks in a chain, ``n = S`` bytes (``N`` elements of ``e`` bytes) cut into
``B = ceil(N / (b / e))`` blocks of ``b`` bytes (the last one shorter; at least one element per block);
``alpha`` s per message, ``beta`` s/byte, ``gamma`` s/byte summed. Each rank receives block ``i + 1`` from
its predecessor while it sends block ``i`` to its successor (non-blocking sends and receives, two of each
in flight per direction), so once the pipeline is filled every link of the chain is busy.

broadcast (Fig. 2a; chain ``root, root+1, .., root-1``, position ``c = (rank - root) mod p``):
    1. position 0 sends blocks ``0..B-1`` to position 1;
    2. position ``c`` receives block ``i`` in place from ``c - 1`` and forwards it to ``c + 1`` (the last only
       receives).
    Per rank: ``B`` messages and ``S`` bytes, the last position none.
    ``T = (p - 1 + n/b) alpha + (b (p-1) + n) beta``.
reduce (Fig. 2b; the chain ends at the root: position ``c = (rank - root - 1) mod p``, root at ``p - 1``):
    1. position 0 sends its blocks;
    2. position ``c`` receives block ``i`` (partial sum of positions ``< c``) into one of two block buffers,
       adds it into its own block ``i``, sends that to ``c + 1``; the root only receives and adds.
    Per rank: ``B`` messages and ``S`` bytes, the root none. Non-root tensors end as scratch.
    ``T = (p - 1 + n/b) alpha + (b (p-1) + n)(beta + gamma)``.
allreduce (Fig. 2c, ONE filled pipeline, not reduce then broadcast; chain ``0..p-1``):
    1. up: blocks are reduced along the chain as in reduce; at position ``p - 1`` block ``i`` is final;
    2. down: position ``p - 1`` sends final block ``i`` back at once, and each position ``c`` receives it in
       place from ``c + 1`` and forwards it to ``c - 1``, interleaved with the up-flow of later blocks (rank
       ``c`` handles down-block ``i`` after up-block ``i + 2(p-1-c)``, when it arrives in a filled pipeline).
    Per rank: ends of the chain ``B`` messages and ``S`` bytes, middle positions ``2B`` and ``2S``.
    ``T = 2 (p - 1 + n/b) alpha + (b (p-1) + n)(2 beta + gamma)`` (Table 1).

One stage of the filled allreduce pipeline (``p = 4``; ``bI``: block ``I``, up = partial sums toward
rank 3, down = final sums back; each middle rank's one NIC sends two blocks per stage)::

    up:    rank 0 --b5--> rank 1 --b4--> rank 2 --b3--> rank 3
    down:  rank 0 <--b0-- rank 1 <--b1-- rank 2 <--b2-- rank 3

Schedule as data: :func:`steps` (allreduce: stage ``t`` holds up-block ``t - c`` from each position ``c``
and down-block ``t - (2p - 2 - c)`` from each ``c >= 1``; ``B + 2p - 2`` stages).

Block size: ``block_bytes`` if given, else the cost model's optimum
:func:`dpcomm.costmodel.lp.lp_optimal_block` (``b* = sqrt(n alpha / ((p-1) c))``) on ``network`` (a preset
name, a network file or a :class:`~dpcomm.costmodel.network.Network`; default ``$DPCOMM_NETWORK``, else
``10gbe``, as for :mod:`~dpcomm.collectives.auto`); the paper uses ``b`` around 64 KB. The optimum depends
on the network a lot: 548 KB for 16 MB on 4 ranks of ``10gbe``, 54 KB on the 100 Mbit/s links of
``dpcomm testbed`` (which sets ``$DPCOMM_NETWORK``); each is the better choice where it applies (see
docs/testbed.md, section 1). Theorem 3.1: with ``alpha -> 0`` the cost is ``~ n beta`` whatever ``p``.

Extra memory per call: reduce and allreduce receive into two block buffers (``min(2b, S)`` bytes, the
thread's reused :func:`~dpcomm.collectives._p2p.scratch`); broadcast receives in place. ``p = 1`` or
``N = 0``: nothing is sent.

Source: P. Wang et al. (LP paper), "Efficient Communications in Training Large Scale Neural Networks"
(ACM MM Thematic Workshops 2017), sec. 3.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.collectives._p2p import P2P, Pending, begin, block_bounds, reduce_into, scratch
from dpcomm.collectives.base import register
from dpcomm.costmodel.network import Network, resolve_network
from dpcomm.schedules import lp_block
from dpcomm.schedules import lp_steps as steps

__all__ = ["LinearPipeline", "steps"]

_SENDS_IN_FLIGHT = 2  # "two in flight": send block i while block i-1 may still be on the wire


class _Sends:
    """A window of posted sends: posting one more than ``limit`` waits for the oldest."""

    def __init__(self, comm: P2P, limit: int = _SENDS_IN_FLIGHT):
        self.comm, self.limit, self.q = comm, limit, deque[Pending]()

    def post(self, t: torch.Tensor, peer: int, step: int) -> None:
        self.q.append(self.comm.isend(t, peer, step))
        while len(self.q) > self.limit:
            self.comm.wait(self.q.popleft())

    def drain(self) -> None:
        while self.q:
            self.comm.wait(self.q.popleft())


@register("lp")
@dataclass(slots=True, kw_only=True)
class LinearPipeline:
    """Linear Pipeline broadcast, reduce and allreduce (one filled pipeline)."""

    block_bytes: int | None = None
    """Pipeline block ``b`` in bytes; None: the cost model's optimum for the message, ``p``, ``network``."""
    network: str | Network | None = None
    """Network whose alpha, beta, gamma pick the default block (preset name, file, or Network); None:
    ``$DPCOMM_NETWORK``, else ``10gbe``."""
    name: str = "lp"

    def __post_init__(self) -> None:
        if self.block_bytes is not None and (isinstance(self.block_bytes, bool) or self.block_bytes < 1):
            raise ValueError(f"lp: block_bytes must be an integer >= 1, got {self.block_bytes!r}")
        if self.network is None:
            self.network = os.environ.get("DPCOMM_NETWORK") or "10gbe"
        if isinstance(self.network, str):
            self.network = resolve_network(self.network)

    def block_size(self, nbytes: int, p: int, op: str) -> int:
        """Block ``b`` in bytes used for a message of ``nbytes`` on ``p`` ranks: ``block_bytes`` or the
        optimum, raised where needed so the message is at most ``costmodel.lp.MAX_BLOCKS`` blocks."""
        assert isinstance(self.network, Network)
        return lp_block(nbytes, p, self.network, op, self.block_bytes)

    def _blocks(self, comm: P2P, flat: torch.Tensor, op: str) -> list[tuple[int, int]]:
        e = flat.element_size()
        return block_bounds(flat.numel(), e, self.block_size(flat.numel() * e, comm.size, op))

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "broadcast", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p = comm.size
        c = (comm.rank - root) % p
        prev, nxt = (comm.rank - 1) % p, (comm.rank + 1) % p
        blocks = self._blocks(comm, flat, "broadcast")
        sends = _Sends(comm)
        recvs = (
            {i: comm.irecv(flat[slice(*blocks[i])], prev, i) for i in range(min(2, len(blocks)))} if c else {}
        )
        for i, (a, b) in enumerate(blocks):
            if c > 0:  # block i arrives while block i + 1 is already posted
                comm.wait(recvs.pop(i))
                if i + 2 < len(blocks):
                    recvs[i + 2] = comm.irecv(flat[slice(*blocks[i + 2])], prev, i + 2)
            if c < p - 1:
                sends.post(flat[a:b], nxt, i)
        sends.drain()

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "reduce", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p = comm.size
        c = (comm.rank - root - 1) % p
        up = _Up(comm, flat, self._blocks(comm, flat, "reduce"), first=c == 0)
        sends = _Sends(comm)
        for i, (a, b) in enumerate(up.blocks):
            up.reduce(i)
            if c < p - 1:
                sends.post(flat[a:b], (comm.rank + 1) % p, i)
        sends.drain()

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        call = begin(self.name, "allreduce", tensor, group)
        if call is None:
            return
        comm, flat = call
        p, c = comm.size, comm.rank
        up = _Up(comm, flat, self._blocks(comm, flat, "allreduce"), first=c == 0)
        nblocks = len(up.blocks)
        lag = 2 * (p - 1 - c)  # up-steps between sending block i up and its sum coming back (filled pipe)
        sent_up: deque[tuple[int, Pending]] = deque()
        down_recv: dict[int, Pending] = {}
        down = _Sends(comm)

        def post_down(upto: int) -> None:
            # Block j's memory was the up-message: once that send is done, post j's receive from above.
            while sent_up and sent_up[0][0] <= upto:
                j, work = sent_up.popleft()
                comm.wait(work)
                a, b = up.blocks[j]
                down_recv[j] = comm.irecv(flat[a:b], c + 1, nblocks + j)

        for t in range(nblocks + lag):
            if t < nblocks:
                up.reduce(t)
                a, b = up.blocks[t]
                if c < p - 1:
                    sent_up.append((t, comm.isend(flat[a:b], c + 1, t)))
                    post_down(t - 1)  # keeps two up-sends in flight
                else:  # the chain's end holds the final block t: start it down at once
                    down.post(flat[a:b], c - 1, nblocks + t)
            j = t - lag
            if c < p - 1 and 0 <= j < nblocks:
                post_down(j)
                a, b = up.blocks[j]
                comm.wait(down_recv.pop(j))
                if c > 0:
                    down.post(flat[a:b], c - 1, nblocks + j)
        down.drain()


class _Up:
    """The receiving side of a reduce pipeline: block ``i`` from the predecessor is added into ``flat``'s
    block ``i`` while block ``i + 1`` is being received into the other of two block buffers."""

    def __init__(self, comm: P2P, flat: torch.Tensor, blocks: list[tuple[int, int]], *, first: bool):
        self.comm, self.flat, self.blocks, self.first = comm, flat, blocks, first
        self.prev = (comm.rank - 1) % comm.size
        per = blocks[0][1] - blocks[0][0]
        self.buf = None if first else scratch(min(2 * per, flat.numel()), flat.dtype)
        self.per = per
        self.pending = {} if first else {i: self._post(i) for i in range(min(2, len(blocks)))}

    def _post(self, i: int) -> Pending:
        a, b = self.blocks[i]
        off = (i % 2) * self.per
        return self.comm.irecv(self.buf[off : off + b - a], self.prev, i)

    def reduce(self, i: int) -> None:
        if self.first:
            return
        self.comm.wait(self.pending.pop(i))
        a, b = self.blocks[i]
        off = (i % 2) * self.per
        reduce_into(self.flat[a:b], self.buf[off : off + b - a])
        if i + 2 < len(self.blocks):  # the slot just summed takes block i + 2; block i + 1 is in flight
            self.pending[i + 2] = self._post(i + 2)
