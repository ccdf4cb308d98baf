"""The simulator: MG-WFBP's timing model on hand-worked numbers, N = 1, update time, zero-parameter layers,
sweeps, and the timeline PNG / Chrome trace / scaling plot it draws. Budget: ~5 s (matplotlib Agg)."""

import json

import pytest

from dpcomm.costmodel import PRESETS, allreduce_cost
from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner import make_plan
from dpcomm.sim import simulate, sweep
from dpcomm.sim.chrome import chrome_trace, write_chrome_trace
from dpcomm.sim.scaling import plot_scaling
from dpcomm.sim.timeline import plot_timeline
from tests._sim_ref import make_trace, ref_t_iter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_hand_worked_iteration():
    # f = [1, 1, 1], b = [2, 1, 3]: t_f = 3; R_2 = 6, R_1 = 7, R_0 = 9. T = 0.5 + 1*M, one-byte layers.
    trace = make_trace([2.0, 1.0, 3.0], [1.0, 1.0, 1.0])
    cost = LinearCost(0.5, 1.0)
    res = simulate(trace, Plan(schedule="x", num_layers=3, groups=((1, 2), (0,))), cost, 4)
    # group (1,2): ready R_1 = 7, 2 bytes -> [7, 9.5]; group (0,): ready 9 -> starts 9.5, ends 11.
    assert [(e.ready_s, e.start_s, e.end_s, e.nbytes) for e in res.comm] == [(7, 7, 9.5, 2), (9, 9.5, 11, 1)]
    assert res.t_iter_s == 11 and res.t_f_s == 3 and res.t_b_s == 6
    assert res.t_comm_s == 4 and res.t_comm_exposed_s == 2
    assert res.speedup == pytest.approx(4 * 9 / 11) and res.efficiency == pytest.approx(9 / 11)
    fwd = [(e.layer, e.start_s, e.end_s) for e in res.compute if e.phase == "forward"]
    bwd = [(e.layer, e.start_s, e.end_s) for e in res.compute if e.phase == "backward"]
    assert fwd == [(0, 0, 1), (1, 1, 2), (2, 2, 3)] and bwd == [(2, 3, 6), (1, 6, 7), (0, 7, 9)]


def test_one_node_has_no_communication_and_update_time_adds():
    trace = make_trace([2.0, 1.0], [1.0, 1.0])
    plan = make_plan("wfbp", trace, LinearCost(5.0, 1.0), 1)
    res = simulate(trace, plan, LinearCost(5.0, 1.0), 1)
    assert res.comm == () and res.t_iter_s == 5 and res.speedup == 1 and res.t_comm_exposed_s == 0
    res = simulate(trace, plan, LinearCost(5.0, 1.0), 2, update_s=0.5)
    assert res.t_iter_s == pytest.approx(ref_t_iter(trace, plan.groups, LinearCost(5.0, 1.0), 0.5))
    assert res.t_comm_exposed_s == pytest.approx(res.t_iter_s - 5.5)
    assert res.speedup == pytest.approx(2 * 5.5 / res.t_iter_s)  # baseline includes the update


def test_zero_parameter_layers_cost_nothing():
    trace = make_trace([1.0, 1.0, 1.0], params=[0, 5, 0])
    res = simulate(trace, make_plan("wfbp", trace, LinearCost(1.0, 0.0), 2), LinearCost(1.0, 0.0), 2)
    assert [e.end_s - e.start_s for e in res.comm] == [0.0, 1.0, 0.0]
    assert res.t_iter_s == 3.0  # layer 1's all-reduce [2, 3] ends with the backward pass
    trace0 = make_trace([1.0, 1.0], params=[0, 0])
    for s in ("wfbp", "single", "mgwfbp", "optimal", "bucket:1"):
        assert (
            simulate(trace0, make_plan(s, trace0, LinearCost(1.0, 1.0), 4), LinearCost(1.0, 1.0), 4).t_iter_s
            == 2
        )


def test_bad_inputs():
    trace = make_trace([1.0, 1.0])
    plan = make_plan("wfbp", trace, LinearCost(1.0, 0.0), 2)
    for call in (
        lambda: simulate(make_trace([1.0] * 3), plan, LinearCost(1.0, 0.0), 2),
        lambda: simulate(trace, plan, LinearCost(1.0, 0.0), 0),
        lambda: simulate(trace, plan, LinearCost(1.0, 0.0), 2, update_s=-1),
    ):
        with pytest.raises(UserError):
            call()


def _trace30():
    import random

    rnd = random.Random(7)
    return make_trace(
        [rnd.uniform(1e-3, 5e-3) for _ in range(30)],
        [rnd.uniform(5e-4, 2e-3) for _ in range(30)],
        [rnd.randint(1000, 3_000_000) for _ in range(30)],
        dtype_bytes=4,
    )


def test_sweep_rows_and_network_costs():
    trace = _trace30()
    net = PRESETS["10gbe"]
    schedules = ["wfbp", "single", "mgwfbp", "optimal"]
    rows = sweep(trace, net, [1, 4, 16], schedules)
    assert [(r.nodes, r.schedule) for r in rows] == [(n, s) for n in (1, 4, 16) for s in schedules]
    for r in rows:
        assert set(r.to_dict()) == {"nodes", "schedule", "t_iter_s", "speedup", "efficiency"}
        cost = allreduce_cost(net, r.nodes)
        assert r.t_iter_s == pytest.approx(
            ref_t_iter(trace, r.plan.groups, cost) if r.nodes > 1 else trace.t_f + trace.t_b
        )
        assert r.efficiency == pytest.approx(r.speedup / r.nodes)
    assert all(r.speedup == pytest.approx(1.0) for r in rows if r.nodes == 1)
    at16 = {r.schedule: r.t_iter_s for r in rows if r.nodes == 16}
    assert at16["optimal"] <= min(at16.values()) + 1e-12
    fixed = sweep(trace, lambda n: LinearCost(1e-3, 1e-9), [2, 8], ["wfbp"])
    assert fixed[0].t_iter_s == pytest.approx(fixed[1].t_iter_s)  # same cost at every N: same time


def test_pictures_and_chrome_trace(tmp_path):
    trace = _trace30()
    rows = sweep(trace, PRESETS["10gbe"], [4, 8], ["wfbp", "bucket:25MB", "optimal"])
    results = [r.result for r in rows if r.nodes == 8]
    for path in (plot_timeline(results, tmp_path / "t.png"), plot_scaling(rows, tmp_path / "s.png")):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    path = write_chrome_trace(results, tmp_path / "c.json")
    obj = json.loads(path.read_text())
    assert obj == json.loads(json.dumps(chrome_trace(results)))
    spans = [e for e in obj["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == sum(2 * trace.num_layers + len(r.comm) for r in results)
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["pid"], int) and e["tid"] in (0, 1)
    comm = [e for e in spans if e["pid"] == 2 and e["tid"] == 1]
    assert [c["args"]["layers"] for c in comm] == [list(g) for g in rows[-1].plan.groups]
    last = max(e["ts"] + e["dur"] for e in comm)
    assert last == pytest.approx(results[2].t_iter_s * 1e6)  # microseconds
    names = {(e["pid"], e["args"]["name"]) for e in obj["traceEvents"] if e["name"] == "process_name"}
    assert names == {(0, "wfbp N=8"), (1, "bucket:25MB N=8"), (2, "optimal N=8")}
