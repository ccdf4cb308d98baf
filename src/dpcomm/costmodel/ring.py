"""Ring collectives (Patarasuk & Yuan; Thakur, Rabenseifner & Gropp 2005): cost in the alpha-beta-gamma model.

Symbols: ``N`` nodes on a logical ring, ``M`` bytes, ``alpha`` s per message, ``beta`` s/byte on the wire,
``gamma`` s/byte to sum. Each step every node sends one block of ``M/N`` bytes to its successor.

allreduce (MG-WFBP Table II, "Ring"; BML sec. 2 gives the same ``2(N-1)/N * T_F``):
    1. reduce-scatter: ``N-1`` steps, ``M/N`` bytes each, summed on arrival;
    2. allgather: ``N-1`` steps, ``M/N`` bytes each.
    ``T = 2(N-1)*alpha + 2(N-1)/N * beta*M + (N-1)/N * gamma*M``; ``2(N-1)`` messages and
    ``2(N-1)/N * M`` bytes sent per node.

broadcast (dpcomm's ring form: the scatter-allgather of Thakur et al. 2005 sec. 4, allgather on the ring):
    1. scatter: the root sends each node its ``M/N`` block, ``N-1`` messages;
    2. ring allgather: ``N-1`` steps of ``M/N``.
    ``T = 2(N-1)*alpha + 2(N-1)/N * beta*M``.

reduce (mirror image): ring reduce-scatter then gather of the ``N-1`` blocks at the root:
    ``T = 2(N-1)*alpha + 2(N-1)/N * beta*M + (N-1)/N * gamma*M``.

All three hold for any ``N >= 1`` (no power-of-two assumption).
"""

from __future__ import annotations

from dpcomm.costmodel._steps import trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]


def allreduce_ab(nodes: int, net: Network) -> tuple[float, float]:
    """``(a, b)`` of ``T = a + b*M`` (MG-WFBP Table II).

    ``a = 2(N-1) alpha``, ``b = 2(N-1)/N beta + (N-1)/N gamma``.
    """
    n = nodes
    return 2 * (n - 1) * net.alpha, 2 * (n - 1) / n * net.beta + (n - 1) / n * net.gamma


def allreduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net)
    return a + b * nbytes


def broadcast(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    n = nodes
    return 2 * (n - 1) * net.alpha + 2 * (n - 1) / n * net.beta * nbytes


def reduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    n = nodes
    return 2 * (n - 1) * net.alpha + (2 * (n - 1) / n * net.beta + (n - 1) / n * net.gamma) * nbytes
