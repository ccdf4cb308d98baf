"""Pull plans (the iBatch paper's model, Algorithms 1-2, and the exact DP) and the gradient planner's ties.

Budget: ~10 s (exhaustive search up to 10 layers).
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.costmodel import PRESETS, allreduce_cost
from dpcomm.errors import UserError
from dpcomm.planner import make_plan
from dpcomm.planner.pull import (
    CONFIRM_REL,
    IBATCH_MARGIN,
    IBATCH_MARGIN_DEDICATED,
    PULL_METHODS,
    SLOWDOWN_MAX,
    SLOWDOWN_NOISE,
    PullPlan,
    confirm_plan,
    fit_slowdown,
    ibatch_forward,
    ibatch_margin,
    plan_pulls,
    pull_time,
)
from dpcomm.sim import simulate
from tests._sim_ref import all_partitions, make_trace, ref_t_iter


def all_batchings(L):
    """Every split of layers 0..L-1 into consecutive batches (2**(L-1) of them)."""
    for cuts in itertools.product((False, True), repeat=L - 1):
        out, first = [], 0
        for i, cut in enumerate(cuts):
            if cut:
                out.append((first, i))
                first = i + 1
        out.append((first, L - 1))
        yield out


def timeline(batches, C, T, Ts, d=0.0):
    """The model by events, written apart from pull_time: pulls back to back, forwards in order; with a
    slowdown ``d``, a forward running before the last pull's end runs ``1 + d`` times slower until then."""
    last_pull = len(batches) * Ts + sum(T)
    link_free, compute_free = 0.0, 0.0
    for a, b in batches:
        link_free = link_free + Ts + sum(T[a : b + 1])
        start, work = max(compute_free, link_free), sum(C[a : b + 1])
        slow_work = max(0.0, last_pull - start) / (1 + d)  # work done at the slow rate before the last pull
        if work <= slow_work:
            compute_free = start + work * (1 + d)
        else:
            compute_free = max(start, last_pull) + work - slow_work
    return compute_free


# --- hand-worked --------------------------------------------------------------------------------------------

C3, T3, TS3 = [1.0, 2.0, 3.0], [2.0, 1.0, 4.0], 0.5


def test_all_hand_worked():
    # one pull of 0.5 + 7 s, then 6 s of forward
    p = plan_pulls(C3, T3, TS3, "all")
    assert p.batches == ((0, 2),) and p.time_s == 13.5 and p.messages == 1


def test_layer_hand_worked():
    # pulls end at 2.5, 4.0, 8.5; forwards: 2.5-3.5, 4.0-6.0, 8.5-11.5
    p = plan_pulls(C3, T3, TS3, "layer")
    assert p.batches == ((0, 0), (1, 1), (2, 2)) and p.time_s == 11.5


def test_eq4_when_eq5_holds():
    # every later pull outlasts the forward before it: F_N = EXE1 + EXE2 + EXE3 (paper Eq. 1-4)
    C, T, Ts = [1.0, 1.0, 1.0, 1.0], [1.0, 3.0, 3.0, 3.0], 0.5
    batches = [(0, 0), (1, 2), (3, 3)]
    exe1 = Ts + T[0]
    exe2 = 2 * Ts + sum(T[1:])
    exe3 = C[3]
    assert pull_time(batches, C, T, Ts) == exe1 + exe2 + exe3


# --- the paper's worked example (Fig. 4(c)) -----------------------------------------------------------------

# The paper prints Fig. 3's per-layer times of GoogLeNet only as bars, not as numbers, so these 12 units are
# ours, shaped as the text describes them: convolutions whose forward outlasts their pull (unit 2: 8 vs 2),
# a fully-connected unit 11 whose pull (11) dwarfs its forward (1). Times in ms, Ts = 1 ms.
FIG4_C = [2, 8, 2, 4, 7, 8, 3, 5, 2, 3, 1, 1]
FIG4_T = [3, 2, 3, 1, 2, 6, 6, 3, 5, 3, 11, 2]


def test_ibatch_reproduces_fig4c():
    # Algorithm 1 by hand: l_1 = 5 is the last layer with Ts + Tt(l_1+1..12) > C(1..l_1) (37 > 23, and at 6:
    # 31 > 31 fails); l_2 = 10 is the first with Ts + Tt(6..l_2) > C(1..5) = 23 (24); batch 3's pull
    # (1 + 13) cannot cover C(6..10) = 21 at any l_3, so the rest is one batch. Model: 59 ms.
    assert ibatch_forward(FIG4_C, FIG4_T, 1) == [(0, 4), (5, 9), (10, 11)]
    p = plan_pulls(FIG4_C, FIG4_T, 1, "ibatch")
    assert p.meta["algorithm"] == "forward"
    paper = [(1, 5), (6, 10), (11, 12)]  # "[[1, 5], [6, 10], [11, 12]]", 1-based
    assert [(a + 1, b + 1) for a, b in p.batches] == paper
    assert p.time_s == timeline(p.batches, FIG4_C, FIG4_T, 1) == 59
    t_all, t_layer = (plan_pulls(FIG4_C, FIG4_T, 1, m).time_s for m in ("all", "layer"))
    assert p.time_s < min(t_all, t_layer)  # Fig. 4: iBatch ahead of both
    assert plan_pulls(FIG4_C, FIG4_T, 1, "optimal").time_s <= p.time_s


def test_ibatch_keeps_a_greedy_plan_only_for_a_gain_above_the_margin():
    # Fig. 4(c): Algorithm 1 gains 1.7% over layer by layer (59 against 60 ms)
    for margin, kept in [
        (0.0, "forward"),
        (0.01, "forward"),
        (0.016, "forward"),
        (0.017, "layer"),
        (0.5, "layer"),
    ]:
        p = plan_pulls(FIG4_C, FIG4_T, 1, "ibatch", margin=margin)
        assert p.meta["algorithm"] == kept, margin
        assert p.time_s == (59 if kept == "forward" else 60)
    assert plan_pulls(FIG4_C, FIG4_T, 1, "ibatch").meta["margin"] == IBATCH_MARGIN == 0.01
    # a greedy plan that ties the better baseline is no bet: the tie rule keeps the fewest pulls. GoogLeNet
    # (K80 trace) on 16 co-located workers: Algorithm 2 takes as long as layer by layer, in fewer pulls
    from dpcomm.sim.ps import PsCost, ps_inputs
    from dpcomm.trace import find_trace

    C, T, Ts = ps_inputs(find_trace("googlenet-k80-b64"), PsCost(net=PRESETS["10gbe"], workers=16))
    p = plan_pulls(C, T, Ts, "ibatch")
    times = p.meta["candidates_s"]
    assert times["backward"] == pytest.approx(times["layer"], rel=1e-12) and times["forward"] > times["layer"]
    assert p.meta["algorithm"] == "backward" and p.messages < len(C)
    for margin in (-0.1, 1.0, float("nan")):
        with pytest.raises(UserError, match="margin"):
            plan_pulls(FIG4_C, FIG4_T, 1, "ibatch", margin=margin)


def test_dedicated_servers_that_send_to_several_workers_take_the_larger_margin(capsys):
    assert IBATCH_MARGIN_DEDICATED == 0.05 and IBATCH_MARGIN == 0.01
    for workers, servers, margin in [(3, 0, 0.01), (1, 1, 0.01), (2, 2, 0.05), (3, 4, 0.05), (2, 1, 0.05)]:
        assert ibatch_margin(workers, servers) == margin, (workers, servers)
    # the runtime, `dpcomm plan` and `dpcomm simulate` plan with the placement's margin
    from dpcomm.cli.main import main
    from dpcomm.sim.ps import PsCost, ps_inputs, ps_sweep
    from dpcomm.trace import find_trace

    for servers, shown in [(0, "more than 1% faster"), (1, "more than 5% faster")]:
        argv = ["plan", "--trace", "googlenet-k80-b64", "--nodes", "4", "--pull", "ibatch"]
        assert main([*argv, "--ps-servers", str(servers)]) == 0
        assert shown in " ".join(capsys.readouterr().out.split())
    trace = find_trace("googlenet-k80-b64")
    for servers in (0, 1):
        row = ps_sweep(trace, PRESETS["10gbe"], [4], ["ps-ibatch"], servers=servers)[0]
        C, T, Ts = ps_inputs(trace, PsCost(net=PRESETS["10gbe"], workers=4, servers=servers))
        want = plan_pulls(C, T, Ts, "ibatch", margin=ibatch_margin(4, servers))
        assert row.plan.meta["pulls"].batches == want.batches and want.meta["margin"] == (
            0.05 if servers else 0.01
        )


# --- optimal against exhaustive search ----------------------------------------------------------------------

times = st.lists(st.integers(0, 20).map(lambda x: x / 4), min_size=1, max_size=9)


@given(C=times, T=times, Ts=st.integers(0, 12).map(lambda x: x / 4), seed=st.integers(0, 3))
@settings(max_examples=150, deadline=None)
def test_optimal_equals_exhaustive_search(C, T, Ts, seed):
    L = min(len(C), len(T))
    C, T = C[:L], T[:L]
    if seed:  # also irrational-looking floats, where ties are rare
        rng = np.random.default_rng(seed)
        C = (np.array(C) + rng.uniform(0, 1, L)).tolist()
    every = [(timeline(b, C, T, Ts), len(b)) for b in all_batchings(L)]
    best = min(t for t, _ in every)
    fewest = min(n for t, n in every if t <= best + 1e-9)
    p = plan_pulls(C, T, Ts, "optimal")
    assert p.time_s == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert p.time_s == pytest.approx(timeline(p.batches, C, T, Ts), rel=1e-12, abs=1e-12)
    assert p.messages == fewest  # ties go to the fewest pulls
    for m in ("all", "layer", "ibatch"):
        assert p.time_s <= plan_pulls(C, T, Ts, m).time_s + 1e-9


@given(
    C=times,
    T=times,
    Ts=st.integers(0, 12).map(lambda x: x / 4),
    d=st.sampled_from([0.25, 0.5, 1.0, 3.0]),
    seed=st.integers(0, 2),
)
@settings(max_examples=150, deadline=None)
def test_optimal_with_a_slowdown_equals_exhaustive_search(C, T, Ts, d, seed):
    L = min(len(C), len(T))
    C, T = C[:L], T[:L]
    if seed:
        C = (np.array(C) + np.random.default_rng(seed).uniform(0, 1, L)).tolist()
    every = [(timeline(b, C, T, Ts, d), len(b)) for b in all_batchings(L)]
    best = min(t for t, _ in every)
    fewest = min(n for t, n in every if t <= best * (1 + 1e-12) + 1e-12)
    p = plan_pulls(C, T, Ts, "optimal", slowdown=d)
    assert p.time_s == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert p.time_s == pytest.approx(timeline(p.batches, C, T, Ts, d), rel=1e-12, abs=1e-12)
    assert p.messages == fewest
    for m in ("all", "layer", "ibatch"):
        q = plan_pulls(C, T, Ts, m, slowdown=d)
        assert q.time_s == pytest.approx(timeline(q.batches, C, T, Ts, d), rel=1e-12, abs=1e-12)
        assert p.time_s <= q.time_s + 1e-9


def test_a_slowdown_costs_overlap_only():
    # `all` starts its forward when every pull is in: nothing to slow. `layer` here: pulls end at 2.5, 4, 8.5;
    # with d = 1 the forward does half speed until 8.5: 2.5-4.5 (layer 0), 4.5-8.5 (2 s of layer 1's 2),
    # then layer 2 at full speed from 8.5 to 11.5 -- the same as d = 0, since layer 2 waits for its pull
    assert plan_pulls(C3, T3, TS3, "all", slowdown=1.0).time_s == 13.5
    assert plan_pulls(C3, T3, TS3, "layer", slowdown=1.0).time_s == 11.5
    # cheaper pulls: end at 1, 2, 3 (Ts 0, T 1 each); d = 1: layer 0 runs 1-3 at half speed, then the last
    # pull is in, so layer 1 runs 3-5 and layer 2 5-8 at full speed (d = 0: 1-2, 2-4, 4-7)
    assert pull_time([(0, 0), (1, 1), (2, 2)], C3, [1.0, 1.0, 1.0], 0.0, slowdown=1.0) == 8.0
    assert pull_time([(0, 0), (1, 1), (2, 2)], C3, [1.0, 1.0, 1.0], 0.0) == 7.0
    with pytest.raises(UserError, match="slowdown"):
        plan_pulls(C3, T3, TS3, "optimal", slowdown=-0.5)


def test_fit_slowdown_recovers_the_slowdown_that_made_a_measurement():
    rng = np.random.default_rng(7)
    C, T = rng.uniform(0.2, 1.0, 12), rng.uniform(0.05, 0.3, 12)  # pulls hide partly under the forward
    layer = [(i, i) for i in range(12)]
    for d in (0.3, 1.5):  # gaps well above SLOWDOWN_NOISE here
        measured = pull_time(layer, C, T, 0.01, slowdown=d)
        assert fit_slowdown(layer, C, T, 0.01, measured) == pytest.approx(d, abs=2e-4)
    assert fit_slowdown(layer, C, T, 0.01, 0.5 * pull_time(layer, C, T, 0.01)) == 0.0  # faster than d = 0
    assert fit_slowdown(layer, C, T, 0.01, (1 + SLOWDOWN_NOISE) * pull_time(layer, C, T, 0.01)) == 0.0
    assert fit_slowdown(layer, C, T, 0.01, (1 + 2 * SLOWDOWN_NOISE) * pull_time(layer, C, T, 0.01)) > 0
    assert fit_slowdown(layer, C, T, 0.01, 1e6) == SLOWDOWN_MAX  # capped
    assert fit_slowdown(layer, C, T, 0.01, float("nan")) == 0.0  # nothing measured
    # `all` never overlaps: no d explains a gap, so none is fitted (not the cap)
    assert fit_slowdown([(0, 11)], C, T, 0.01, 1.5 * pull_time([(0, 11)], C, T, 0.01)) == 0.0


def test_confirm_keeps_a_plan_its_probe_confirms_and_falls_back_to_the_better_baseline_otherwise():
    C, T, Ts = [1.0, 1.0, 1.0], [1.0, 1.0, 4.0], 0.5
    p = plan_pulls(C, T, Ts, "optimal")  # two batches, 8.0 s; all 9.0, layer 8.5
    assert p.messages == 2 and p.time_s == 8.0
    kept = confirm_plan(p, C, T, Ts, (1 + CONFIRM_REL) * 8.0)  # at the threshold: kept
    assert kept == p and kept.meta["confirmed"] and kept.meta["probe_model_s"] == 8.0
    assert kept.meta["dp_time_s"] == p.meta["dp_time_s"]  # the plan's own facts stay
    gone = confirm_plan(p, C, T, Ts, (1 + CONFIRM_REL) * 8.0 * 1.001)
    assert not gone.meta["confirmed"] and gone.method == "optimal" and gone.meta["algorithm"] == "layer"
    assert gone.batches == plan_pulls(C, T, Ts, "layer").batches and gone.time_s == 8.5
    assert gone.meta["refuted_batches"] == [[0, 1], [2, 2]] and gone.meta["probe_s"] > 8.8
    # all and layer tie here (3 s each, every pull 1 s, no forward): a refuted two-batch plan gets all
    two = PullPlan(method="ibatch", num_layers=3, batches=[(0, 0), (1, 2)])
    assert confirm_plan(two, [0.0] * 3, [1.0] * 3, 0.0, 99.0).batches == ((0, 2),)
    # a baseline is kept whatever its probe says: there is nothing better to fall back to
    for m in ("all", "layer"):
        b = plan_pulls(C, T, Ts, m)
        assert confirm_plan(b, C, T, Ts, 10 * b.time_s).batches == b.batches
    assert confirm_plan(p, C, T, Ts, float("nan")).meta["confirmed"]  # nothing measured: kept


@given(C=times, T=times, Ts=st.integers(0, 12).map(lambda x: x / 4))
@settings(max_examples=100, deadline=None)
def test_every_method_covers_every_layer_and_reports_its_model_time(C, T, Ts):
    L = min(len(C), len(T))
    C, T = C[:L], T[:L]
    for m in PULL_METHODS:
        p = plan_pulls(C, T, Ts, m)
        assert [i for a, b in p.batches for i in range(a, b + 1)] == list(range(L))
        assert p.time_s == pytest.approx(timeline(p.batches, C, T, Ts), rel=1e-12, abs=1e-12)
        assert PullPlan.from_dict(p.to_dict()) == p and PullPlan.from_dict(p.to_dict()).sha256() == p.sha256()
    ib = plan_pulls(C, T, Ts, "ibatch")
    times = ib.meta["candidates_s"]
    base = min(times["all"], times["layer"])
    greedy = min(times["forward"], times["backward"])
    # a greedy plan only for a gain above the margin (or a tie, in fewer pulls), else the better of all, layer
    assert ib.time_s == pytest.approx(greedy if greedy < (1 - IBATCH_MARGIN) * base else base, rel=1e-12)
    if ib.meta["algorithm"] in ("forward", "backward"):
        assert greedy < (1 - IBATCH_MARGIN) * base or greedy == pytest.approx(base, rel=1e-12)
    assert ib.time_s <= min(plan_pulls(C, T, Ts, m).time_s for m in ("all", "layer"))
    assert plan_pulls(C, T, Ts, "ibatch", margin=0).time_s == min(times.values())


def test_bad_input_is_a_user_error():
    with pytest.raises(UserError, match="unknown pull method"):
        plan_pulls([1.0], [1.0], 0.0, "greedy")
    with pytest.raises(UserError, match="one forward and one transfer"):
        plan_pulls([1.0, 2.0], [1.0], 0.0, "all")
    with pytest.raises(UserError, match=">= 0"):
        plan_pulls([1.0], [-1.0], 0.0, "all")
    with pytest.raises(ValueError):
        PullPlan(method="all", num_layers=3, batches=[(0, 1)])


# --- ties in the gradient planner ---------------------------------------------------------------------------


def test_gradient_optimal_prefers_fewest_groups_googlenet_k80_64():
    from dpcomm.trace.analytic import analytic_trace

    trace = analytic_trace("googlenet", 64, "k80")
    cost = allreduce_cost(PRESETS["10gbe"], 64)
    mg = make_plan("mgwfbp", trace, cost, 64)
    opt = make_plan("optimal", trace, cost, 64)
    t_mg = simulate(trace, mg, cost, 64).t_iter_s
    t_opt = simulate(trace, opt, cost, 64).t_iter_s
    assert t_opt <= t_mg * (1 + 1e-12)
    assert len(opt.groups) <= len(mg.groups)  # was 19 against MG-WFBP's 11 at the same time


@pytest.mark.parametrize("seed", range(6))
def test_gradient_optimal_fewest_groups_exhaustive(seed):
    rng = np.random.default_rng(seed)
    L = 9
    # integer times and a linear cost make exact ties common
    trace = make_trace(
        rng.integers(0, 3, L).astype(float).tolist(), rng.integers(0, 3, L).astype(float).tolist(),
        rng.integers(0, 4, L).tolist(),
    )  # fmt: skip
    from dpcomm.costmodel.base import LinearCost

    cost = LinearCost(float(rng.integers(0, 3)), 1.0)
    every = [(ref_t_iter(trace, g, cost), len(g)) for g in all_partitions(L)]
    best = min(t for t, _ in every)
    fewest = min(n for t, n in every if t <= best + 1e-9)
    plan = make_plan("optimal", trace, cost, 4)
    assert ref_t_iter(trace, plan.groups, cost) == pytest.approx(best)
    assert len(plan.groups) == fewest


# --- CLI ----------------------------------------------------------------------------------------------------


def test_cli_plan_pull(capsys):
    import json

    from dpcomm.cli.main import main
    from dpcomm.sim.ps import PsCost, ps_inputs
    from dpcomm.trace import find_trace

    assert main(["plan", "--trace", "googlenet-k80-b64", "--nodes", "16", "--pull", "ibatch", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    C, T, Ts = ps_inputs(find_trace("googlenet-k80-b64"), PsCost(net=PRESETS["10gbe"], workers=16))
    want = plan_pulls(C, T, Ts, "ibatch")
    assert [tuple(b) for b in out["batches"]] == list(want.batches) and out["time_s"] == want.time_s
    # with a slowdown the exact DP is O(L^3) in pure Python: a 39-layer trace keeps the fast tier fast
    argv = ["plan", "--trace", "resnet20-cpu-b32", "--nodes", "16", "--pull", "optimal", "--json"]
    assert main([*argv, "--pull-slowdown", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    C, T, Ts = ps_inputs(find_trace("resnet20-cpu-b32"), PsCost(net=PRESETS["10gbe"], workers=16))
    want = plan_pulls(C, T, Ts, "optimal", slowdown=0.5)
    assert [tuple(b) for b in out["batches"]] == list(want.batches) and out["time_s"] == want.time_s
    assert out["slowdown"] == 0.5 and want.time_s > plan_pulls(C, T, Ts, "optimal").time_s
    bad_args = (
        ["--pull", "greedy"],
        ["--pull", "all", "--ps-servers", "-1"],
        ["--pull", "all", "--pull-slowdown", "-1"],
        ["--pull-slowdown", "1"],
    )
    for bad in bad_args:
        assert main(["plan", "--trace", "googlenet-k80-b64", "--nodes", "4", *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dpcomm: error:")
