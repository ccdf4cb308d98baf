"""``mst``: minimum-spanning-tree (binomial tree) broadcast and reduce; allreduce = reduce + broadcast.

Symbols: ``p`` ranks, relative rank ``v = (rank - root) mod p``, ``d = ceil(log2 p)`` rounds, ``S`` bytes;
``alpha``, ``beta``, ``gamma``. ``low(v)`` is the lowest set bit of ``v`` (``low(0) = 2^d``). In the
binomial tree rooted at ``v = 0`` the parent of ``v`` is ``v - low(v)`` and its children are ``v + m`` for
``m = low(v)/2, low(v)/4, .., 1`` with ``v + m < p``; ``kids(v)`` counts them (``ceil(log2 p)`` at most,
``p - 1`` in all).

broadcast (MPICH's binomial broadcast):
    1. ``v != 0`` receives the whole message in place from its parent;
    2. it sends the whole message to its children one at a time, one per round, farthest (largest ``m``,
       the largest subtree) first: each send is waited for before the next is posted, so children never
       share the sender's link (posting all at once costs a round on a one-NIC star).
    Per rank: ``kids(v)`` messages of ``S`` bytes. ``T = d (alpha + beta S)`` (LP paper Table 1).
reduce (the mirror image):
    1. ``v`` receives the partial sum of each child's subtree, nearest (``m = 1``, the smallest subtree)
       first, one at a time (one child per round, as the tree schedules it; a child's sum is ready only
       after its own subtree's rounds), into one scratch buffer and adds it in;
    2. ``v != 0`` sends its subtree's sum to its parent.
    Per rank: 1 message of ``S`` bytes (the root none). ``T = d (alpha + (beta + gamma) S)``.
    Non-root tensors end as scratch.
allreduce = reduce to rank 0, then broadcast from rank 0 (two calls, as the paper defines MST allreduce):
    Per rank: ``[rank != 0] + kids(rank)`` messages of ``S`` bytes. ``T = d (2 alpha + 2 beta S + gamma S)``.

One broadcast round (``p = 8``, round 2 of 3, ``m = 2``: every rank that has the message sends it to the
child ``m`` away; round 1 was ``0 -> 4``, round 3 is ``0->1, 2->3, 4->5, 6->7``)::

    rank 0 ==S==> rank 2        rank 4 ==S==> rank 6        ranks 1, 3, 5, 7 idle

Schedule as data: :func:`steps` (allreduce: ``d`` reduce rounds, then ``d`` broadcast rounds).

Extra memory per call: one message-sized receive buffer in reduce (the thread's reused
:func:`~dpcomm.collectives._p2p.scratch`); broadcast receives in place. ``p = 1`` or ``S = 0``: nothing sent.

Source: LP paper (Wang et al. 2017) sec. 3.2 and Table 1, "Minimal Spanning Tree"; binomial trees as in
Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 2005.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.collectives._p2p import P2P, begin, reduce_into, scratch
from dpcomm.collectives.base import register
from dpcomm.schedules import mst_round as _round
from dpcomm.schedules import mst_steps as steps
from dpcomm.schedules import tree_children, tree_parent

__all__ = ["BinomialTree", "steps", "tree_children", "tree_parent"]


def tree_broadcast(comm: P2P, flat: torch.Tensor, root: int) -> None:
    p = comm.size
    v = (comm.rank - root) % p
    if v:
        comm.recv(flat, (tree_parent(v) + root) % p, step=_round(v & -v, p, down=True))
    # One child per round, largest subtree first: the tree's schedule. Posting every send at once made the
    # children share the sender's one NIC, and on a star the broadcast took d + 1 rounds, not d
    # (docs/testbed.md sec. 1). A send completes once its bytes are in the socket buffer, so the next one
    # starts while the previous one drains: the link never idles between rounds.
    for k in tree_children(v, p):
        comm.send(flat, (k + root) % p, step=_round(k - v, p, down=True))


def tree_reduce(comm: P2P, flat: torch.Tensor, root: int) -> None:
    p = comm.size
    v = (comm.rank - root) % p
    kids = tree_children(v, p)[::-1]  # nearest first: their subtrees are smallest and finish first
    if kids:
        buf = scratch(flat.numel(), flat.dtype)
        for k in kids:
            comm.recv(buf, (k + root) % p, step=_round(k - v, p, down=False))
            reduce_into(flat, buf)
    if v:
        comm.send(flat, (tree_parent(v) + root) % p, step=_round(v & -v, p, down=False))


@register("mst")
@dataclass(slots=True, kw_only=True)
class BinomialTree:
    """Binomial-tree broadcast and reduce; allreduce = reduce to rank 0 + broadcast from rank 0."""

    name: str = "mst"

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "broadcast", tensor, group, root)
        if call is not None:
            tree_broadcast(*call, root)

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        call = begin(self.name, "reduce", tensor, group, root)
        if call is not None:
            tree_reduce(*call, root)

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        call = begin(self.name, "allreduce", tensor, group)
        if call is not None:
            comm, flat = call
            tree_reduce(comm, flat, 0)
            tree_broadcast(comm, flat, 0)
