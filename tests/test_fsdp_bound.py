"""The rest of an FSDP plan bounded with its start-ups (:mod:`dpcomm.planner.fsdp_bound`): never above what
a completion costs (exhaustive search over every partition, depth and reshard choice), the exact planner
still equal to exhaustive search where the bound is in force (every module holding bytes, ``R >= A'``), and
on a long model whose collectives dominate it proves the optimum from the empty prefix (the old bound,
blind to start-ups, left every prefix below it and widened its beam pass after pass)."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest

from dpcomm.costmodel.base import LinearCost
from dpcomm.planner.fsdp import Modules, fsdp_time, peak_memory, plan_fsdp
from dpcomm.planner.fsdp_bound import suffix_bound
from dpcomm.planner.fsdp_state import Problem


def _instance(rng, L):
    f = rng.uniform(0, 1, L).round(2)
    b = rng.uniform(0, 2, L).round(2)
    m = rng.integers(1, 10, L)  # every module holds bytes: the bound applies
    ag = LinearCost(float(rng.uniform(0, 0.5)), float(rng.uniform(0, 0.3)))
    rs = LinearCost(ag.a + float(rng.uniform(0, 0.2)), ag.b + float(rng.uniform(0, 0.1)))  # R >= A'
    return f, b, m, ag, rs


def _partitions(L):
    for k in range(L):
        for cuts in combinations(range(1, L), k):
            bd = (0, *cuts, L)
            yield [(bd[i], bd[i + 1] - 1) for i in range(len(bd) - 1)]


@pytest.mark.parametrize("seed", range(10))
def test_the_bound_never_exceeds_a_completion(seed):
    rng = np.random.default_rng(100 + seed)
    L = [2, 3, 4, 5, 6, 6, 7, 7, 8, 8][seed]
    f, b, m, ag, rs = _instance(rng, L)
    u = float(rng.uniform(0, 1))
    for M in (math.inf, int(rng.integers(m.max(), m.sum() + 1)), int(m.max())):
        p = Problem.of(f, b, m, ag, rs, memory=M, update_s=u, blocking=False)
        for r in (True, False):
            C = suffix_bound(p, r)
            assert C is not None
            # from the empty prefix (heads and tails 0): every plan of two units or more
            best: dict[int, float] = {}
            for units in _partitions(L):
                if len(units) < 2:
                    continue
                for d in range(3):
                    if peak_memory(units, m, depth=d, reshard=r) > M:
                        continue
                    t = fsdp_time(units, f, b, m, ag, rs, depth=d, reshard=r, update_s=u)
                    best[0] = min(best.get(0, math.inf), t)
            if 0 in best:
                assert C[0] + u <= best[0] * (1 + 1e-12) + 1e-12, (M, r, C[0] + u, best[0])


@pytest.mark.parametrize("seed", range(10))
def test_exact_planner_with_the_bound_equals_exhaustive_search(seed):
    from tests.test_fsdp_planner import exhaustive

    rng = np.random.default_rng(200 + seed)
    L = [3, 4, 5, 6, 7, 7, 8, 8, 9, 10][seed]
    f, b, m, ag, rs = _instance(rng, L)
    u = float(rng.uniform(0, 1))
    for M in (None, int(rng.integers(m.max(), m.sum() + 1)), int(m.max())):
        mods = Modules(forward_s=f, backward_s=b, param_bytes=m)
        p = plan_fsdp("optimal", mods, ag, rs, memory=M, update_s=u, gap=0)
        t, peak = exhaustive(f, b, m, ag, rs, math.inf if M is None else M, u)
        assert p.time_s == pytest.approx(t, rel=1e-9, abs=1e-12)
        assert p.peak_bytes == peak


def test_a_collective_bound_model_is_proven_from_the_empty_prefix():
    """120 blocks of 3 modules (one large), comm-bound on 64 ranks: exact, first pass, the root's bound."""
    L = 360
    m = np.tile([2_000_000, 500_000, 6_000_000], L // 3).astype(float)
    f = m * 2e-11
    b = 2 * f
    ag = LinearCost(63 * 1.5e-6, 63 / 64 * 8e-11)
    rs = ag
    mods = Modules(forward_s=f, backward_s=b, param_bytes=m)
    plan = plan_fsdp("optimal", mods, ag, rs, memory=float(m.sum()) / 10, max_depth=2, gap=0)
    assert plan.meta["dp_passes"] == 1
    assert plan.meta["lower_bound_s"] == pytest.approx(plan.time_s, rel=1e-12)
    p = Problem.of(f, b, m, ag, rs, memory=float(m.sum()) / 10, update_s=0.0, blocking=False)
    assert suffix_bound(p, True)[0] == pytest.approx(plan.time_s, rel=1e-9)  # tight at the root


def test_no_bound_where_it_does_not_hold():
    f, b, m = np.ones(3), np.ones(3), np.array([1.0, 0.0, 1.0])
    cost = LinearCost(1.0, 1.0)
    assert (
        suffix_bound(Problem.of(f, b, m, cost, cost, memory=math.inf, update_s=0.0, blocking=False), True)
        is None
    )
    m = np.ones(3)
    assert (
        suffix_bound(Problem.of(f, b, m, cost, cost, memory=math.inf, update_s=0.0, blocking=True), True)
        is None
    )
    cheap = LinearCost(0.5, 1.0)  # reduce-scatters cheaper than gathers: R >= A' fails with reshard
    p = Problem.of(f, b, m, cost, cheap, memory=math.inf, update_s=0.0, blocking=False)
    assert suffix_bound(p, True) is None and suffix_bound(p, False) is not None
