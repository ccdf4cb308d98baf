"""Minimum-spanning-tree (binomial tree) collectives, the LP paper's "MST" baseline (LP paper Table 1).

Symbols: ``p`` nodes, ``n = M`` bytes, ``alpha``, ``beta``, ``gamma``; ``d = ceil(log2 p)`` rounds (the paper
omits the ceiling). In round ``i`` every node that has the data sends the whole message to one that has not
(broadcast), or the reverse with a sum (reduce), so the set of holders doubles each round.

broadcast: ``d`` steps of ``M`` bytes: ``T = d*(alpha + beta*M)`` (Table 1: ``log p (alpha + n beta)``).
reduce:    ``T = d*(alpha + (beta + gamma)*M)`` (Table 1: ``log p (alpha + n beta + n gamma)``).
allreduce = reduce + broadcast: ``T = d*(2 alpha + 2 beta M + gamma M)``
(Table 1: ``log p (2 alpha + 2 n beta + n gamma)``). ``2d`` messages of ``M`` bytes on the critical path.
Holds for any ``p`` (a binomial tree needs no power of two).
"""

from __future__ import annotations

from dpcomm.costmodel._steps import ceil_log2, trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]


def allreduce_ab(nodes: int, net: Network) -> tuple[float, float]:
    d = ceil_log2(nodes)
    return 2 * d * net.alpha, d * (2 * net.beta + net.gamma)


def allreduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    return ceil_log2(nodes) * (2 * net.alpha + (2 * net.beta + net.gamma) * nbytes)


def broadcast(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    return ceil_log2(nodes) * (net.alpha + net.beta * nbytes)


def reduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    return ceil_log2(nodes) * (net.alpha + (net.beta + net.gamma) * nbytes)
