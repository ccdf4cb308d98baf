"""P2P parameter server on a non-blocking Fat-Tree (BML paper sec. 2, the baseline of its evaluation).

Symbols: ``N`` machines, each both a worker and the server of ``1/N`` of the parameters; ``M`` bytes of
gradients; ``alpha``, ``beta``, ``gamma``; ``T_F = beta M``. The Fat-Tree is non-blocking, so only each
machine's own NIC limits it.

allreduce (push then pull):
    1. push: every machine sends its ``M/N`` slice owned by each of the ``N - 1`` others (``N - 1`` messages),
       and sums the ``N - 1`` slices it receives for its own part;
    2. pull: every machine sends its aggregated ``M/N`` slice to the ``N - 1`` others.
    GST (BML): ``2 (N-1)/N * T_F``, the same as ring allreduce. Alpha-beta form (one message per peer, sent
    one after another on the machine's NIC):
    ``T = 2 (N-1) alpha + 2 (N-1)/N beta M + (N-1)/N gamma M``.

broadcast (root scatters ``M/N`` slices to their servers, which then send them to everyone):
    ``T = 2 (N-1) alpha + 2 (N-1)/N beta M``.
reduce (push and sum as above, then the ``N - 1`` servers send their slices to the root):
    ``T = 2 (N-1) alpha + 2 (N-1)/N beta M + (N-1)/N gamma M``.
The alpha-beta costs equal :mod:`.ring`'s; they differ on a real network (``N - 1`` concurrent flows per NIC).
"""

from __future__ import annotations

from dpcomm.costmodel import ring
from dpcomm.costmodel._steps import trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]

allreduce_ab = ring.allreduce_ab  # same alpha-beta-gamma form (module docstring)
broadcast = ring.broadcast


def allreduce(nbytes: float, nodes: int, net: Network) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    n = nodes
    return 2 * (n - 1) * net.alpha + 2 * (n - 1) / n * net.beta * nbytes + (n - 1) / n * net.gamma * nbytes


def reduce(nbytes: float, nodes: int, net: Network) -> float:
    return allreduce(nbytes, nodes, net)  # push-and-sum + gather moves what push-and-sum + pull does
