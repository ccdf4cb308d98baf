"""SyncEASGD single-layer communication: all gradients merged into one all-reduce after the backward pass.

You, Buluc and Demmel, "Scaling deep learning on GPU and Knights Landing clusters" (SC'17), as MG-WFBP
section I and V describe it: no start-up cost but one, and no overlap with the backward pass.
"""

from __future__ import annotations

import time

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, finish, no_opts
from dpcomm.trace.format import Trace

__all__ = ["plan_single"]


def plan_single(trace: Trace, cost: CommCost, nodes: int, **opts) -> Plan:
    """One group holding every layer; it is ready when layer 0's gradient is, at ``t_f + t_b``."""
    t0 = time.perf_counter()
    no_opts("single", opts)
    check_nodes(nodes)
    return finish("single", [trace.num_layers], trace, nodes, t0)
