"""HSDP plans: the model's all-reduce across replicas (hand-worked), the exact optimum against exhaustive
search, the choice of the shard group, the sharded state in the budget, one-line errors.

Budget: ~5 s (exhaustive search up to 9 modules).
"""

import itertools
import math

import numpy as np
import pytest

from dpcomm.costmodel import PRESETS
from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.planner import fsdp_optimal
from dpcomm.planner.fsdp import OVERLAPS, FsdpPlan, Modules, fsdp_time, peak_memory, plan_fsdp
from dpcomm.planner.fsdp_search import Problem, root_bound, search
from dpcomm.planner.hsdp import mesh_costs, plan_hsdp, shard_sizes


def all_units(L):
    for cuts in itertools.product((False, True), repeat=L - 1):
        out, first = [], 0
        for i, cut in enumerate(cuts):
            if cut:
                out.append((first, i))
                first = i + 1
        out.append((first, L - 1))
        yield out


def exhaustive(f, b, m, ag, rs, ar, M, D=2, overlap="streams"):
    """(time, peak) of the best HSDP plan by brute force over partitions, depths 0..D and reshard."""
    best = None
    for units in all_units(len(f)):
        for d in range(D + 1):
            for r in (True, False):
                peak = peak_memory(units, m, depth=d, reshard=r)
                if peak > M:
                    continue
                t = fsdp_time(units, f, b, m, ag, rs, depth=d, reshard=r, overlap=overlap, ar_cost=ar)
                tie = 1e-12 * best[0] if best else 0.0
                if best is None or t < best[0] - tie or (t <= best[0] + tie and peak < best[1]):
                    best = (t, peak)
    return best


def mods(f, b, m):
    return Modules(forward_s=f, backward_s=b, param_bytes=m)


F2, B2, M2 = [1.0, 1.0], [2.0, 2.0], [10, 10]
AG, RS, AR = LinearCost(0.5, 0.1), LinearCost(0.0, 0.1), LinearCost(0.0, 0.2)  # 10 bytes: 1.5, 1, 2 s


def test_all_reduce_after_each_reduce_scatter_hand_worked():
    # forward: gather 0-1.5, f 1.5-2.5, gather 2.5-4, f 4-5; backward without reshard: unit 2's b 5-7,
    # reduce-scatter 7-8, all-reduce 8-10; unit 1's b 7-9, reduce-scatter 9-10, all-reduce 10-12
    units = [(0, 0), (1, 1)]
    t = fsdp_time(units, F2, B2, M2, AG, RS, depth=0, reshard=False, ar_cost=AR, detail=True)
    assert t == {"t_iter": 12.0, "forward_end": 5.0, "backward_end": 9.0, "reduce_scatter_end": 12.0}
    assert fsdp_time(units, F2, B2, M2, AG, RS, depth=0, reshard=False) == 10.0  # FSDP: RS ends at 10
    # on CPU both block the thread: b 5-7, RS 7-8, AR 8-10, b 10-12, RS 12-13, AR 13-15
    t = fsdp_time(units, F2, B2, M2, AG, RS, depth=0, reshard=False, overlap="gathers", ar_cost=AR)
    assert t == 15.0


def _instance(rng, L):
    f = rng.uniform(0, 1, L).round(2)
    b = rng.uniform(0, 2, L).round(2)
    m = rng.integers(0, 10, L)
    costs = [LinearCost(float(rng.uniform(0, 0.5)), float(rng.uniform(0, 0.3))) for _ in range(3)]
    return f, b, m, *costs


@pytest.mark.parametrize("seed", range(8))
def test_hsdp_optimal_equals_exhaustive_search(seed):
    rng = np.random.default_rng(500 + seed)
    L = [1, 3, 5, 6, 7, 8, 8, 9][seed]
    f, b, m, ag, rs, ar = _instance(rng, L)
    overlap = OVERLAPS[seed % 2]
    for M in (None, int(rng.integers(m.max(), m.sum() + 1)), int(m.max())):
        p = plan_fsdp("optimal", mods(f, b, m), ag, rs, memory=M, overlap=overlap, ar_cost=ar, gap=0)
        t, peak = exhaustive(f, b, m, ag, rs, ar, math.inf if M is None else M, overlap=overlap)
        assert p.time_s == pytest.approx(t, rel=1e-9, abs=1e-12) and p.peak_bytes == peak
        assert p.meta["dp_time_s"] == pytest.approx(p.time_s, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_hsdp_bound_through_capped_passes(monkeypatch, seed):
    # one state per module: the all-reduce's bounds certify, exact and within a gap
    monkeypatch.setattr(fsdp_optimal, "_WIDTH", 1)
    rng = np.random.default_rng(600 + seed)
    f, b, m, ag, rs, ar = _instance(rng, [6, 7, 8, 8, 9, 9][seed])
    overlap = OVERLAPS[seed % 2]
    for M in (None, int(rng.integers(m.max(), m.sum() + 1))):
        t, peak = exhaustive(f, b, m, ag, rs, ar, math.inf if M is None else M, overlap=overlap)
        p = plan_fsdp("optimal", mods(f, b, m), ag, rs, memory=M, overlap=overlap, ar_cost=ar, gap=0)
        assert p.time_s == pytest.approx(t, rel=1e-9, abs=1e-12) and p.peak_bytes == peak
        q = plan_fsdp("optimal", mods(f, b, m), ag, rs, memory=M, overlap=overlap, ar_cost=ar, gap=0.05)
        lb = q.meta["lower_bound_s"]
        assert lb <= t * (1 + 1e-9) <= q.time_s * (1 + 2e-9) and q.time_s <= lb * 1.05 * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_hsdp_bounds_hold_where_the_all_reduce_dominates(seed):
    # each (depth, reshard) run: the empty prefix's bound and a capped search's bound <= its optimum
    rng = np.random.default_rng(700 + seed)
    f, b, m, ag, rs, _ = _instance(rng, 8)
    ar = LinearCost(float(rng.uniform(0, 0.5)), float(rng.uniform(0.5, 1.0)))  # slower than the rest
    M = [math.inf, float(m.sum() // 2)][seed % 2]
    blocking = seed >= 4
    prob = Problem.of(f, b, m, ag, rs, memory=M, update_s=0.0, blocking=blocking, ar=ar)
    for d in range(3):
        for r in (True, False):
            best = _run_optimum(f, b, m, ag, rs, ar, M, d, r, OVERLAPS[blocking])
            got = search(prob, d, r, ub=math.inf, width=1)
            if best is None:
                assert got.units is None
                continue
            assert root_bound(prob, d, r) <= best * (1 + 1e-9)
            assert got.bound <= best * (1 + 1e-9) <= got.time_s * (1 + 2e-9)


@pytest.mark.parametrize("blocking", [False, True])
def test_hsdp_bound_is_tight_where_only_the_all_reduce_counts(blocking):
    # compute and in-group collectives nearly free, the all-reduce 1 s per byte: every plan takes about
    # sum(m) seconds, and the bounds must say so without passing it
    rng = np.random.default_rng(8)
    f, b, m = np.full(7, 1e-3), np.full(7, 2e-3), rng.integers(1, 10, 7)
    ag = rs = LinearCost(1e-3, 1e-3)
    ar = LinearCost(0.0, 1.0)
    prob = Problem.of(f, b, m, ag, rs, memory=math.inf, update_s=0.0, blocking=blocking, ar=ar)
    for d in range(3):
        for r in (True, False):
            best = _run_optimum(f, b, m, ag, rs, ar, math.inf, d, r, OVERLAPS[blocking])
            assert m.sum() <= best <= m.sum() * 1.01
            assert m.sum() <= root_bound(prob, d, r) <= best * (1 + 1e-9)
            assert search(prob, d, r, ub=math.inf, width=1).bound <= best * (1 + 1e-9)


def _run_optimum(f, b, m, ag, rs, ar, M, d, r, overlap):
    times = [
        fsdp_time(u, f, b, m, ag, rs, depth=d, reshard=r, overlap=overlap, ar_cost=ar)
        for u in all_units(len(f))
        if peak_memory(u, m, depth=d, reshard=r) <= M
    ]
    return min(times) if times else None


def test_mesh_costs_and_group_sizes():
    net = PRESETS["10gbe"]
    ag, rs, ar = mesh_costs(net, 8, 2)  # 4 groups of 2 ranks
    assert ag.a == pytest.approx(net.alpha) and ag.b == pytest.approx(net.beta / 2) and rs == ag
    assert ar.a == pytest.approx(6 * net.alpha) and ar.b == pytest.approx(3 / 4 * 2 * net.beta / 2)
    assert mesh_costs(net, 8, 8)[2](1e9) == 0.0  # one group: FSDP, nothing to all-reduce
    assert mesh_costs(net, 8, 1)[0](1e9) == 0.0  # groups of one: nothing to gather (DDP-like)
    assert shard_sizes(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(UserError, match="^HSDP shard group of 3 ranks does not divide 8 ranks$"):
        mesh_costs(net, 8, 3)
    with pytest.raises(UserError, match="^HSDP shard group of 3 ranks does not divide 8 ranks$"):
        plan_hsdp("optimal", mods(F2, B2, M2), net, world=8, shards=[2, 3])


def test_plan_hsdp_is_the_fastest_shard_group():
    rng = np.random.default_rng(7)
    f = rng.uniform(0, 0.01, 8)
    b = 2 * f
    m = rng.integers(1 << 20, 8 << 20, 8)
    net = PRESETS["10gbe"]
    best = plan_hsdp("optimal", mods(f, b, m), net, world=16, gap=0)
    times = {}
    for G in (1, 2, 4, 8, 16):
        ag, rs, ar = mesh_costs(net, 16, G)
        times[G] = plan_fsdp("optimal", mods(f, b, m), ag, rs, ar_cost=ar, gap=0).time_s
    assert best.shard_group == min(times, key=times.get) and best.time_s == min(times.values())
    planned, bounds = best.meta["hsdp"]["times_s"], best.meta["hsdp"]["bounds_s"]
    for G, t in times.items():  # each group size planned, or skipped by a bound its plans cannot beat
        assert bounds[G] <= t * (1 + 1e-9)
        if planned[G] is None:
            assert bounds[G] > best.time_s
        else:
            assert planned[G] == pytest.approx(t, rel=1e-12)
    assert best.meta["lower_bound_s"] == pytest.approx(best.time_s, rel=1e-12)  # exact over every G
    assert best.meta["gap"] == 0.0
    assert FsdpPlan.from_dict(best.to_dict()) == best and best.to_dict()["shard_group"] == best.shard_group


def test_sharded_state_in_the_budget_and_one_line_errors():
    f, b, m = [1e-3] * 4, [2e-3] * 4, [100] * 4
    net = PRESETS["10gbe"]
    free = plan_hsdp("optimal", mods(f, b, m), net, world=8)
    # a state of 800 bytes: groups of G ranks hold 800 / G of it; 400 bytes per rank leave groups of 4, 8
    tight = plan_hsdp("optimal", mods(f, b, m), net, world=8, memory=400, state_bytes=800)
    assert tight.shard_group in (4, 8) and tight.peak_bytes + 800 / tight.shard_group <= 400
    assert tight.meta["hsdp"]["times_s"][1] is None and tight.meta["hsdp"]["times_s"][2] is None
    assert free.time_s <= tight.time_s
    with pytest.raises(UserError) as e:
        plan_hsdp("optimal", mods(f, b, m), net, world=8, memory=150, state_bytes=800)
    assert (
        str(e.value)
        == "no optimal HSDP plan fits 150 bytes; the smallest needs 200 bytes (8 ranks per group)"
    )
    # an FSDP plan's identity (and hash) has no shard group
    assert "shard_group" not in plan_fsdp("whole", mods(f, b, m), *mesh_costs(net, 8, 8)[:2]).to_dict()
