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

Shape: ``N`` must be ``n^k`` with ``n >= 2``. Give ``k`` (and/or ``n``), or leave both out to take the largest
``k <= 4`` that fits (BML sec. 3.1: "the typical value of k is 2~4"), falling back to ``k = 1`` (one switch).
"""

from __future__ import annotations

from dpcomm.costmodel._steps import trivial
from dpcomm.costmodel.network import Network

__all__ = ["allreduce", "allreduce_ab", "bcube_shape", "broadcast", "reduce"]

_MAX_DEFAULT_K = 4  # BML sec. 3.1: k is typically 2..4


def _root(nodes: int, k: int) -> int | None:
    n = round(nodes ** (1.0 / k))
    for cand in (n - 1, n, n + 1):
        if cand >= 2 and cand**k == nodes:
            return cand
    return None


def bcube_shape(nodes: int, *, n: int | None = None, k: int | None = None) -> tuple[int, int]:
    """``(n, k)`` with ``n^k == nodes``: checks a given shape, or picks the largest ``k <= 4`` that fits."""
    if nodes < 2:
        raise ValueError(f"BCube needs at least 2 servers, got {nodes}")
    if k is not None:
        if k < 1:
            raise ValueError(f"BCube level count k must be >= 1, got {k}")
        root = _root(nodes, k)
        if root is None or (n is not None and n != root):
            raise ValueError(f"{nodes} servers is not BCube(n, {k}): need n**{k} == {nodes}")
        return root, k
    if n is not None:
        k, size = 1, n
        while n >= 2 and size < nodes:
            k, size = k + 1, size * n
        if n < 2 or size != nodes:
            raise ValueError(f"{nodes} servers is not a power of n = {n}")
        return n, k
    for k in range(_MAX_DEFAULT_K, 0, -1):
        root = _root(nodes, k)
        if root is not None:
            return root, k
    raise AssertionError("unreachable: k = 1 always fits")


def allreduce_ab(
    nodes: int, net: Network, *, n: int | None = None, k: int | None = None
) -> tuple[float, float]:
    if nodes == 1:
        return 0.0, 0.0
    n, k = bcube_shape(nodes, n=n, k=k)
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
    n, k = bcube_shape(nodes, n=n, k=k)
    return 2 * k * (n - 1) * net.alpha + 2 * (nodes - 1) / (k * nodes) * net.beta * nbytes


def reduce(nbytes: float, nodes: int, net: Network, *, n: int | None = None, k: int | None = None) -> float:
    if trivial(nbytes, nodes):
        return 0.0
    a, b = allreduce_ab(nodes, net, n=n, k=k)  # aggregation + gather moves what aggregation + broadcast does
    return a + b * nbytes
