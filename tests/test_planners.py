"""Planners on hand-worked traces (MG-WFBP Fig. 3 cases 1-3, Fig. 4), optimal against exhaustive search,
Algorithm 1 against a line-by-line transcription, and every plan's t_iter against a separate reference.

Budget: ~10 s (hypothesis examples capped; exhaustive search only up to L = 12).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.costmodel.base import LinearCost, MeasuredCost
from dpcomm.errors import UserError
from dpcomm.planner import (
    DDP_BUCKET_BYTES,
    HOROVOD_FUSION_BYTES,
    SCHEDULES,
    make_plan,
    parse_bucket_size,
    parse_schedules,
    plan_mgwfbp,
    plan_optimal,
)
from dpcomm.planner._common import cost_many
from dpcomm.sim import simulate
from tests._sim_ref import all_partitions, make_trace, ref_t_iter

ALL = ["wfbp", "single", "bucket:3", "bucket:25MB", "mgwfbp", "optimal"]


def t_of(trace, schedule, cost, nodes=4):
    plan = make_plan(schedule, trace, cost, nodes)
    return plan, ref_t_iter(trace, plan.groups, cost)


# --- MG-WFBP Fig. 3 and Fig. 4 (paper layers 1..4 are our layers 0..3) -------------------------------------

# One-byte layers, T_ar(M) = a + b*M with a + b = 1 s: every layer's all-reduce lasts tc = 1 s.
FWD = [0.1] * 4  # t_f = 0.4 s


def test_fig3_case1_all_hidden():
    # t_c(l) <= t_b(l-1) for l = 2..4: t_iter = t_f + t_b + t_c(1) (Eq. 11); nothing worth merging.
    trace = make_trace([1.0, 1.5, 1.5, 1.0], FWD)
    cost = LinearCost(0.5, 0.5)
    plan, t = t_of(trace, "wfbp", cost)
    assert t == pytest.approx(0.4 + 5.0 + 1.0)
    assert make_plan("mgwfbp", trace, cost, 4).groups == plan.groups
    assert t_of(trace, "optimal", cost)[1] == pytest.approx(t)  # t_f + t_b + T(p_0) is a lower bound


def test_fig3_case2_hidden_over_two_layers():
    # t_c(4) = 1 > t_b(3) = 0.6 but t_c(4) + t_c(3) = 2 <= t_b(3) + t_b(2) = 2.2: still Eq. 12.
    trace = make_trace([1.2, 1.6, 0.6, 1.0], FWD)
    cost = LinearCost(0.5, 0.5)
    plan, t = t_of(trace, "wfbp", cost)
    assert t == pytest.approx(0.4 + 4.4 + 1.0)
    assert make_plan("mgwfbp", trace, cost, 4).groups == plan.groups
    assert t_of(trace, "optimal", cost)[1] == pytest.approx(t)


def test_fig3_case3_communication_bound():
    # From C = 3 (paper) down, communication is never hidden. Eq. 13 as printed has garbled indices; the
    # timing it describes is t_f + sum_{j >= C} t_b(j) + sum_{j <= C} t_c(j) = 0.4 + 2.2 + 3 = 5.6.
    trace = make_trace([0.7, 0.5, 1.2, 1.0], FWD)
    cost = LinearCost(0.6, 0.4)
    assert t_of(trace, "wfbp", cost)[1] == pytest.approx(5.6)
    # MG-WFBP: paper layer 3 passes tau_b(1) - tau_c(3) = 3.1 - 2.6 = 0.5 < a = 0.6 and merges into layer 2.
    plan, t = t_of(trace, "mgwfbp", cost)
    assert plan.groups == ((3,), (1, 2), (0,)) and plan.meta["merged_layers"] == [2]
    assert t == pytest.approx(5.5)
    # Hand enumeration of all 8 partitions: {3},{2},{1,0} is best at 5.2.
    plan, t = t_of(trace, "optimal", cost)
    assert plan.groups == ((3,), (2,), (0, 1)) and t == pytest.approx(5.2)


def test_fig4_merge_layers_4_and_3():
    # Fig. 4: merging paper layers 4 and 3 lets layer 2's all-reduce end before layer 1's backward does,
    # so t_iter = t_f + t_b + t_c(1) again. tc = 1.1 s per layer, a = 1 s.
    trace = make_trace([1.3, 1.2, 0.5, 0.5], [0.25] * 4)
    cost = LinearCost(1.0, 0.1)
    assert t_of(trace, "wfbp", cost)[1] == pytest.approx(5.9)
    plan = make_plan("mgwfbp", trace, cost, 4)
    assert plan.groups == ((2, 3), (1,), (0,)) and plan.meta["merged_layers"] == [3]
    res = simulate(trace, plan, cost, 4)
    assert res.comm[1].end_s == pytest.approx(4.3) and res.comm[1].end_s < res.comm[2].ready_s == 4.5
    assert res.t_iter_s == pytest.approx(1.0 + 3.5 + 1.1)
    assert t_of(trace, "optimal", cost)[1] == pytest.approx(5.6)


def test_mgwfbp_is_not_always_optimal():
    # The counterexample of the mgwfbp docstring (Theorem 1's proof is a greedy step).
    trace = make_trace([1.0, 0.5, 1.0])
    cost = LinearCost(1.0, 1.0)
    assert t_of(trace, "wfbp", cost)[1] == pytest.approx(7.0)
    plan, t = t_of(trace, "mgwfbp", cost)
    assert plan.groups == ((1, 2), (0,)) and t == pytest.approx(6.5)
    plan, t = t_of(trace, "optimal", cost)
    assert plan.groups == ((2,), (0, 1)) and t == pytest.approx(6.0)


# --- the simple planners ----------------------------------------------------------------------------------


def test_wfbp_single_structure():
    trace = make_trace([1.0] * 5)
    cost = LinearCost(1.0, 0.0)
    assert make_plan("wfbp", trace, cost, 2).groups == ((4,), (3,), (2,), (1,), (0,))
    assert make_plan("single", trace, cost, 2).groups == ((0, 1, 2, 3, 4),)


def test_bucket_closes_at_size():
    trace = make_trace([1.0] * 4, params=[10, 20, 30, 40])
    cost = LinearCost(1.0, 0.0)
    assert make_plan("bucket:50", trace, cost, 2).groups == ((2, 3), (0, 1))
    assert make_plan("bucket:40", trace, cost, 2).groups == ((3,), (1, 2), (0,))
    assert make_plan("bucket:1", trace, cost, 2).groups == make_plan("wfbp", trace, cost, 2).groups
    assert make_plan("bucket:1GB", trace, cost, 2).groups == ((0, 1, 2, 3),)
    assert make_plan("bucket:40", trace, cost, 2).schedule == "bucket:40"


@given(
    params=st.lists(st.integers(0, 100), min_size=1, max_size=15),
    size=st.integers(1, 300),
)
@settings(max_examples=60, deadline=None)
def test_bucket_rule(params, size):
    trace = make_trace([0.1] * len(params), params=params, dtype_bytes=2)
    groups = make_plan(f"bucket:{size}", trace, LinearCost(1.0, 0.0), 2).groups
    for k, g in enumerate(groups):
        held = sum(trace.layer_bytes(l) for l in g)
        without_last = held - trace.layer_bytes(g[0])  # g[0] is the layer added last (lowest index)
        assert without_last < size  # it would have closed one layer earlier
        if k < len(groups) - 1:
            assert held >= size  # only the final group may be short


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("25MB", 25 * 2**20),
        ("128MB", 128 * 2**20),
        ("4KB", 4096),
        ("4096", 4096),
        ("1.5kib", 1536),
        ("2G", 2**31),
    ],
)
def test_parse_size(text, nbytes):
    assert parse_bucket_size(text) == nbytes
    assert DDP_BUCKET_BYTES == parse_bucket_size("25MB") and HOROVOD_FUSION_BYTES == parse_bucket_size(
        "128MB"
    )


@pytest.mark.parametrize("text", ["abc", "0", "-1MB", "5XB", "", "0.1", "MB", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(UserError) as err:
        parse_bucket_size(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "schedule, nodes",
    [("nope", 4), ("bucket", 4), ("bucket:", 4), ("bucket:x", 4), ("wfbp:3", 4), ("wfbp", 0)],
)
def test_make_plan_rejects(schedule, nodes):
    with pytest.raises(UserError) as err:
        make_plan(schedule, make_trace([1.0, 1.0]), LinearCost(1.0, 0.0), nodes)
    assert "\n" not in str(err.value)


def test_registry_and_schedule_list():
    assert set(SCHEDULES) == {"wfbp", "single", "bucket", "ddp", "mgwfbp", "optimal", "dear"}
    assert parse_schedules("wfbp, bucket:25MB,optimal") == ["wfbp", "bucket:25MB", "optimal"]
    for bad in ("", "wfbp,zzz", "bucket:0"):
        with pytest.raises(UserError):
            parse_schedules(bad)


def test_planning_time_recorded():
    trace = make_trace([1.0] * 6)
    for s in ALL:
        plan = make_plan(s, trace, LinearCost(1.0, 0.1), 8)
        assert plan.meta["nodes"] == 8 and 0 <= plan.meta["planning_s"] < 5


# --- properties on random traces --------------------------------------------------------------------------

times = st.floats(0.0, 3.0, allow_nan=False).map(lambda x: round(x, 3))


@st.composite
def traces(draw, max_layers=12, zero_params=True):
    n = draw(st.integers(1, max_layers))
    lo = 0 if zero_params else 1
    params = draw(st.lists(st.integers(lo, 50), min_size=n, max_size=n))
    back = draw(st.lists(times, min_size=n, max_size=n))
    fwd = draw(st.lists(times, min_size=n, max_size=n))
    return make_trace(back, fwd, params)


@st.composite
def costs(draw):
    if draw(st.booleans()):
        return LinearCost(draw(st.floats(0, 3).map(lambda x: round(x, 2))), draw(st.floats(0, 0.2)))
    # a random non-decreasing measured table (not linear, not necessarily sub-additive)
    xs = sorted(draw(st.sets(st.integers(1, 600), min_size=2, max_size=6)))
    steps = draw(st.lists(st.floats(0, 2), min_size=len(xs), max_size=len(xs)))
    return MeasuredCost(points=tuple(zip(xs, np.cumsum(steps).tolist(), strict=True)))


@given(trace=traces(), cost=costs())
@settings(max_examples=70, deadline=None)
def test_optimal_equals_exhaustive_search(trace, cost):
    best = min(ref_t_iter(trace, groups, cost) for groups in all_partitions(trace.num_layers))
    plan = plan_optimal(trace, cost, 4)
    got = ref_t_iter(trace, plan.groups, cost)
    assert got == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert plan.meta["t_iter_s"] == pytest.approx(got, rel=1e-12, abs=1e-12)


@given(trace=traces(max_layers=30), cost=costs())
@settings(max_examples=70, deadline=None)
def test_optimal_never_loses_and_simulator_agrees(trace, cost):
    t_opt = None
    results = {}
    for s in ALL:
        plan = make_plan(s, trace, cost, 4)
        ref = ref_t_iter(trace, plan.groups, cost)
        sim = simulate(trace, plan, cost, 4).t_iter_s
        assert sim == pytest.approx(ref, rel=1e-12, abs=1e-12)  # the simulator is MG-WFBP's timing model
        results[s] = ref
        if s == "optimal":
            t_opt = ref
    for s, t in results.items():
        assert t_opt <= t + 1e-9, s
    # each of MG-WFBP's merges makes its group finish no later (Eq. 28), so it never loses to WFBP
    assert results["mgwfbp"] <= results["wfbp"] + 1e-9


def _algorithm1_as_printed(p, tb, tf, a, T):
    """Algorithm 1, 1-indexed, full CALCULATECOMMSTART after every merge; tau_b[1] and tau_b[0] filled
    by Eq. 6 (the printed line 9 stops at 2; see the mgwfbp docstring)."""
    L = len(p) - 1  # p[1..L]
    p = list(p)
    tc = [0.0] + [T(p[l]) for l in range(1, L + 1)]
    tau_b = [0.0] * (L + 1)
    tau_b[L] = tf
    for l in range(L - 1, 0, -1):
        tau_b[l] = tau_b[l + 1] + tb[l + 1]
    tau_b[0] = tau_b[1] + tb[1]

    def comm_start():
        tau_c = [0.0] * (L + 1)
        tau_c[L] = tau_b[L] + tb[L]
        for l in range(L - 1, 0, -1):
            tau_c[l] = max(tau_c[l + 1] + tc[l + 1], tau_b[l] + tb[l])
        return tau_c

    tau_c = comm_start()
    merged = []
    for l in range(L, 1, -1):
        if tau_b[l - 2] - tau_c[l] < a:
            tc[l] = 0.0
            p[l - 1] = p[l - 1] + p[l]
            tc[l - 1] = T(p[l - 1])
            tau_c = comm_start()
            merged.append(l)
    return merged


@given(trace=traces(max_layers=25, zero_params=False), a=st.floats(0, 2), b=st.floats(0, 0.1))
@settings(max_examples=80, deadline=None)
def test_mgwfbp_matches_printed_algorithm(trace, a, b):
    cost = LinearCost(a, b)
    p = [0] + [trace.layer_bytes(l) for l in range(trace.num_layers)]
    tb = [0.0] + [layer.backward_s for layer in trace.layers]
    merged_paper = _algorithm1_as_printed(p, tb, trace.t_f, a, cost)
    got = plan_mgwfbp(trace, cost, 4).meta["merged_layers"]
    assert [l + 1 for l in got] == merged_paper


def test_mgwfbp_measured_cost_uses_merge_saving():
    # A measured table equal to T = 1 + M on its points: the saving of every merge is a = 1, as linear.
    trace = make_trace([1.0, 0.5, 1.0])
    measured = MeasuredCost(points=((1, 2.0), (2, 3.0), (3, 4.0)))
    assert plan_mgwfbp(trace, measured, 4).groups == plan_mgwfbp(trace, LinearCost(1.0, 1.0), 4).groups
    # A super-additive table (T(2) > 2 T(1)): merging never helps, so nothing is merged.
    steep = MeasuredCost(points=((1, 1.0), (2, 5.0), (3, 9.0)))
    assert plan_mgwfbp(trace, steep, 4).groups == ((2,), (1,), (0,))
    # Forcing the printed test with a constant a merges anyway.
    assert plan_mgwfbp(trace, steep, 4, a=10.0).groups == ((0, 1, 2),)


@given(
    xs=st.lists(st.floats(0, 1e6), min_size=1, max_size=20),
    pts=st.sets(st.integers(0, 10_000), min_size=2, max_size=6),
    lin=st.tuples(st.floats(0, 1), st.floats(0, 1e-3)),
)
@settings(max_examples=60, deadline=None)
def test_vectorised_cost_matches_scalar(xs, pts, lin):
    xs = np.array(xs + [0.0])
    points = tuple((x, 0.001 * x**0.5 + (x % 7)) for x in sorted(pts))
    for cost in (LinearCost(*lin), MeasuredCost(points=points)):
        want = [cost(float(x)) for x in xs]
        got = cost_many(cost, xs)
        assert all(math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-15) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("seed", range(4))
def test_optimal_equals_exhaustive_search_twelve_layers(seed):
    # Hypothesis favours short traces; here L = 12 always (2,048 partitions), costs linear and measured.
    rng = np.random.default_rng(seed)
    trace = make_trace(
        rng.uniform(0, 1, 12).round(3).tolist(),
        rng.uniform(0, 1, 12).tolist(),
        rng.integers(0, 60, 12).tolist(),
    )
    xs = np.sort(rng.choice(np.arange(1, 700), 5, replace=False))
    measured = MeasuredCost(
        points=tuple(zip(xs.tolist(), np.cumsum(rng.uniform(0, 1, 5)).tolist(), strict=True))
    )
    for cost in (LinearCost(float(rng.uniform(0, 2)), float(rng.uniform(0, 0.05))), measured):
        best = min(ref_t_iter(trace, g, cost) for g in all_partitions(12))
        got = ref_t_iter(trace, plan_optimal(trace, cost, 8).groups, cost)
        assert got == pytest.approx(best, rel=1e-12)
        assert best < ref_t_iter(trace, make_plan("wfbp", trace, cost, 8).groups, cost) + 1e-12
