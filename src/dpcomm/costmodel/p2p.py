"""Point-to-point message cost, the building block of every collective formula.

``T(M) = alpha + beta*M`` to move ``M`` bytes between two nodes, ``+ gamma*M`` when the receiver also sums
the message into its own buffer (Hockney's model as used by MG-WFBP sec. II-D, "the peer to peer
communication cost is modeled as alpha + beta*M", and the LP paper's Eq. 1, ``T = alpha + beta*n + gamma*n``).
One step, one message, ``M`` bytes on the wire.
"""

from __future__ import annotations

from dpcomm.costmodel._steps import check
from dpcomm.costmodel.network import Network

__all__ = ["p2p"]


def p2p(nbytes: float, net: Network, *, reduce: bool = False) -> float:
    """Seconds to send ``nbytes`` once: ``alpha + beta*M`` (``+ gamma*M`` if ``reduce``). 0 bytes costs 0."""
    check(nbytes, 2)
    if nbytes == 0:
        return 0.0
    return net.alpha + (net.beta + (net.gamma if reduce else 0.0)) * nbytes
