"""Bidirectional-exchange ("BE") collectives: recursive halving and doubling (Rabenseifner's algorithm).

Sources: LP paper Table 1 ("Bidirectional Exchange") and MG-WFBP Table II ("Recursive halving and
doubling", ``a = 2 alpha log2 N``, ``b = 2 beta - (2 beta + gamma)/N + gamma``, the same formula rearranged).
Symbols: ``p`` nodes, ``n = M`` bytes, ``alpha``, ``beta``, ``gamma``; ``P' = 2^floor(log2 p)``,
``r = p - P'``.

allreduce, ``p`` a power of two (reduce-scatter by recursive halving, allgather by recursive doubling):
    1. ``log2 p`` steps exchanging ``M/2, M/4, ..., M/p`` bytes and summing them:
       ``log p alpha + (p-1)/p (beta + gamma) M``;
    2. ``log2 p`` steps exchanging ``M/p, ..., M/2`` bytes: ``log p alpha + (p-1)/p beta M``.
    ``T = 2 log p alpha + 2 (p-1)/p beta M + (p-1)/p gamma M``.
reduce (reduce-scatter, then a binomial gather of the blocks at the root):
    ``T = 2 log p alpha + 2 (p-1)/p beta M + (p-1)/p gamma M`` (Table 1).
broadcast (binomial scatter, then a ring allgather, the MPI long-message broadcast):
    ``T = (ceil(log2 p) + p - 1) alpha + 2 (p-1)/p beta M`` (Table 1); valid for any ``p``.

Non-power-of-two ``p`` (allreduce and reduce), the standard fold (Thakur, Rabenseifner & Gropp 2005, sec. 4.1;
Rabenseifner 2004): the ``r`` extra nodes first send their whole vector to a partner among the first ``P'``
(one step, ``alpha + (beta + gamma) M``), the ``P'`` nodes run the algorithm above, and (allreduce only) each
partner sends the result back (one step, ``alpha + beta M``):
    ``T_allreduce = T_pow2(P') + 2 alpha + (2 beta + gamma) M``;
    ``T_reduce = T_pow2(P') + alpha + (beta + gamma) M``.
"""

from __future__ import annotations

from dpcomm.costmodel._steps import ceil_log2, floor_log2, is_pow2, trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]


def _pow2_ab(q: int, net: Network) -> tuple[float, float]:
    """Rabenseifner on ``q`` (a power of two) nodes: ``(2 log q alpha, 2 (q-1)/q beta + (q-1)/q gamma)``."""
    return 2 * floor_log2(q) * net.alpha, 2 * (q - 1) / q * net.beta + (q - 1) / q * net.gamma


def allreduce_ab(nodes: int, net: Network) -> tuple[float, float]:
    q = 1 << floor_log2(nodes)  # P'
    a, b = _pow2_ab(q, net)
    if q != nodes:  # fold the r extra nodes in (summed) and the result back out
        a, b = a + 2 * net.alpha, b + 2 * net.beta + net.gamma
    return a, b


def allreduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net)
    return a + b * nbytes


def reduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    q = 1 << floor_log2(nodes)
    a, b = _pow2_ab(q, net)  # reduce-scatter + gather costs what reduce-scatter + allgather does (Table 1)
    if not is_pow2(nodes):
        a, b = a + net.alpha, b + net.beta + net.gamma  # fold only: the result stays on the root
    return a + b * nbytes


def broadcast(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    p = nodes
    return (ceil_log2(p) + p - 1) * net.alpha + 2 * (p - 1) / p * net.beta * nbytes
