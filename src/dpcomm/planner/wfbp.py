"""WFBP, wait-free backpropagation: every learnable layer is its own all-reduce, sent as soon as it is ready.

MG-WFBP section II-C (Eq. 6-8, Fig. 2); Poseidon (Zhang et al. 2017) and S-Caffe (Awan et al. 2017).
Groups in communication order: ``(L-1,), (L-2,), ..., (0,)``.
"""

from __future__ import annotations

import time

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, finish, no_opts
from dpcomm.trace.format import Trace

__all__ = ["plan_wfbp"]


def plan_wfbp(trace: Trace, cost: CommCost, nodes: int, **opts) -> Plan:
    """One group per layer (the cost model does not change the plan)."""
    t0 = time.perf_counter()
    no_opts("wfbp", opts)
    check_nodes(nodes)
    return finish("wfbp", [1] * trace.num_layers, trace, nodes, t0)
