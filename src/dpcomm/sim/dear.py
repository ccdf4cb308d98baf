"""Trace-driven timing of one iteration of DeAR's schedule: reduce-scatters in backward, all-gathers in the
next forward (:mod:`dpcomm.planner.dear` states the model and its limits).

The iteration starts where the previous step on the shards ended: every group's all-gather is queued then,
in forward order, and each layer's forward waits for its group's. Backward follows the forward; each group
is reduce-scattered once its lowest layer's gradient is ready, in backward order. The step on the shards
(``update_s``) ends it. ``cost`` is the *all-reduce* cost for ``nodes`` nodes; each half costs half of it
(:func:`dpcomm.planner.dear.rs_ag_costs`). The result is a :class:`~dpcomm.sim.SimResult` whose
communication events say which half they are (``op``), so timelines and reports read it as any other.
"""

from __future__ import annotations

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner.dear import dear_times, rs_ag_costs
from dpcomm.sim.simulator import CommEvent, ComputeEvent, SimResult, check_inputs
from dpcomm.trace.format import Trace

__all__ = ["simulate_dear"]


def simulate_dear(trace: Trace, plan: Plan, cost: CommCost, nodes: int, update_s: float = 0.0) -> SimResult:
    """Time one steady iteration of ``plan`` run as DeAR's schedule (module docstring)."""
    nodes = check_inputs(trace, plan, nodes, update_s)
    rs, ag = rs_ag_costs(cost)
    t = dear_times(trace, plan, rs, ag, nodes, update_s)
    layers = trace.layers
    compute = [
        ComputeEvent(layer=l, name=layer.name, phase="forward", start_s=t.layer_starts[l],
                     end_s=t.layer_starts[l] + layer.forward_s)
        for l, layer in enumerate(layers)
    ]  # fmt: skip
    f_end, clock, ready = t.forward_end_s, t.forward_end_s, {}
    for l in range(len(layers) - 1, -1, -1):
        end = clock + layers[l].backward_s
        compute.append(ComputeEvent(layer=l, name=layers[l].name, phase="backward", start_s=clock, end_s=end))
        ready[l] = clock = end
    groups = sorted(plan.groups)  # forward order, as DearTimes lists them
    nbytes = [sum(layers[l].params for l in g) * trace.dtype_bytes for g in groups]
    comm = []
    if nodes > 1:
        for j, g in enumerate(groups):
            a, b = t.gathers[j]
            comm.append(CommEvent(group=j, layers=g, nbytes=nbytes[j], ready_s=0.0, start_s=a, end_s=b,
                                  op="all-gather"))  # fmt: skip
        for j in range(len(groups) - 1, -1, -1):
            a, b = t.scatters[j]
            comm.append(CommEvent(group=j, layers=groups[j], nbytes=nbytes[j], ready_s=ready[groups[j][0]],
                                  start_s=f_end + a, end_s=f_end + b, op="reduce-scatter"))  # fmt: skip
    t_f = sum(layer.forward_s for layer in layers)
    return SimResult.of(plan, nodes, t_f, clock - f_end, update_s, t.t_iter_s, compute, comm)
