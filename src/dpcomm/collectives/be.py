"""``be``: bidirectional exchange -- recursive halving and doubling (Rabenseifner), the LP paper's "BE".

Symbols: ``p`` ranks, relative rank ``v = (rank - root) mod p`` (allreduce: ``root = 0``), ``S = N e``
bytes; ``p' = 2^floor(log2 p)``, ``r = p - p'``, ``L = log2 p'``; ``alpha``, ``beta``, ``gamma``.
Fold for non-power-of-two ``p`` (Rabenseifner 2004; Thakur et al. 2005 sec. 4.1): among ``v < 2r`` each odd
``v`` sends its whole vector to ``v - 1`` and sits out; the others take new ranks ``u = v // 2`` (``v < 2r``)
or ``u = v - r``. Among the ``p'`` ranks chunk ``j`` is the ``j``-th of ``p'`` near-equal pieces (``n_j``
elements); ``blk_m(u)`` is the aligned run of ``m`` chunks holding chunk ``u``, ``|.|`` its element count.

allreduce:
    1. fold (if ``r > 0``): odd ``v < 2r`` send ``S`` to ``v - 1``, which adds it;
    2. reduce-scatter by recursive halving, ``m = p'/2, .., 1``: exchange with ``u xor m``, send the half of
       the current range not kept (the half holding ``u`` is kept), receive the kept half into a buffer, add;
       ``u`` ends with the sum of chunk ``u``;
    3. allgather by recursive doubling, ``m = 1, 2, .., p'/2``: send ``blk_m(u)``, receive ``blk_m(u xor m)``
       in place;
    4. unfold: even ``v < 2r`` send the result to ``v + 1``.
    Per rank: odd ``v < 2r``: 1 message, ``S`` bytes; others ``2L + [v < 2r]`` messages,
    ``e (N - n_u) + e sum_{j<L} |blk_{2^j}(u)| + [v < 2r] S`` bytes (``2 (p'-1)/p' S (+ S)`` when ``p' | N``).
    ``T = 2L alpha + 2 (p'-1)/p' beta S + (p'-1)/p' gamma S`` (+ ``2 alpha + (2 beta + gamma) S`` if
    ``r > 0``), LP paper Table 1 for ``p = p'``.
reduce (reduce-scatter + binomial gather, the MPICH long-message reduce):
    1.-2. fold and reduce-scatter as above (``v = 0`` is ``u = 0``, the root);
    3. gather, ``m = 1, 2, ..``: ``u`` with bit ``m`` set sends ``[u, u + m)`` (all it holds) to ``u - m`` and
       stops; the others receive ``[u + m, u + 2m)`` in place.
    Per rank: odd ``v < 2r``: 1 message, ``S`` bytes; others ``L + [u != 0]`` messages,
    ``e (N - n_u) + [u != 0] e |[u, u + low(u))|`` bytes (``low``: lowest set bit).
    ``T = 2L alpha + 2 (p'-1)/p' beta S + (p'-1)/p' gamma S`` (+ ``alpha + (beta + gamma) S`` if ``r > 0``).
    Non-root tensors end as scratch.
broadcast (binomial scatter + ring allgather, the MPICH long-message broadcast, LP paper Table 1; any ``p``,
    no fold; chunk ``j`` here is the ``j``-th of ``p`` pieces):
    1. scatter: ``v`` receives chunks ``[v, v + low(v))`` from ``v - low(v)`` and sends ``[k, k + m)`` to each
       child ``k = v + m`` of the binomial tree (:mod:`.mst`), ``m`` from ``low(v)/2`` down;
    2. ring allgather (:func:`~dpcomm.collectives.ring.ring_allgather`, rank ``p - 1`` skips the root).
    Per rank: ``kids(v)`` scatter messages of ``e |[k, min(k + m, p))|`` bytes, plus ``p - 1`` ring messages
    of ``e (N - n_{v+1})`` bytes for ``v != p - 1``. ``T = (ceil(log2 p) + p - 1) alpha + 2 (p-1)/p beta S``.

One halving step (``p' = 4``, ``m = 2``; ``[c0 c1 | c2 c3]``: the vector in ``p'`` chunks)::

    u=0 keeps [c0 c1], sends [c2 c3] --> u=2     u=2 keeps [c2 c3], sends [c0 c1] --> u=0
    u=1 keeps [c0 c1], sends [c2 c3] --> u=3     u=3 keeps [c2 c3], sends [c0 c1] --> u=1
    (pairs u, u xor m swap halves both ways at once; the next step halves the kept range with m = 1)

Schedule as data: :func:`steps` (allreduce, fold and unfold included).

Extra memory per call: one receive buffer, ``S`` bytes on a rank that receives a fold, else the first
halving step's half (the thread's reused :func:`~dpcomm.collectives._p2p.scratch`); broadcast receives in
place. ``p = 1`` or ``N = 0``: nothing is sent.

Source: LP paper (Wang et al. 2017) sec. 3.2 and Table 1, "Bidirectional Exchange"; R. Rabenseifner,
"Optimization of collective reduction operations", ICCS 2004; Thakur, Rabenseifner & Gropp, IJHPCA 2005.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.collectives._p2p import P2P, begin, chunk_bounds, reduce_into, scratch
from dpcomm.collectives.base import register
from dpcomm.collectives.ring import ring_allgather
from dpcomm.schedules import be_steps as steps
from dpcomm.schedules import fold_rank, tree_children, tree_parent
from dpcomm.schedules import unfold_rank as _unfold

__all__ = ["BidirectionalExchange", "fold_rank", "steps"]


class _Halving:
    """Fold + recursive-halving reduce-scatter for one call, on relative ranks around ``root``."""

    def __init__(self, comm: P2P, flat: torch.Tensor, root: int):
        self.comm, self.flat, self.root = comm, flat, root
        p = comm.size
        self.v = (comm.rank - root) % p
        self.u = fold_rank(self.v, p)
        self.q = 1 << (p.bit_length() - 1)  # p'
        self.folds = self.v < 2 * (p - self.q)  # takes part in the fold (either side)
        self.bounds = chunk_bounds(flat.numel(), self.q)

    def real(self, u: int) -> int:
        return (_unfold(u, self.comm.size) + self.root) % self.comm.size

    def span(self, lo: int, hi: int) -> slice:
        """Elements of chunks ``[lo, hi)``."""
        return slice(self.bounds[lo][0], self.bounds[hi - 1][1])

    def fold_in(self) -> None:
        comm, flat = self.comm, self.flat
        if not self.folds:
            return
        peer = (comm.rank - 1) % comm.size if self.v % 2 else (comm.rank + 1) % comm.size
        if self.u is None:
            comm.send(flat, peer, "fold")
        else:
            buf = scratch(flat.numel(), flat.dtype)
            comm.recv(buf, peer, "fold")
            reduce_into(flat, buf)

    def reduce_scatter(self) -> None:
        """Recursive halving; afterwards ``u`` holds the sum of chunk ``u``."""
        u, comm, flat = self.u, self.comm, self.flat
        assert u is not None
        lo, hi, m, step = 0, self.q, self.q >> 1, 1
        first_half = self.span(0, self.q // 2) if self.q > 1 else slice(0, 0)
        buf = scratch(flat.numel() if self.folds else first_half.stop - first_half.start, flat.dtype)
        while m:
            mid = lo + m
            keep, give = ((mid, hi), (lo, mid)) if u & m else ((lo, mid), (mid, hi))
            ks, gs = self.span(*keep), self.span(*give)
            got = buf[: ks.stop - ks.start]
            comm.sendrecv(flat[gs], self.real(u ^ m), got, self.real(u ^ m), step)
            reduce_into(flat[ks], got)
            lo, hi, m, step = keep[0], keep[1], m >> 1, step + 1


@register("be")
@dataclass(slots=True, kw_only=True)
class BidirectionalExchange:
    """Rabenseifner allreduce and reduce (recursive halving + doubling / gather, with the fold for
    non-power-of-two ``p``); broadcast = binomial scatter + ring allgather."""

    name: str = "be"

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        call = begin(self.name, "allreduce", tensor, group)
        if call is None:
            return
        comm, flat = call
        h = _Halving(comm, flat, 0)
        h.fold_in()
        if h.u is not None:
            h.reduce_scatter()
            u, m, step = h.u, 1, h.q.bit_length()
            while m < h.q:  # recursive doubling allgather
                mine, theirs = u & ~(m - 1), (u ^ m) & ~(m - 1)
                peer = h.real(u ^ m)
                comm.sendrecv(
                    flat[h.span(mine, mine + m)], peer, flat[h.span(theirs, theirs + m)], peer, step
                )
                m, step = m << 1, step + 1
        if h.folds:  # unfold: the sum goes back to the rank that sat out
            if h.u is None:
                comm.recv(flat, (comm.rank - 1) % comm.size, "unfold")
            else:
                comm.send(flat, (comm.rank + 1) % comm.size, "unfold")

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "reduce", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        h = _Halving(comm, flat, root)
        h.fold_in()
        if h.u is None:
            return
        h.reduce_scatter()
        u, m, step = h.u, 1, h.q.bit_length()
        while m < h.q:  # binomial gather of the reduced chunks at u = 0
            if u & m:
                comm.send(flat[h.span(u, u + m)], h.real(u - m), step)
                return
            comm.recv(flat[h.span(u + m, u + 2 * m)], h.real(u + m), step)
            m, step = m << 1, step + 1

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "broadcast", tensor, group, root)
        if call is None:
            return
        comm, flat = call
        p = comm.size
        v = (comm.rank - root) % p
        bounds = chunk_bounds(flat.numel(), p)

        def span(lo: int, hi: int) -> slice:
            hi = min(hi, p)
            return slice(bounds[lo][0], bounds[hi - 1][1])

        if v:
            comm.recv(flat[span(v, v + (v & -v))], (tree_parent(v) + root) % p, "scatter")
        sends = [comm.isend(flat[span(k, 2 * k - v)], (k + root) % p, "scatter") for k in tree_children(v, p)]
        comm.wait(*sends)
        ring_allgather(comm, flat, bounds, root=root, first_step=1, skip_root=True)
