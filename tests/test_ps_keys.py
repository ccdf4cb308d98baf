"""Parameter-server pure parts: keys, the spec's parsing, the PS iteration model, C_i. Budget: ~5 s."""

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.costmodel import PRESETS, Network
from dpcomm.costmodel import ps as ps_cost
from dpcomm.errors import UserError
from dpcomm.planner import make_plan
from dpcomm.planner.pull import plan_pulls
from dpcomm.ps.keys import assign_keys, server_loads
from dpcomm.ps.layout import Layout
from dpcomm.ps.spec import PROBES, PsSpec, parse_ps_schedule, parse_sparsify
from dpcomm.sim.ps import PsCost, ps_inputs, ps_sweep, simulate_ps
from tests._sim_ref import make_trace


@given(numels=st.lists(st.integers(0, 50), min_size=1, max_size=8), servers=st.integers(1, 7))
@settings(max_examples=200, deadline=None)
def test_keys_cover_every_element_once_and_balance_bytes(numels, servers):
    keys = assign_keys(numels, servers)
    for t, n in enumerate(numels):
        pieces = [k for k in keys if k.tensor == t]
        assert [k.shard for k in pieces] == list(range(len(pieces)))
        covered = [i for k in pieces for i in range(k.start, k.stop)]
        assert covered == list(range(n))  # each element once, in order
    loads = server_loads(keys, servers)
    assert max(loads) - min(loads) <= 1 and sum(loads) == sum(numels)
    for t in range(len(numels)):  # striped: every tensor spread over the servers in near-equal pieces
        sizes = [sum(k.numel for k in keys if k.tensor == t and k.server == s) for s in range(servers)]
        assert max(sizes) - min(sizes) <= 1
        assert [k.server for k in keys if k.tensor == t] == sorted(k.server for k in keys if k.tensor == t)
    assert assign_keys(numels, servers) == keys  # a pure function


def test_keys_hand_worked():
    # 12 elements over 3 servers: tensor 0 (6) is 2 + 2 + 2; tensor 2 (5) 2 + 2 + 1, the larger pieces on
    # servers 0 and 1; so tensor 3's one element goes to server 2 (the round-robin goes on): 4 each
    keys = assign_keys([6, 0, 5, 1], 3)
    assert [(k.tensor, k.start, k.stop, k.server) for k in keys] == [
        (0, 0, 2, 0), (0, 2, 4, 1), (0, 4, 6, 2), (2, 0, 2, 0), (2, 2, 4, 1), (2, 4, 5, 2), (3, 0, 1, 2),
    ]  # fmt: skip


def test_layout_messages_are_contiguous_shard_slices():
    lay = Layout(workers=3, servers=2, colocated=False, numels=(6, 2, 5, 1), layer_params=((0, 1), (2, 3)))
    assert lay.world == 5 and lay.server_rank(1) == 4 and lay.server_of(3) == 0 and lay.server_of(1) is None
    for s in range(2):
        whole = lay.shard_slice((0, 1), s)
        a, b = lay.shard_slice((0, 0), s), lay.shard_slice((1, 1), s)
        assert whole == (0, sum(k.numel for k in lay.shard_keys(s)))
        assert (a[1] == b[0] or a == (0, 0) or b == (0, 0)) and (b[1] - b[0]) + (a[1] - a[0]) == whole[1]


@pytest.mark.parametrize(
    "workers,servers,colocated", [(3, 3, True), (5, 5, True), (4, 2, False), (3, 1, False)]
)
def test_servers_send_to_different_workers_at_every_turn(workers, servers, colocated):
    # the shift schedule of an all-to-all: no worker's link carries two servers' slices while another idles
    lay = Layout(workers=workers, servers=servers, colocated=colocated, numels=(8,), layer_params=((0,),))
    orders = [lay.send_order(s) for s in range(servers)]
    assert all(sorted(o) == list(range(workers)) for o in orders)  # every worker, once
    if colocated:
        assert all(o[-1] == s for s, o in enumerate(orders))  # its own worker last (and skipped)
    for turn in range(workers):
        dest = [o[turn] for o in orders]
        assert len(set(dest)) == len(dest), (turn, dest)


def test_spec_parsing_and_errors():
    assert parse_ps_schedule("ps:ibatch") == PsSpec(pull="ibatch")
    spec = parse_ps_schedule("ps:optimal,servers=2,push=single,sparsify=topk:0.01")
    assert spec == PsSpec(pull="optimal", servers=2, push="single", sparsify=0.01)
    assert parse_ps_schedule(spec.label()) == spec
    req = parse_ps_schedule("ps:ibatch,servers=1,pulls=request")
    assert (
        req == PsSpec(pull="ibatch", servers=1, pulls="request")
        and req.label() == "ps:ibatch,servers=1,pulls=request"
    )
    assert parse_ps_schedule("ps:layer,pulls=send").label() == "ps:layer"  # the default is not spelled
    assert parse_sparsify("topk:1") == 1.0 and parse_sparsify(None) is None
    for bad in (
        "ps:greedy",
        "ps:all,servers=0",
        "ps:all,servers=-1",
        "ps:all,sparsify=topk:0",
        "ps:all,sparsify=topk:1.5",
        "ps:all,sparsify=rand:0.1",
        "ps:all,color=red",
        "ps:all,pulls=poll",
        "ps",
    ):
        with pytest.raises(UserError):
            parse_ps_schedule(bad)
    for probe in PROBES:
        assert PsSpec(pull="ibatch", probe=probe).probe == probe
    for field, value, msg in (
        ("probe", "fit", "unknown pull probe 'fit'"),
        ("probe_rounds", 0, "probe rounds"),
    ):
        with pytest.raises(UserError, match=msg):
            PsSpec(pull="ibatch", **{field: value})


# --- the PS iteration model (sim/ps.py) ---------------------------------------------------------------------

NET = Network(name="t", alpha=1e-3, beta=1e-6, gamma=0.0)


def test_colocated_push_then_pull_is_the_p2p_allreduce():
    cost = PsCost(net=NET, workers=5)
    m = 4000.0
    _, Tt, Ts = ps_inputs(make_trace([0.0], [0.0], [1000], 4), cost)
    assert cost.push_s(m) + Ts + float(cost.transfer_s(m)) == pytest.approx(ps_cost.allreduce(m, 5, NET))


def test_dedicated_prices_the_busier_nic():
    cost = PsCost(net=NET, workers=6, servers=2)  # each server sends 3x what a worker receives
    assert cost.startup_s == 6 * NET.alpha
    assert float(cost.transfer_s(1000)) == pytest.approx(3 * 1000 * NET.beta)
    assert PsCost(net=NET, workers=2, servers=4).transfer_s(1000) == pytest.approx(1000 * NET.beta)


def test_one_worker_sends_nothing():
    trace = make_trace([0.1, 0.2], [0.05, 0.1], [1000, 2000], 4)  # backward, forward, params (forward order)
    push = make_plan("wfbp", trace, PsCost(net=NET, workers=1), 1)
    C, Tt, Ts = ps_inputs(trace, PsCost(net=NET, workers=1))
    res = simulate_ps(trace, plan_pulls(C, Tt, Ts, "layer"), push, PsCost(net=NET, workers=1))
    assert res.t_iter_s == pytest.approx(trace.t_f + trace.t_b) and res.speedup == pytest.approx(1.0)


def test_iteration_is_pull_model_then_backward_and_pushes():
    trace = make_trace([0.3, 0.2, 0.4], [0.1, 0.2, 0.1], [3000, 500, 8000], 4)
    cost = PsCost(net=NET, workers=4)
    C, Tt, Ts = ps_inputs(trace, cost)
    for method in ("all", "layer", "ibatch", "optimal"):
        pulls = plan_pulls(C, Tt, Ts, method)
        single = make_plan("single", trace, cost, 4)
        res = simulate_ps(trace, pulls, single, cost)
        # one push after backward: t_iter = F_N + t_b + push(all bytes)
        total = sum(trace.layer_bytes(l) for l in range(3))
        assert res.t_iter_s == pytest.approx(pulls.time_s + trace.t_b + cost.push_s(total))
        pull_ends = [e.end_s for e in res.comm[: pulls.messages]]
        assert pull_ends == sorted(pull_ends)
        for e in res.compute:  # no forward before its batch has arrived
            if e.phase == "forward":
                k = next(i for i, (a, b) in enumerate(pulls.batches) if a <= e.layer <= b)
                assert e.start_s >= pull_ends[k] - 1e-12


def test_sweep_orders_and_optimal_never_loses():
    trace = make_trace([0.01] * 6, [0.005] * 6, [50_000, 200, 90_000, 10, 400_000, 1000], 4)
    rows = ps_sweep(trace, PRESETS["10gbe"], [2, 16], ["ps-all", "ps-layer", "ps-ibatch", "ps-optimal"])
    assert [(r.nodes, r.schedule) for r in rows][:4] == [
        (2, f"ps-{m}") for m in ("all", "layer", "ibatch", "optimal")
    ]
    for n in (2, 16):
        t = {r.schedule: r.t_iter_s for r in rows if r.nodes == n}
        assert t["ps-optimal"] <= min(t.values()) + 1e-12
    with pytest.raises(UserError):
        ps_sweep(trace, PRESETS["10gbe"], [2], ["ps-greedy"])


def test_layer_medians_add_up_to_the_median_forward():
    # three forwards of four layers, each paused 5 ms in a different layer (a preemption, a quota's pause):
    # every layer's own median misses the pause, the forward took 9 ms each time, so the C_i must sum to 9
    from dpcomm.trace.profiler import layer_medians

    runs = [[6.0, 1.0, 1.0, 1.0], [1.0, 6.0, 1.0, 1.0], [1.0, 1.0, 6.0, 1.0]]
    assert [statistics.median(r[i] for r in runs) for i in range(4)] == [1.0] * 4  # the sum of medians: 4
    C = layer_medians(runs)
    assert sum(C) == pytest.approx(9.0) and C == pytest.approx([2.25] * 4)
    assert layer_medians([[0.0, 0.0]]) == [0.0, 0.0]
    one = [[3.0, 1.0], [2.0, 2.0], [5.0, 1.0]]  # totals 4, 4, 6; medians 3 and 1: already 4
    assert layer_medians(one) == pytest.approx([3.0, 1.0])


def test_message_tag_families_never_overlap_and_fit_a_c_int():
    from dpcomm.ps import tags

    ranges = sorted(tags.RANGES.items(), key=lambda kv: kv[1].start)
    for (a, ra), (b, rb) in zip(ranges, ranges[1:], strict=False):
        assert ra.stop <= rb.start, f"tags of {a} {ra} run into {b} {rb}"
    assert ranges[0][1].start > 0 and ranges[-1][1].stop < 2**31
    last = tags.MAX_UNITS - 1
    for k in (0, last):  # every function lands inside its own family's range
        assert tags.push(k, 0) in tags.RANGES["push"] and tags.push(k, 1) in tags.RANGES["push"]
        assert tags.pull(tags.PULL, k) in tags.RANGES["pull"]
        assert tags.request(tags.PULL, k) in tags.RANGES["pull request"]
        assert tags.pull(tags.PROBE, k) in tags.RANGES["probe"]
        assert tags.request(tags.PROBE, k) in tags.RANGES["probe request"]
    assert len({tags.push(g, p) for g in range(50) for p in (0, 1)}) == 100  # no two messages share one
