"""Cost models: every formula against a hand-worked value, the papers' figures and theorems, the LP optimal
block against a grid search, the linear/measured forms the planners use, and bad network files.

Budget: pure functions, no processes; about 5 s with hypothesis.
"""

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.costmodel import (
    ALGORITHMS,
    PRESETS,
    LinearCost,
    MeasuredCost,
    Network,
    allreduce_cost,
    allreduce_linear,
    collective_cost,
    load_network,
    lp_optimal_block,
    p2p,
    resolve_network,
)
from dpcomm.costmodel import lp as lp_mod
from dpcomm.errors import UserError
from dpcomm.ops import OPS

# Round numbers for hand arithmetic: at M = 1000 bytes, alpha = 1, beta*M = 10, gamma*M = 1.
NET = Network(name="hand", alpha=1.0, beta=0.01, gamma=0.001)
M = 1000.0
TEN_GBE = PRESETS["10gbe"]


def cost(op, algo, nodes, nbytes=M, net=NET, **opts):
    return collective_cost(op, algo, nbytes, nodes, net, **opts)


# --- MG-WFBP sec. V: the 10GbE ring start-ups ------------------------------------------------------------


@pytest.mark.parametrize("nodes, startup_us", [(2, 90.52), (4, 271.56), (8, 633.64)])
def test_10gbe_ring_startups_match_mgwfbp(nodes, startup_us):
    # 2(N-1) * 45.26 us = 2*1*45.26 = 90.52, 2*3*45.26 = 271.56, 2*7*45.26 = 633.64
    lin = allreduce_linear("ring", nodes, TEN_GBE)
    assert lin.a * 1e6 == pytest.approx(startup_us, abs=1e-9)
    assert allreduce_cost(TEN_GBE, nodes).a == lin.a
    # b = 2(N-1)/N * 0.8 ns/byte (gamma = 0): 0.8, 1.2, 1.4 ns/byte
    assert lin.b == pytest.approx(2 * (nodes - 1) / nodes * 0.8e-9, rel=1e-12)


# --- every formula against a hand-worked value -------------------------------------------------------------

HAND = [
    # p2p: 1 + 10 (+ 1 when summed)
    # ring, N = 4: 2*3*1 + 2*3/4*10 (= 15) + 3/4*1 (= 0.75)
    ("allreduce", "ring", 4, {}, 21.75),
    ("broadcast", "ring", 4, {}, 21.0),  # 6 + 15
    ("reduce", "ring", 4, {}, 21.75),
    ("allreduce", "ring", 5, {}, 24.8),  # 2*4 + 2*4/5*10 (16) + 4/5 (0.8)
    # binary tree, N = 8: h = 3; allreduce 2*3*1 + 3*(2*10 + 1) = 6 + 63
    ("allreduce", "binary_tree", 8, {}, 69.0),
    ("broadcast", "binary_tree", 8, {}, 33.0),  # 3*(1 + 10)
    ("reduce", "binary_tree", 8, {}, 36.0),  # 3*(1 + 10 + 1)
    ("allreduce", "binary_tree", 6, {}, 46.0),  # h = floor(log2 6) = 2: 4 + 2*21
    # recursive doubling, N = 8: 3*(1 + 10 + 1) = 36
    ("allreduce", "recursive_doubling", 8, {}, 36.0),
    # N = 6: P' = 4, 2*(1 + 11) = 24, fold in 1 + 11 = 12, out 1 + 10 = 11: 47
    ("allreduce", "recursive_doubling", 6, {}, 47.0),
    ("broadcast", "recursive_doubling", 6, {}, 33.0),  # binomial: ceil(log2 6) = 3 rounds of 1 + 10
    # BE (Rabenseifner), N = 8: 2*3*1 + 2*7/8*10 (17.5) + 7/8*1 (0.875)
    ("allreduce", "be", 8, {}, 24.375),
    ("reduce", "be", 8, {}, 24.375),
    ("broadcast", "be", 8, {}, 27.5),  # (3 + 7)*1 + 17.5
    # BE non-power-of-two N = 6: P' = 4: 2*2 + 2*3/4*10 + 3/4 = 19.75; fold in 12, fold out 11
    ("allreduce", "be", 6, {}, 42.75),
    ("reduce", "be", 6, {}, 31.75),  # 19.75 + 12 (no fold out: the result stays on the root)
    ("broadcast", "be", 6, {}, 8 + 50 / 3),  # (ceil(log2 6) + 5)*1 + 2*5/6*10
    # MST, N = 8: d = 3; 3*(2 + 20 + 1) = 69; N = 5: d = ceil(log2 5) = 3, same
    ("allreduce", "mst", 8, {}, 69.0),
    ("allreduce", "mst", 5, {}, 69.0),
    ("broadcast", "mst", 8, {}, 33.0),
    ("reduce", "mst", 8, {}, 36.0),
    # LP, N = 4, b = 100: p - 1 + n/b = 3 + 10 = 13 steps; b(p-1) + n = 1300 bytes
    ("broadcast", "lp", 4, {"block_bytes": 100}, 26.0),  # 13*1 + 1300*0.01
    ("reduce", "lp", 4, {"block_bytes": 100}, 27.3),  # 13 + 1300*0.011
    ("allreduce", "lp", 4, {"block_bytes": 100}, 53.3),  # 2*13 + 1300*0.021
    ("broadcast", "lp", 4, {"block_bytes": 5000}, 4 + 40),  # b > n: one block, (3 + 1)*1 + (3000 + 1000)*0.01
    # BCube(3, 2), N = 9: 2*2*(3-1)*1 = 8; 2*8/18*10 = 80/9; 8/18*1 = 4/9
    ("allreduce", "bcube", 9, {}, 8 + 80 / 9 + 4 / 9),
    ("broadcast", "bcube", 9, {}, 8 + 80 / 9),
    ("reduce", "bcube", 9, {}, 8 + 80 / 9 + 4 / 9),
    # BCube(2, 3), N = 8: 2*3*1*1 = 6; 2*7/24*10 = 70/12; 7/24
    ("allreduce", "bcube", 8, {"k": 3}, 6 + 70 / 12 + 7 / 24),
    # P2P PS, N = 4: 2*3*1 + 2*3/4*10 + 3/4*1
    ("allreduce", "ps", 4, {}, 21.75),
    ("broadcast", "ps", 4, {}, 21.0),
    ("reduce", "ps", 4, {}, 21.75),
    # native = ring (allreduce), mst (broadcast, reduce)
    ("allreduce", "native", 4, {}, 21.75),
    ("broadcast", "native", 8, {}, 33.0),
]


@pytest.mark.parametrize("op, algo, nodes, opts, want", HAND)
def test_formula_hand_worked(op, algo, nodes, opts, want):
    assert cost(op, algo, nodes, **opts) == pytest.approx(want, rel=1e-12)


def test_p2p_hand_worked():
    assert p2p(M, NET) == pytest.approx(11.0)  # 1 + 0.01*1000
    assert p2p(M, NET, reduce=True) == pytest.approx(12.0)  # + 0.001*1000
    assert p2p(0, NET) == 0.0


def test_lp_optimal_block_hand_worked():
    # allreduce, p = 4: b* = sqrt(2 n alpha / ((p-1)(2 beta + gamma))) = sqrt(2000 / 0.063) = 178.174...
    assert lp_optimal_block(M, 4, NET) == pytest.approx(math.sqrt(2000 / 0.063), rel=1e-12)
    # broadcast: sqrt(n alpha / ((p-1) beta)) = sqrt(1000 / 0.03) = 182.57...
    assert lp_optimal_block(M, 4, NET, "broadcast") == pytest.approx(math.sqrt(1000 / 0.03), rel=1e-12)
    # T(b*) for allreduce = 2(p-1) alpha + n(2 beta + gamma) + 2 sqrt(2 (p-1) n alpha (2 beta + gamma))
    #                     = 6 + 21 + 2 sqrt(6 * 1000 * 0.021) = 27 + 2 sqrt(126)
    assert cost("allreduce", "lp", 4) == pytest.approx(27 + 2 * math.sqrt(126), rel=1e-12)


def test_bml_bcube32_gst_is_16_tc():
    # BML sec. 3.2: BCube(3,2) GST = 16 T_C = 16/18 T_F with T_F = beta M;
    # the P2P PS takes 2(N-1)/N T_F, k = 2 times as long
    net = Network(name="bw-only", alpha=0.0, beta=1e-9)
    t_f = 1e-9 * M
    assert cost("allreduce", "bcube", 9, net=net) == pytest.approx(16 / 18 * t_f, rel=1e-12)
    assert cost("allreduce", "ps", 9, net=net) == pytest.approx(2 * cost("allreduce", "bcube", 9, net=net))


def test_bcube_prices_the_shape_the_algorithm_runs():
    # one shape rule (dpcomm.topology.bcube_shape): P = 64 is BCube(2,6), not BCube(4,3)
    assert cost("allreduce", "bcube", 64) == pytest.approx(
        cost("allreduce", "bcube", 64, n=2, k=6), rel=1e-15
    )
    assert cost("allreduce", "bcube", 64) < cost("allreduce", "bcube", 64, n=4, k=3)
    with pytest.raises(UserError, match="got 6"):
        cost("allreduce", "bcube", 6)  # no n^k with k >= 2
    # k = 1 (one switch, asked for) is the ring/PS cost exactly
    assert cost("allreduce", "bcube", 6, k=1) == pytest.approx(cost("allreduce", "ring", 6), rel=1e-12)


def test_one_node_or_zero_bytes_costs_nothing():
    for name in ALGORITHMS:
        for op in OPS:
            assert cost(op, name, 1) == 0.0
            assert cost(op, name, 4, nbytes=0) == 0.0
        assert allreduce_cost(NET, 1, name)(M) == 0.0


def test_registry_names_and_bad_names():
    assert {"ring", "lp", "mst", "be", "bcube", "ps", "native"} <= set(ALGORITHMS)
    assert ALGORITHMS["binary_tree"].cost_only and ALGORITHMS["recursive_doubling"].cost_only
    assert all(a.source for a in ALGORITHMS.values())
    with pytest.raises(UserError, match="unknown algorithm 'nope'"):
        cost("allreduce", "nope", 4)
    with pytest.raises(UserError, match="unknown collective"):
        cost("gather", "ring", 4)
    with pytest.raises(UserError, match="block_bytes"):
        cost("allreduce", "ring", 4, block_bytes=10)
    with pytest.raises(ValueError):
        cost("allreduce", "ring", 0)
    with pytest.raises(ValueError):
        cost("allreduce", "ring", 4, nbytes=-1)


# --- LP paper Theorem 3.1 ----------------------------------------------------------------------------------

POW2 = st.sampled_from([2, 4, 8, 16, 32, 64])
SIZES = st.floats(min_value=1e3, max_value=1e10)
NETS = st.builds(
    lambda a, b, g: Network(name="h", alpha=a, beta=b, gamma=g),
    st.floats(0, 1e-4),
    st.floats(1e-11, 1e-8),
    st.floats(0, 1e-9),
)


@settings(max_examples=200, deadline=None)
@given(p=POW2, n=SIZES, net=NETS, op=st.sampled_from(["broadcast", "reduce"]))
def test_theorem_3_1_bounds_hold_for_every_size(p, n, net, op):
    # Theorem 3.1: LP is up to 2x faster than BE and up to log p faster than MST (broadcast, reduce).
    t_lp = cost(op, "lp", p, nbytes=n, net=net)
    assert cost(op, "be", p, nbytes=n, net=net) / t_lp < 2
    assert cost(op, "mst", p, nbytes=n, net=net) / t_lp <= math.log2(p) * (1 + 1e-12)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_theorem_3_1_eq2_eq3_with_fixed_block(p):
    # alpha -> 0, gamma -> 0: Eq. 2 BE/LP = 2(1 - 1/p) / (1 + b(p-1)/n);
    # Eq. 3 MST/LP = log p / (b(p-1)/n + 1); both rise with n towards 2(1 - 1/p) < 2 and log p.
    net, b = Network(name="a0", alpha=0.0, beta=1e-9), 65536.0
    prev_be = prev_mst = 0.0
    for n in [2.0**e for e in range(16, 41, 2)]:
        t_lp = cost("broadcast", "lp", p, nbytes=n, net=net, block_bytes=b)
        be_ratio = cost("broadcast", "be", p, nbytes=n, net=net) / t_lp
        mst_ratio = cost("broadcast", "mst", p, nbytes=n, net=net) / t_lp
        assert be_ratio == pytest.approx(2 * (1 - 1 / p) / (1 + b * (p - 1) / n), rel=1e-12)
        assert mst_ratio == pytest.approx(math.log2(p) / (b * (p - 1) / n + 1), rel=1e-12)
        assert prev_be < be_ratio < 2 and prev_mst < mst_ratio <= math.log2(p)
        prev_be, prev_mst = be_ratio, mst_ratio
    assert prev_be == pytest.approx(2 * (1 - 1 / p), rel=1e-4)
    assert prev_mst == pytest.approx(math.log2(p), rel=1e-4)


@pytest.mark.parametrize("p", [4, 8, 16])
def test_theorem_3_1_limits_on_10gbe_with_optimal_block(p):
    # With alpha > 0 and the optimal block the ratios still approach 2(1 - 1/p) and log p as n grows.
    # (LP's allreduce is reduce + broadcast, so it tends to p/(p-1) times BE's, not 1/2: BE/LP -> 1 - 1/p.)
    n = 1e15
    lp_b = cost("broadcast", "lp", p, nbytes=n, net=TEN_GBE)
    assert cost("broadcast", "be", p, nbytes=n, net=TEN_GBE) / lp_b == pytest.approx(
        2 * (1 - 1 / p), rel=1e-3
    )
    assert cost("broadcast", "mst", p, nbytes=n, net=TEN_GBE) / lp_b == pytest.approx(math.log2(p), rel=1e-3)
    lp_r = cost("allreduce", "lp", p, nbytes=n, net=TEN_GBE)
    assert cost("allreduce", "mst", p, nbytes=n, net=TEN_GBE) / lp_r == pytest.approx(math.log2(p), rel=1e-3)
    assert cost("allreduce", "be", p, nbytes=n, net=TEN_GBE) / lp_r == pytest.approx(1 - 1 / p, rel=1e-3)


# --- LP optimal block against a grid search ----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(2, 64),
    n=st.floats(1e4, 1e9),
    net=NETS,
    op=st.sampled_from(["broadcast", "reduce", "allreduce"]),
)
def test_lp_optimal_block_beats_a_grid(p, n, net, op):
    f = getattr(lp_mod, op)
    b_star = lp_optimal_block(n, p, net, op)
    best = f(n, p, net, block_bytes=b_star)
    least = lp_mod.least_block(n)  # the optimum is over blocks that cut n into <= MAX_BLOCKS blocks
    grid = [max(least, n ** (i / 400)) for i in range(401)]  # least .. n bytes, geometric
    costs = [f(n, p, net, block_bytes=b) for b in grid]
    assert best <= min(costs) * (1 + 1e-12)
    i = costs.index(min(costs))
    if (
        net.alpha > 0 and 0 < i < len(grid) - 1 and grid[i - 1] > least
    ):  # interior minimum: b* lies between the grid neighbours
        assert grid[i - 1] <= b_star <= grid[i + 1]


# --- the linear and measured forms the planners use --------------------------------------------------------


@pytest.mark.parametrize("algo", [a for a in ALGORITHMS if a != "lp"])
@pytest.mark.parametrize("nodes", [2, 3, 4, 5, 6, 7, 8, 9, 16])
def test_allreduce_linear_is_exact_except_lp(algo, nodes):
    opts = {"k": 1} if algo == "bcube" and nodes not in (4, 8, 9, 16) else {}  # one switch unless n^k
    lin = allreduce_linear(algo, nodes, TEN_GBE, **opts)
    for n in (1.0, 4096.0, 1e6, 1e9):
        got = cost("allreduce", algo, nodes, nbytes=n, net=TEN_GBE, **opts)
        assert lin(n) == pytest.approx(got, rel=1e-12)


@pytest.mark.parametrize("nodes", [2, 4, 8, 64])
def test_allreduce_linear_lp_is_the_large_m_form(nodes):
    lin = allreduce_linear("lp", nodes, TEN_GBE)
    assert lin.a == pytest.approx(2 * (nodes - 1) * TEN_GBE.alpha) and lin.b == pytest.approx(
        2 * TEN_GBE.beta
    )
    g = 2 * TEN_GBE.beta  # 2 beta + gamma
    errs = []
    for n in (1e6, 1e8, 1e10, 1e12):
        full = cost("allreduce", "lp", nodes, nbytes=n, net=TEN_GBE)
        dropped = 2 * math.sqrt(2 * (nodes - 1) * n * TEN_GBE.alpha * g)  # T(b*) - (a + b M)
        assert full - lin(n) == pytest.approx(dropped, rel=1e-9)
        errs.append((full - lin(n)) / full)
    # the relative error falls, for large M like 1/sqrt(M): 10x per 100x of M
    assert errs == sorted(errs, reverse=True) and 9 < errs[-2] / errs[-1] <= 10 + 1e-9
    # with a fixed block the form is exact for M >= block
    fixed = allreduce_linear("lp", nodes, TEN_GBE, block_bytes=65536)
    for n in (65536.0, 1e7, 1e9):
        want = cost("allreduce", "lp", nodes, nbytes=n, net=TEN_GBE, block_bytes=65536)
        assert fixed(n) == pytest.approx(want, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    algo=st.sampled_from(sorted(ALGORITHMS)),
    op=st.sampled_from(OPS),
    nodes=st.integers(1, 40),
    m1=st.floats(0, 1e9),
    m2=st.floats(0, 1e9),
)
def test_costs_are_non_decreasing_in_size(algo, op, nodes, m1, m2):
    lo, hi = sorted((m1, m2))
    opts = {"k": 1} if algo == "bcube" else {}  # any node count is one switch; n^k shapes are tested apart
    low, high = (cost(op, algo, nodes, nbytes=m, net=TEN_GBE, **opts) for m in (lo, hi))
    assert low <= high * (1 + 1e-12)


def test_measured_table_is_used_when_present():
    table = ((4096.0, 1e-4), (1048576.0, 2e-3), (16777216.0, 3e-2))
    net = Network(name="m", alpha=1e-5, beta=1e-9, allreduce_tables={4: table})
    got = allreduce_cost(net, 4, "ring")
    assert isinstance(got, MeasuredCost) and got(1048576.0) == 2e-3
    assert got(4096.0 + (1048576.0 - 4096.0) / 2) == pytest.approx((1e-4 + 2e-3) / 2)  # interpolated
    assert isinstance(allreduce_cost(net, 8, "ring"), LinearCost)  # no table for 8 nodes
    assert allreduce_cost(net, 4, "ring", measured=False) == allreduce_linear("ring", 4, net)
    assert allreduce_cost(net, 8, "bcube", k=3) == allreduce_linear("bcube", 8, net, k=3)


# --- presets and network files -----------------------------------------------------------------------------


def test_presets_have_sources_and_line_rate_beta():
    assert {"10gbe", "25gbe", "40gbe-roce", "100gb-ib"} <= set(PRESETS)
    for name, net in PRESETS.items():
        gbps = int(re.match(r"\d+", name).group())
        assert 8 / net.beta / 1e9 == pytest.approx(gbps)  # beta = 8 bits / line rate
        assert net.source and 0 < net.alpha < 1e-3
    assert PRESETS["10gbe"].alpha == 45.26e-6 and PRESETS["10gbe"].beta == 0.8e-9
    assert resolve_network("25gbe") is PRESETS["25gbe"]


def _good_network() -> dict:
    return {
        "format": "dpcomm-network/1",
        "alpha_s": 4.526e-05,
        "beta_s_per_byte": 8e-10,
        "gamma_s_per_byte": 0.0,
        "allreduce_tables": {"2": [[4096, 1e-4], [65536, 5e-4]]},
    }


def test_network_file_round_trip(tmp_path):
    p = tmp_path / "net.json"
    p.write_text(json.dumps(_good_network()))
    net = resolve_network(str(p))
    assert net.alpha == 4.526e-05 and net.allreduce_tables == {2: ((4096.0, 1e-4), (65536.0, 5e-4))}
    assert isinstance(allreduce_cost(net, 2), MeasuredCost)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("alpha_s"), "alpha_s"),
        (lambda d: d.update(beta_s_per_byte=-1e-9), "beta_s_per_byte"),
        (lambda d: d.update(gamma_s_per_byte="x"), "gamma_s_per_byte"),
        (lambda d: d.update(format="dpcomm-network/0"), "format"),
        (lambda d: d.pop("format"), "format"),
        (lambda d: d.update(allreduce_tables={"2": [[4096, 1e-4]]}), "allreduce_tables.2"),
        (lambda d: d.update(allreduce_tables={"2": [[4096, 1e-4], [8192, -1]]}), "allreduce_tables.2[1]"),
        (lambda d: d.update(allreduce_tables={"two": [[1, 1], [2, 2]]}), "allreduce_tables.two"),
        (lambda d: d.update(allreduce_tables=[1, 2]), "allreduce_tables"),
    ],
)
def test_bad_network_file_names_file_and_field(tmp_path, mutate, field):
    d = _good_network()
    mutate(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    for reader in (load_network, lambda path: resolve_network(str(path))):
        with pytest.raises(UserError) as exc:
            reader(p)
        msg = str(exc.value)
        assert str(p) in msg and f"'{field}'" in msg and "\n" not in msg


def test_bad_json_and_unknown_names(tmp_path):
    p = tmp_path / "net.json"
    p.write_text('{"format": "dpcomm-network/1", "alpha_s": ')
    with pytest.raises(UserError, match=re.escape(str(p)) + ": not valid JSON"):
        load_network(p)
    with pytest.raises(UserError, match="no such file"):
        resolve_network(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="unknown network 'ethernet'"):
        resolve_network("ethernet")


def test_numpy_numbers_are_accepted():
    # planners hand over numpy sizes and counts: the same cost as plain Python numbers
    np = pytest.importorskip("numpy")
    for name in ALGORITHMS:
        assert cost("reduce", name, np.int64(8), nbytes=np.int64(1000)) == cost("reduce", name, 8)
        assert allreduce_linear(name, np.int64(8), NET) == allreduce_linear(name, 8, NET)


def test_lp_blocks_are_bounded():
    # alpha -> 0 sends the optimum towards one byte: a 1 GiB message would be 2**30 pipeline stages
    net = Network(name="a0", alpha=0.0, beta=1e-9)
    for n in (1.0, 4096.0, float(lp_mod.MAX_BLOCKS), 2.0**30, 1e15):
        b = lp_optimal_block(n, 8, net, "allreduce")
        assert b >= lp_mod.least_block(n) and math.ceil(n / b) <= lp_mod.MAX_BLOCKS
    assert lp_mod.least_block(2.0**30) == 2**30 / lp_mod.MAX_BLOCKS and lp_mod.least_block(100.0) == 1.0
