"""Communication cost models (alpha-beta-gamma) of MG-WFBP Table II, the LP paper's Table 1 and BML sec. 3.2.

Every collective cost is a pure function of the message size M (bytes), the node count and a
:class:`Network`; :func:`allreduce_linear` reduces an algorithm to ``T_ar(M) = a + b*M`` (MG-WFBP Eq. 9).
Measuring a real allreduce: :mod:`dpcomm.costmodel.calibrate` (``calibrate(CalibrateOptions(nproc=P))``).
"""

from dpcomm.costmodel.base import CommCost, LinearCost, MeasuredCost
from dpcomm.costmodel.collective import (
    ALGORITHMS,
    Algorithm,
    allreduce_cost,
    allreduce_linear,
    collective_cost,
)
from dpcomm.costmodel.lp import lp_optimal_block
from dpcomm.costmodel.network import (
    NETWORK_FORMAT,
    PRESETS,
    Network,
    load_network,
    network_from_dict,
    resolve_network,
    save_network,
)
from dpcomm.costmodel.p2p import p2p

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "allreduce_cost",
    "allreduce_linear",
    "collective_cost",
    "lp_optimal_block",
    "p2p",
    "NETWORK_FORMAT",
    "PRESETS",
    "CommCost",
    "LinearCost",
    "MeasuredCost",
    "Network",
    "load_network",
    "network_from_dict",
    "resolve_network",
    "save_network",
]
