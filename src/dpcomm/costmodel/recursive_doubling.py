"""Recursive-doubling collectives: alpha-beta-gamma cost (MG-WFBP Table II, "Recursive doubling").

Symbols: ``N`` nodes, ``M`` bytes, ``alpha``, ``beta``, ``gamma``; ``P' = 2^floor(log2 N)`` the largest power
of two ``<= N`` and ``r = N - P'`` the nodes left over.

allreduce, ``N`` a power of two: in step ``i = 0..log2 N - 1`` node ``x`` exchanges its whole vector with
``x XOR 2^i`` and sums: ``log2 N`` steps, ``M`` bytes each way.
    ``T = log2 N * (alpha + (beta + gamma)*M)``, i.e. ``a = alpha log2 N``, ``b = (beta + gamma) log2 N``.
allreduce, any ``N`` (the standard fold, Thakur, Rabenseifner & Gropp 2005 sec. 4.1):
    1. each of the ``r`` extra nodes sends its vector to a partner among the first ``P'``, which sums it
       (``alpha + (beta + gamma)*M``);
    2. recursive doubling among the ``P'`` nodes (``log2 P'`` steps);
    3. each partner sends the result back (``alpha + beta*M``).
    ``T = log2 P' * (alpha + (beta+gamma) M) + [r > 0] * (2 alpha + (2 beta + gamma) M)``.

broadcast / reduce: recursive doubling of the set of nodes holding the data is the binomial tree, so these
are :mod:`.mst`'s ``ceil(log2 N)*(alpha + beta M)`` and ``ceil(log2 N)*(alpha + (beta + gamma) M)``.

Cost-only: no collective implementation is named ``recursive_doubling``.
"""

from __future__ import annotations

from dpcomm.costmodel import mst
from dpcomm.costmodel._steps import floor_log2, is_pow2, trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]

broadcast = mst.broadcast
reduce = mst.reduce


def allreduce_ab(nodes: int, net: Network) -> tuple[float, float]:
    k = floor_log2(nodes)  # log2 P'
    a, b = k * net.alpha, k * (net.beta + net.gamma)
    if not is_pow2(nodes):  # fold in, unfold out
        a, b = a + 2 * net.alpha, b + 2 * net.beta + net.gamma
    return a, b


def allreduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net)
    return a + b * nbytes
