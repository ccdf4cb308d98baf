"""The FSDP model against an oracle written again from ``docs/fsdp.md``, with FSDP2's fixed cost per unit.

The oracle shares no code with :mod:`dpcomm.planner.fsdp_model`: the streams' iteration is the longest path
of the docs' event graph (each equation ``X = max(Y, Z) + w`` an edge from ``Y`` and from ``Z`` of weight
``w``), the CPU's (``overlap="gathers"``) the docs' closed form, the peak the docs' closed form, and a unit
takes ``F_k = c + sum f_i`` forward and ``W_k = c + sum b_i`` backward. ``plan_fsdp``'s ``optimal`` must be
the oracle's optimum by exhaustive search, over every plan and over the plans that keep each atom whole, and
a fixed cost must make more units cost more (issue 48: with ``c = 0`` and free collectives every split tied
and the least memory, one unit per module, won).

Budget: ~5 s (exhaustive search up to 8 modules).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.planner.fsdp import Modules, fsdp_time, plan_fsdp
from dpcomm.planner.hsdp import plan_hsdp


def docs_time(units, f, b, m, ag, rs, *, d, reshard, u=0.0, c=0.0, overlap="streams"):
    """``t_iter`` of the docs' model: the longest path from the start through its event graph."""
    K = len(units)
    F = [c + sum(f[a : z + 1]) for a, z in units]
    W = [c + sum(b[a : z + 1]) for a, z in units]
    B = [sum(m[a : z + 1]) for a, z in units]
    A, R = [ag(x) for x in B], [rs(x) for x in B]
    at = {"start": 0.0}

    def edge(src, dst, w):  # edges arrive in an order where every source is final
        at[dst] = max(at.get(dst, -np.inf), at[src] + w)

    def E(j):
        return f"E{j}" if j > 0 else "start"

    for k in range(1, K + 1):  # G_k = max(E_{k-d-1}, G_{k-1}) + A_k;  E_k = max(E_{k-1}, G_k) + F_k
        edge(E(k - d - 1), f"G{k}", A[k - 1])
        edge(f"G{k - 1}" if k > 1 else "start", f"G{k}", A[k - 1])
        edge(E(k - 1), f"E{k}", F[k - 1])
        edge(f"G{k}", f"E{k}", F[k - 1])
    t0 = f"E{K}"

    def Ap(p):  # position p is unit K+1-p; the last unit (p = 1) is never re-gathered
        return A[K - p] if reshard and 1 < p <= K else 0.0

    if overlap == "gathers":  # the docs' closed form: one term per position
        Wp = [W[K - p] for p in range(1, K + 1)]
        Rp = [R[K - p] for p in range(1, K + 1)]
        T = at[t0]
        for p in range(1, K + 1):
            if d == 0:
                T += Ap(p) + Wp[p - 1] + Rp[p - 1]
            elif p == 1:
                T += max(Wp[0], sum(Ap(q) for q in range(2, 2 + d))) + Rp[0]
            else:
                T += max(Wp[p - 1], Ap(p + d)) + Rp[p - 1]
        return T + u

    def BE(j):
        return f"BE{j}" if j > 0 else t0

    for p in range(1, K + 1):  # G'_p, BS_p / BE_p (W_p from BE_{p-1} and G'_p), Q_p
        edge(BE(p - d - 1), f"H{p}", Ap(p))
        edge(f"H{p - 1}" if p > 1 else t0, f"H{p}", Ap(p))
        edge(BE(p - 1), f"BE{p}", W[K - p])
        edge(f"H{p}", f"BE{p}", W[K - p])
        edge(f"BE{p}", f"Q{p}", R[K - p])
        edge(f"Q{p - 1}" if p > 1 else t0, f"Q{p}", R[K - p])
    edge(f"BE{K}", "end", u)
    edge(f"Q{K}", "end", u)
    return at["end"]


def docs_peak(units, m, *, d, reshard):
    B = [sum(m[a : z + 1]) for a, z in units]
    if not reshard:
        return sum(B)
    return max(sum(B[k : k + d + 1]) for k in range(len(B)))


def partitions(L, atoms=None):
    """Every split of modules 0..L-1 into units, cut only between atoms (default: every module)."""
    atoms = atoms or [(i, i) for i in range(L)]
    for cuts in itertools.product((False, True), repeat=len(atoms) - 1):
        out, first = [], 0
        for k, cut in enumerate(cuts):
            if cut:
                out.append((first, atoms[k][1]))
                first = atoms[k][1] + 1
        out.append((first, L - 1))
        yield out


def oracle_optimum(f, b, m, ag, rs, M, *, u=0.0, c=0.0, overlap="streams", atoms=None, D=2):
    """``(time, peak)`` of the least-time plan (ties: least peak) by exhaustive search over the oracle."""
    best = None
    for units in partitions(len(f), atoms):
        for d in range(D + 1):
            for r in (True, False):
                peak = docs_peak(units, m, d=d, reshard=r)
                if peak > M:
                    continue
                t = docs_time(units, f, b, m, ag, rs, d=d, reshard=r, u=u, c=c, overlap=overlap)
                tie = 1e-12 * best[0] if best else 0.0
                if best is None or t < best[0] - tie or (t <= best[0] + tie and peak < best[1]):
                    best = (t, peak)
    return best


def _instance(rng, L):
    f = rng.uniform(0, 1, L).round(2)
    b = rng.uniform(0, 2, L).round(2)
    m = rng.integers(1, 10, L)
    ag = LinearCost(float(rng.uniform(0, 0.5)), float(rng.uniform(0, 0.3)))
    rs = LinearCost(float(rng.uniform(0, 0.5)), float(rng.uniform(0, 0.3)))
    return f, b, m, ag, rs


def _mods(f, b, m):
    return Modules(forward_s=f, backward_s=b, param_bytes=m)


@pytest.mark.parametrize("seed", range(6))
def test_the_model_is_the_docs_model_with_a_fixed_cost_per_unit(seed):
    rng = np.random.default_rng(700 + seed)
    L = 7
    f, b, m, ag, rs = _instance(rng, L)
    for units in [[(0, 1), (2, 2), (3, 5), (6, 6)], [(i, i) for i in range(L)], [(0, L - 1)]]:
        for d, r, overlap in itertools.product(range(4), (True, False), ("streams", "gathers")):
            for c in (0.0, float(rng.uniform(0, 0.5))):
                want = docs_time(units, f, b, m, ag, rs, d=d, reshard=r, u=0.25, c=c, overlap=overlap)
                got = fsdp_time(units, f, b, m, ag, rs, depth=d, reshard=r, update_s=0.25, overlap=overlap,
                                unit_s=c)  # fmt: skip
                assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (units, d, r, overlap, c)


@pytest.mark.parametrize("seed", range(8))
def test_optimal_is_the_oracles_optimum_with_a_fixed_cost(seed):
    rng = np.random.default_rng(800 + seed)
    L = [3, 4, 5, 6, 6, 7, 7, 8][seed]
    f, b, m, ag, rs = _instance(rng, L)
    c = float(rng.uniform(0.05, 0.5))
    overlap = ("streams", "gathers")[seed % 2]
    for M in (None, int(rng.integers(m.max(), m.sum() + 1))):
        p = plan_fsdp("optimal", _mods(f, b, m), ag, rs, memory=M, update_s=0.1, overlap=overlap, gap=0,
                      unit_s=c)  # fmt: skip
        t, peak = oracle_optimum(f, b, m, ag, rs, np.inf if M is None else M, u=0.1, c=c, overlap=overlap)
        assert p.time_s == pytest.approx(t, rel=1e-9, abs=1e-12) and p.peak_bytes == peak
        assert p.meta["unit_s"] == c


@pytest.mark.parametrize("seed", range(6))
def test_optimal_over_atoms_is_the_oracles_optimum_over_runnable_plans(seed):
    rng = np.random.default_rng(900 + seed)
    L = 8
    f, b, m, ag, rs = _instance(rng, L)
    cuts = sorted(rng.choice(np.arange(1, L), size=3, replace=False).tolist())
    atoms = [(a, z - 1) for a, z in zip([0, *cuts], [*cuts, L], strict=True)]
    c = float(rng.uniform(0, 0.3))
    overlap = ("streams", "gathers")[seed % 2]
    t, peak = oracle_optimum(f, b, m, ag, rs, np.inf, c=c, overlap=overlap, atoms=atoms)
    p = plan_fsdp("optimal", _mods(f, b, m), ag, rs, overlap=overlap, gap=0, unit_s=c, atoms=atoms)
    assert p.num_modules == L and p.meta["atoms"] == [list(a) for a in atoms]
    assert p.time_s == pytest.approx(t, rel=1e-9, abs=1e-12) and p.peak_bytes == peak
    starts = {a for a, _ in atoms}
    for name in ("optimal", "per-layer", "whole", "size:12"):  # every unit a run of whole atoms
        q = plan_fsdp(name, _mods(f, b, m), ag, rs, overlap=overlap, gap=0, unit_s=c, atoms=atoms)
        assert all(a in starts and z + 1 in starts | {L} for a, z in q.units), (name, q.units)
        assert p.time_s <= q.time_s * (1 + 1e-9)
    with pytest.raises(UserError, match="do not cover"):
        plan_fsdp("whole", _mods(f, b, m), ag, rs, atoms=[(0, 2), (4, L - 1)])


def test_more_units_are_never_free():
    """Free collectives: with ``c = 0`` every split ties and the least memory, a unit per module, wins
    (what FSDP2 runs slowest); with ``c > 0`` one unit is the fastest, and each unit more costs ``2c``."""
    L = 6
    f, b, m = [1e-3] * L, [2e-3] * L, [1000] * L
    free = LinearCost(0.0, 0.0)
    zero = plan_fsdp("optimal", _mods(f, b, m), free, free, gap=0)
    assert len(zero.units) == L
    c = 0.8e-3
    priced = plan_fsdp("optimal", _mods(f, b, m), free, free, gap=0, unit_s=c)
    assert len(priced.units) == 1 < len(zero.units)
    per_layer = plan_fsdp("per-layer", _mods(f, b, m), free, free, unit_s=c)
    assert per_layer.time_s - priced.time_s == pytest.approx(2 * (L - 1) * c, rel=1e-9)
    hsdp = plan_hsdp("optimal", _mods(f, b, m), lambda G: (free, free, free), world=4, gap=0, unit_s=c)
    assert len(hsdp.units) == 1
    with pytest.raises(UserError, match="fixed cost per unit must be a number of seconds >= 0"):
        plan_fsdp("whole", _mods(f, b, m), free, free, unit_s=-1.0)
