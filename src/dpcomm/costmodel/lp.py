"""Linear-pipeline ("LP") collectives on a chain of ``p`` nodes (LP paper sec. 3.2, Table 1, Theorem 3.1).

Symbols: ``p`` nodes in a chain, ``n = M`` bytes cut into ``n/b`` blocks of ``b`` bytes, ``alpha``, ``beta``,
``gamma``. In each step every node forwards one block to its successor while receiving the next one from its
predecessor, so the pipeline is ``p - 1 + n/b`` steps long; one step costs ``alpha + beta b`` (broadcast) or
``alpha + (beta + gamma) b`` (reduce, the block is summed on arrival). The paper's costs (continuous ``n/b``):

    broadcast: ``(p - 1 + n/b) alpha + (b (p-1) + n) beta``
    reduce:    ``(p - 1 + n/b) alpha + (b (p-1) + n)(beta + gamma)``
    allreduce: ``2 (p - 1 + n/b) alpha + (b (p-1) + n)(2 beta + gamma)``   (reduce, then broadcast)

Each node sends ``n`` bytes (the last sends none in broadcast); ``p - 1 + n/b`` messages on the critical path
per phase.

Optimal block (derived here; the paper only says "b around 64 KB"): with ``c = beta`` (broadcast),
``beta + gamma`` (reduce) or ``beta + gamma/2`` (allreduce), ``dT/db = -n alpha / b^2 + (p-1) c`` (times 2 for
allreduce), zero at ``b* = sqrt(n alpha / ((p-1) c))``, a minimum since ``d2T/db2 = 2 n alpha / b^3 > 0``.
Then ``T(b*) = (p-1) alpha + n c + 2 sqrt((p-1) n alpha c)`` for broadcast and reduce, and
``2 (p-1) alpha + n (2 beta + gamma) + 2 sqrt(2 (p-1) n alpha (2 beta + gamma))`` for allreduce; divided
by ``n`` these tend to ``c`` and ``2 beta + gamma`` as ``n -> inf``, invariant in ``p`` (the paper's remark
after Theorem 3.1). ``b`` is clamped to
``[n / MAX_BLOCKS, n]`` bytes (a block holds at most the message, and a message is cut into at most
:data:`MAX_BLOCKS` blocks: with ``alpha -> 0`` the optimum tends to one byte, and a 1 GiB pipeline of
byte-sized blocks would run for hours in the collective and the flow model alike). A ``block_bytes`` given
to the formulas is priced as given (Theorem 3.1's ratios hold for any ``n/b``); the collective and the flow
model raise it to :func:`least_block` (``n / MAX_BLOCKS``) before they cut a message.
"""

from __future__ import annotations

import math

from dpcomm.costmodel._steps import check, trivial
from dpcomm.costmodel.network import Network
from dpcomm.ops import OPS

__all__ = [
    "MAX_BLOCKS",
    "allreduce",
    "allreduce_ab",
    "broadcast",
    "least_block",
    "lp_optimal_block",
    "reduce",
]

MAX_BLOCKS = 65_536
"""Most pipeline blocks in one LP message (65,536 blocks of the paper's ~64 KB are 4 GiB)."""


def least_block(nbytes: float) -> float:
    """The smallest block (bytes) that cuts ``nbytes`` into at most :data:`MAX_BLOCKS` blocks: 1, or a
    multiple of 8 bytes, so whole elements of any dtype up to 8 bytes still make at most that many."""
    if nbytes <= MAX_BLOCKS:
        return 1.0
    return float(math.ceil(nbytes / (8 * MAX_BLOCKS)) * 8)


def lp_optimal_block(nbytes: float, nodes: int, net: Network, op: str = "allreduce") -> float:
    """Block size ``b*`` (bytes) minimising the LP cost of ``op``: ``sqrt(n alpha / ((p-1) c))`` in [1, n]."""
    check(nbytes, nodes)
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if nodes == 1 or nbytes <= 1:
        return float(nbytes)
    c = {"broadcast": net.beta, "reduce": net.beta + net.gamma, "allreduce": net.beta + net.gamma / 2}[op]
    if c == 0:  # free bandwidth: fewest steps wins, one block
        return float(nbytes)
    b = math.sqrt(nbytes * net.alpha / ((nodes - 1) * c))
    return min(max(b, least_block(nbytes)), float(nbytes))


def _block(nbytes: float, nodes: int, net: Network, op: str, block_bytes: float | None) -> float:
    if block_bytes is None:
        return lp_optimal_block(nbytes, nodes, net, op)
    if not (math.isfinite(block_bytes) and block_bytes > 0):
        raise ValueError(f"block_bytes must be a finite number > 0, got {block_bytes!r}")
    return min(float(block_bytes), float(nbytes))  # a block larger than the message is the message


def broadcast(nbytes: float, nodes: int, net: Network, *, block_bytes: float | None = None) -> float:
    """``(p - 1 + n/b) alpha + (b (p-1) + n) beta``; ``block_bytes=None`` uses :func:`lp_optimal_block`."""
    if trivial(nbytes, nodes):
        return 0.0
    p, n, b = nodes, nbytes, _block(nbytes, nodes, net, "broadcast", block_bytes)
    return (p - 1 + n / b) * net.alpha + (b * (p - 1) + n) * net.beta


def reduce(nbytes: float, nodes: int, net: Network, *, block_bytes: float | None = None) -> float:
    """``(p - 1 + n/b) alpha + (b (p-1) + n)(beta + gamma)``."""
    if trivial(nbytes, nodes):
        return 0.0
    p, n, b = nodes, nbytes, _block(nbytes, nodes, net, "reduce", block_bytes)
    return (p - 1 + n / b) * net.alpha + (b * (p - 1) + n) * (net.beta + net.gamma)


def allreduce(nbytes: float, nodes: int, net: Network, *, block_bytes: float | None = None) -> float:
    """``2 (p - 1 + n/b) alpha + (b (p-1) + n)(2 beta + gamma)``."""
    if trivial(nbytes, nodes):
        return 0.0
    p, n, b = nodes, nbytes, _block(nbytes, nodes, net, "allreduce", block_bytes)
    return 2 * (p - 1 + n / b) * net.alpha + (b * (p - 1) + n) * (2 * net.beta + net.gamma)


def allreduce_ab(nodes: int, net: Network, *, block_bytes: float | None = None) -> tuple[float, float]:
    """``(a, b)`` of the LP allreduce as ``a + b M``.

    With a fixed ``block_bytes = B`` the cost is exactly linear for ``M >= B``:
    ``a = 2 (p-1) alpha + B (p-1)(2 beta + gamma)``, ``b = 2 alpha / B + 2 beta + gamma``.
    With the optimal block (``None``) it is the large-``M`` asymptote ``a = 2 (p-1) alpha``,
    ``b = 2 beta + gamma``: it drops the ``2 sqrt(2 (p-1) M alpha (2 beta + gamma))`` term of ``T(b*)``, so it
    underestimates, by a relative error that falls like ``1/sqrt(M)``.
    """
    p, g = nodes, 2 * net.beta + net.gamma
    if p == 1:
        return 0.0, 0.0
    if block_bytes is None:
        return 2 * (p - 1) * net.alpha, g
    if not (math.isfinite(block_bytes) and block_bytes > 0):
        raise ValueError(f"block_bytes must be a finite number > 0, got {block_bytes!r}")
    return 2 * (p - 1) * net.alpha + block_bytes * (p - 1) * g, 2 * net.alpha / block_bytes + g
