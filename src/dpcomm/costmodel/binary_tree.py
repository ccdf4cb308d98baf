"""Binary-tree collectives: cost in the alpha-beta-gamma model (MG-WFBP Table II, "Binary tree").

Symbols: ``N`` nodes arranged as a complete binary tree of height ``h = floor(log2 N)`` (``h = log2 N``
for the power-of-two ``N`` that MG-WFBP assumes), ``M`` bytes, ``alpha``, ``beta``, ``gamma`` (:mod:`.p2p`).
The whole message moves one level per step; MG-WFBP's table charges one message per level (the two
children of a parent are served concurrently).

reduce: ``h`` steps up the tree, ``M`` bytes each, summed at the parent: ``T = h*(alpha + (beta+gamma)*M)``.
broadcast: ``h`` steps down the tree, ``M`` bytes each: ``T = h*(alpha + beta*M)``.
allreduce = reduce then broadcast (Table II): ``T = 2h*alpha + h*(2*beta + gamma)*M``,
i.e. ``a = 2 alpha log2 N``, ``b = (2 beta + gamma) log2 N``. ``2h`` steps, ``2h*M`` bytes on the critical
path.

Cost-only: no collective implementation is named ``binary_tree``; the binomial tree is :mod:`.mst`.
"""

from __future__ import annotations

from dpcomm.costmodel._steps import floor_log2, trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]


def allreduce_ab(nodes: int, net: Network) -> tuple[float, float]:
    h = floor_log2(nodes)
    return 2 * h * net.alpha, h * (2 * net.beta + net.gamma)


def allreduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net)
    return a + b * nbytes


def broadcast(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    return floor_log2(nodes) * (net.alpha + net.beta * nbytes)


def reduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    return floor_log2(nodes) * (net.alpha + (net.beta + net.gamma) * nbytes)
