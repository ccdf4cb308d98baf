"""Plan and simulate a trace over node counts and schedules: the rows of a scaling table (MG-WFBP Fig. 9).

``sweep(trace, net_or_cost, [4, 8, 16], ["wfbp", "mgwfbp"])`` plans each schedule with the all-reduce cost
for each node count and simulates it. ``net_or_cost`` is a :class:`Network` (the ``algo`` all-reduce of
:func:`dpcomm.costmodel.allreduce_cost`, or the network's measured table for that node count) or a
callable ``nodes -> CommCost`` (``lambda n: LinearCost(a, b)`` for one fixed cost at every node count).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dpcomm.costmodel import Network, allreduce_cost
from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner import check_nodes, make_plan
from dpcomm.sim.simulator import SimResult, simulate
from dpcomm.trace.format import Trace

__all__ = ["SweepRow", "cost_factory", "sweep"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    """One (nodes, schedule) cell: the plan, its simulation, and the row ``--json`` prints."""

    nodes: int
    schedule: str
    t_iter_s: float
    speedup: float
    efficiency: float
    t_comm_exposed_s: float
    planning_s: float
    plan: Plan
    result: SimResult

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.plan.schedule != self.result.schedule:
            raise ValueError("a sweep row needs nodes >= 1 and a result of its own plan")

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of ``dpcomm simulate --json``."""
        return {
            "nodes": self.nodes,
            "schedule": self.schedule,
            "t_iter_s": self.t_iter_s,
            "speedup": self.speedup,
            "efficiency": self.efficiency,
        }


def cost_factory(
    net_or_cost: Network | Callable[[int], CommCost], algo: str = "ring"
) -> Callable[[int], CommCost]:
    """``nodes -> CommCost`` from a network (its ``algo`` all-reduce), or the factory itself."""
    if isinstance(net_or_cost, Network):
        return lambda nodes: allreduce_cost(net_or_cost, nodes, algo)
    if callable(net_or_cost):
        return net_or_cost
    raise TypeError(f"expected a Network or a nodes -> CommCost callable, got {net_or_cost!r}")


def sweep(
    trace: Trace,
    net_or_cost: Network | Callable[[int], CommCost],
    nodes_list: Iterable[int],
    schedules: Sequence[str],
    update_s: float = 0.0,
    algo: str = "ring",
) -> list[SweepRow]:
    """Rows for every (nodes, schedule), nodes-major, in the order given."""
    factory = cost_factory(net_or_cost, algo)
    rows = []
    for nodes in nodes_list:
        check_nodes(nodes)
        nodes = int(nodes)
        cost = factory(nodes)
        for schedule in schedules:
            plan = make_plan(schedule, trace, cost, nodes)
            res = simulate(trace, plan, cost, nodes, update_s=update_s)
            rows.append(
                SweepRow(
                    nodes=nodes,
                    schedule=schedule,
                    t_iter_s=res.t_iter_s,
                    speedup=res.speedup,
                    efficiency=res.efficiency,
                    t_comm_exposed_s=res.t_comm_exposed_s,
                    planning_s=plan.meta["planning_s"],
                    plan=plan,
                    result=res,
                )
            )
    return rows
