"""What every planner shares: gradient-ready times, layer bytes, a vectorised cost, and the Plan's meta.

Timing model (MG-WFBP Eq. 6-8 and 19-21, layers 0-indexed here, 1-indexed in the paper): layer
``l``'s gradient is ready at ``R_l = t_f + sum_{j >= l} b_j`` (the paper's ``tau_b^(l) + t_b^(l)``).
"""

from __future__ import annotations

import time
from numbers import Integral
from typing import Any

import numpy as np

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.trace.format import Trace

__all__ = ["check_nodes", "cost_many", "finish", "layer_bytes", "no_opts", "ready_times"]


def ready_times(trace: Trace) -> np.ndarray:
    """``R_l`` for ``l = 0..L-1`` (forward index), seconds: when layer ``l``'s gradient is computed.

    Summed one layer at a time in execution order, as :func:`dpcomm.sim.simulate` does, so a planner's
    predicted ``t_iter`` and the simulator's agree to the last bit.
    """
    t = 0.0
    for layer in trace.layers:
        t += layer.forward_s
    ready = [0.0] * trace.num_layers
    for l in range(trace.num_layers - 1, -1, -1):
        t += trace.layers[l].backward_s
        ready[l] = t
    return np.array(ready)


def layer_bytes(trace: Trace) -> np.ndarray:
    """Gradient bytes per layer (forward index) as float64 (exact below 2**53 bytes)."""
    p = np.fromiter((layer.params for layer in trace.layers), float, trace.num_layers)
    return p * trace.dtype_bytes


def cost_many(cost: CommCost, nbytes: np.ndarray) -> np.ndarray:
    """``cost`` applied to every element of ``nbytes``: the cost's own vectorised ``many(array)`` where it
    has one (:class:`LinearCost`, :class:`MeasuredCost`), else one call per element."""
    m = np.asarray(nbytes, dtype=float)
    many = getattr(cost, "many", None)
    if callable(many):
        return np.asarray(many(m), dtype=float)
    flat = m.ravel()
    return np.fromiter((cost(float(x)) for x in flat), float, flat.size).reshape(m.shape)


def check_nodes(nodes: int) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, Integral) or nodes < 1:
        raise UserError(f"nodes must be an integer >= 1, got {nodes!r}")


def no_opts(name: str, opts: dict[str, Any]) -> None:
    if opts:
        raise TypeError(f"planner {name} takes no options, got {sorted(opts)}")


def finish(
    schedule: str, sizes_backward: list[int], trace: Trace, nodes: int, t0: float, **meta: Any
) -> Plan:
    """A Plan from group sizes in communication order; ``meta`` gets nodes and ``planning_s``."""
    planning_s = time.perf_counter() - t0
    return Plan.from_sizes(
        schedule, sizes_backward, trace.num_layers, nodes=int(nodes), planning_s=planning_s, **meta
    )
