"""BML gradient synchronization on a BCube(n, k) network (BML paper sec. 3.2): alpha-beta-gamma cost.

Symbols: ``N = n^k`` servers, each with ``k`` NICs (one per switch level); ``M`` bytes of gradients;
``alpha``, ``beta`` (per NIC link), ``gamma``. BML runs ``k`` threads per server, thread ``e`` starting on
the level-``e`` links; the gradients are cut into ``k N`` pieces of ``M / (k N)`` bytes
(``T_C = T_F / (k N)`` with ``T_F = beta M`` the time to send all gradients at full link speed).

allreduce (BML Algorithm 1):
    1. aggregation stage, ``k`` steps: in step ``w`` every thread sends ``N / n^(w+1)`` pieces to each of its
       ``n - 1`` one-hop neighbours on one level and sums what it receives, taking ``(n-1) N/n^(w+1) T_C``;
       summed over ``w`` that is ``(N - 1) T_C``;
    2. broadcast stage, ``k`` steps, the same volumes in reverse: ``(N - 1) T_C``.
    GST (the paper): ``2 (N-1) T_C = 2 (N-1)/(k N) * T_F``, ``1/k`` of the P2P parameter server on a Fat-Tree
    (:mod:`.ps`). Alpha-beta form (dpcomm's reading: the ``k`` threads use disjoint NICs in parallel; in a
    step a thread sends one message to each of its ``n - 1`` neighbours, one after another on its link; the
    aggregation sums ``(N-1)/(kN) M`` bytes per thread):
    ``T = 2 k (n-1) alpha + 2 (N-1)/(k N) beta M + (N-1)/(k N) gamma M``.
    For ``k = 1`` this is exactly the ring/PS cost ``2(N-1) alpha + 2(N-1)/N beta M + (N-1)/N gamma M``.

broadcast and reduce (dpcomm's derivation from the same two stages; the paper only gives allreduce): broadcast
is a scatter of the root's pieces over its ``k`` NICs followed by the broadcast stage; reduce is the
aggregation stage followed by a gather at the root, each stage moving the same bytes per link as above:
    ``T_broadcast = 2 k (n-1) alpha + 2 (N-1)/(k N) beta M``;
    ``T_reduce = 2 k (n-1) alpha + 2 (N-1)/(k N) beta M + (N-1)/(k N) gamma M``.

Shape: :func:`dpcomm.topology.bcube_shape`, the one the algorithm runs: ``n`` and/or ``k`` as given, else the
most levels (the least ``n >= 2`` with ``N = n^k``, ``k >= 2``), which minimises every term above; an ``N``
that is no such power is a :class:`~dpcomm.errors.UserError` unless ``k = 1`` (one switch) is asked for.
"""

from __future__ import annotations

from dpcomm.costmodel._steps import trivial
from dpcomm.costmodel.network import Network
from dpcomm.topology.bcube import bcube_shape

__all__ = ["allreduce", "allreduce_ab", "broadcast", "reduce"]


def allreduce_ab(
    nodes: int, net: Network, *, n: int | None = None, k: int | None = None
) -> tuple[float, float]:
    if nodes == 1:
        return 0.0, 0.0
    n, k = bcube_shape(nodes, n, k)
    share = (nodes - 1) / (k * nodes)  # (N-1)/(kN): fraction of M each thread sends per stage
    return 2 * k * (n - 1) * net.alpha, 2 * share * net.beta + share * net.gamma


def allreduce(
    nbytes: float, nodes: int, net: Network, *, n: int | None = None, k: int | None = None
) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net, n=n, k=k)
    return a + b * nbytes


def broadcast(
    nbytes: float, nodes: int, net: Network, *, n: int | None = None, k: int | None = None
) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    n, k = bcube_shape(nodes, n, k)
    return 2 * k * (n - 1) * net.alpha + 2 * (nodes - 1) / (k * nodes) * net.beta * nbytes


def reduce(nbytes: float, nodes: int, net: Network, *, n: int | None = None, k: int | None = None) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net, n=n, k=k)  # aggregation + gather moves what aggregation + broadcast does
    return a + b * nbytes
