"""DeAR's schedule in the model: the exact planner against exhaustive search, the simulator against a
reference written in words, the limits, and the plan's kind. No processes; a few seconds."""

from __future__ import annotations

import math
import random

import pytest

from dpcomm.costmodel.base import LinearCost, MeasuredCost
from dpcomm.plan import Plan
from dpcomm.planner import make_plan
from dpcomm.planner.dear import limits, plan_dear, rs_ag_costs
from dpcomm.sim import simulate
from dpcomm.trace.shipped import find_trace
from tests._sim_ref import all_partitions, make_trace


def ref_dear(trace, groups, cost, update_s=0.0):
    """One DeAR iteration, event by event, apart from dpcomm.planner.dear: the all-gathers queue at time 0 in
    forward order, one at a time; a layer's forward starts when the previous layer is done and its group's
    gather has ended; after the forward, backward; a group's reduce-scatter starts when its lowest layer's
    gradient is ready and the previous reduce-scatter (backward order) has ended; then the step."""
    rs, ag = (lambda m: cost(m) / 2), (lambda m: cost(m) / 2)
    fwd = sorted(groups, key=min)
    size = {g: sum(trace.layers[l].params for l in g) * trace.dtype_bytes for g in fwd}
    gathered, t = {}, 0.0
    for g in fwd:
        t += ag(size[g])
        for l in g:
            gathered[l] = t
    t = 0.0
    for l, layer in enumerate(trace.layers):
        t = max(t, gathered[l]) + layer.forward_s
    ready, end = {}, t  # nothing is reduce-scattered before the backward starts
    for l in range(trace.num_layers - 1, -1, -1):
        t += trace.layers[l].backward_s
        ready[l] = t
    for g in reversed(fwd):  # backward order
        end = max(end, ready[min(g)]) + rs(size[g])
    return max(end, t) + update_s


def _random_trace(rng, L):
    return make_trace(
        [rng.uniform(0.0, 2.0) for _ in range(L)],
        [rng.uniform(0.0, 1.0) for _ in range(L)],
        [rng.randint(0, 50) for _ in range(L)],
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_planner_is_exhaustive_search(seed):
    rng = random.Random(seed)
    L = rng.randint(1, 9)
    trace = _random_trace(rng, L)
    if seed % 3 == 2:  # a measured, non-linear cost: the program does not rely on a + b M
        cost = MeasuredCost(((0, 0.0), (10, 1.5), (40, 2.0), (200, 9.0)))
    else:
        cost = LinearCost(rng.uniform(0.0, 2.0), rng.uniform(0.0, 0.2))
    plan = plan_dear(trace, cost, 4)
    every = {tuple(g): ref_dear(trace, g, cost) for g in map(tuple, all_partitions(L))}
    best = min(every.values())
    assert ref_dear(trace, plan.groups, cost) == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert plan.meta["t_iter_s"] == pytest.approx(best, rel=1e-9, abs=1e-12)
    fewest = min(len(g) for g, t in every.items() if t <= best * (1 + 1e-9) + 1e-12)
    assert len(plan.groups) == fewest  # ties: the fewest messages
    assert plan.sharded and plan.schedule == "dear"


def test_the_simulator_is_the_reference_and_names_both_halves():
    trace = find_trace("resnet20-cpu-b32")
    cost = LinearCost(3.7e-3, 124e-9)  # the demo's fitted star:4 at 100 Mbit/s
    plan = make_plan("dear", trace, cost, 4)
    res = simulate(trace, plan, cost, 4, update_s=0.002)
    assert res.t_iter_s == pytest.approx(ref_dear(trace, plan.groups, cost, 0.002), rel=1e-12)
    ops = [ev.op for ev in res.comm]
    assert ops.count("all-gather") == ops.count("reduce-scatter") == len(plan.groups)
    assert {s.name.split()[0] for s in res.spans() if s.row == "comm"} == {"all-gather", "reduce-scatter"}
    # the same groups all-reduced take longer here: the all-gathers hide behind the forward
    as_allreduce = simulate(
        trace, Plan(schedule="x", num_layers=trace.num_layers, groups=plan.groups), cost, 4
    )
    assert res.t_iter_s < as_allreduce.t_iter_s


def test_limits_bound_every_plan_and_dear_gets_past_the_allreduce_one():
    trace = find_trace("resnet20-cpu-b32")
    cost = LinearCost(3.7e-3, 124e-9)
    lim = limits(trace, cost, 4)
    dear = simulate(trace, make_plan("dear", trace, cost, 4), cost, 4)
    optimal = simulate(trace, make_plan("optimal", trace, cost, 4), cost, 4)
    assert lim["dear"] <= dear.t_iter_s and lim["allreduce"] <= optimal.t_iter_s
    assert dear.t_iter_s < lim["allreduce"]  # past the limit of every all-reduce plan
    f = sum(layer.forward_s for layer in trace.layers)
    b = sum(layer.backward_s for layer in trace.layers)
    c = cost(sum(layer.params for layer in trace.layers) * trace.dtype_bytes)
    assert lim["allreduce"] == pytest.approx(f + max(b, c))
    assert lim["dear"] == pytest.approx(max(f, c / 2) + max(b, c / 2))


def test_one_node_communicates_nothing_and_halves_are_halves():
    trace = make_trace([1.0, 2.0], [0.5, 0.5], [10, 10])
    cost = LinearCost(1.0, 0.1)
    res = simulate(trace, make_plan("dear", trace, cost, 1), cost, 1)
    assert res.t_iter_s == pytest.approx(4.0) and res.comm == ()
    rs, ag = rs_ag_costs(cost)
    assert rs(20) == ag(20) == pytest.approx(cost(20) / 2)
    measured = MeasuredCost(((0, 0.0), (100, 4.0)))
    assert rs_ag_costs(measured)[0](50) == pytest.approx(measured(50) / 2)
    assert not math.isnan(rs_ag_costs(measured)[1].many([1.0, 2.0])[1])


def test_a_dear_plan_round_trips_as_plain_data():
    plan = Plan.from_sizes("dear", [2, 1], 3)
    back = Plan.from_dict(plan.to_dict())
    assert back == plan and back.sharded and back.sha256() == plan.sha256()
    assert not Plan.from_sizes("optimal", [2, 1], 3).sharded
