"""The exact FSDP plan: the least modelled ``t_iter`` over units, prefetch depths and reshard choices under
a memory budget (a dynamic program over module prefixes with dominance and bounds).

The model, its symbols and equations are :mod:`dpcomm.planner.fsdp_model`'s; this exact minimum is ours
(``optimal`` in :func:`dpcomm.planner.fsdp.plan_fsdp`). For each depth ``d`` in ``0..D`` and each reshard
choice the program below finds the least ``t_iter`` (ties: the least peak memory) over all ``2^(L-1)``
partitions into units whose peak fits the budget ``M``; the best of the ``2(D+1)`` answers is the plan.

Why one scalar per prefix is not enough (as it is for MG-WFBP's and iBatch's programs): ``t_iter = t0 +
(Q_K - t0)`` is the longest path of the model's event graph, which runs forward through the units and back.
A left-to-right pass over the units sees the forward's *heads* (event times from the start) and the
backward's *tails* (longest paths from an event to the end, :math:`\\tau`), and the answer needs both.

State after the units ending at module ``i`` (the last one unit ``k``, backward position ``p = K+1-k``)::

    forward heads   G_k (as max(G_k, E_{k-d}), all the next all-gather reads), E_{k-d}, .., E_k
    backward tails  sum_{q >= p} R_q, tau(BS_p), g_p, .., g_{p+d}   with g_q = A'_q + tau(end of G'_q)
    memory          w_1, .., w_d (bytes of the last 1..d units; with reshard only), peak so far

Adding unit ``k+1`` = modules ``s..i`` (``F, W, B, A, R``; ``A' = A`` with reshard unless it is the last)::

    G = max(E_{k-d}, G_k) + A,   E_{k+1} = max(E_k, G) + F                         (the model's forward)
    tau(BE_{p-1}) = max(R + sum_{q >= p} R_q,  tau(BS_p),  g_{p+d})            (its reduce-scatter, the
    tau(BS_{p-1}) = W + tau(BE_{p-1})                                           next backward, the re-gather
    g_{p-1} = A' + max(tau(BS_{p-1}), g_p)                                      it issues; the stream)
    window = B + w_d <= M  (with reshard),  peak = max(peak, window)

and at the end (``i = L-1``, ``A' = 0``: the last unit is not re-gathered) ``t_iter = E_K + g_1 + u``, the
peak is ``peak`` with reshard and ``sum B`` without (``fsdp_model``'s closed form). Missing events
(``g_q`` for ``q > K``, the first unit's ``tau(BS_{K+1})``) are 0.

Proof. (1) The recurrences are the model: the forward lines are its equations; the tails are the longest
paths of its backward event graph (edges ``BE_{p-1} -> BS_p``, ``G'_p -> BS_p``, ``BS_p -> BE_p`` (``W_p``),
``G'_{p-1} -> G'_p`` and ``BE_{p-d-1} -> G'_p`` (``A'_p``), ``BE_p -> Q_p``, ``Q_{p-1} -> Q_p`` (``R_p``)),
read from the end; every edge out of ``t0`` is dominated by the all-gather stream's chain from ``G'_0``
(weights >= 0), so ``Q_K - t0 = g_1``; and the peak is the closed form. (2) Every quantity of the state is
a composition of ``max`` and ``+`` of non-negative constants, hence non-decreasing in every earlier
component; ``t_iter`` and every later window are too. So if two prefixes end at the same ``i`` and one's
state is ``<=`` the other's in every component, every completion of the second is matched or beaten (in
time, peak and feasibility) by the same completion of the first: the second can be dropped (dominance).
(3) A prefix whose lower bound ``E_k + sum f(rest) + max(sum b(rest) + tau(BS_p), g_p) + u`` (forward and
backward both still have to run; ``g_1 >= g_p`` along the stream) exceeds a feasible plan's time can be
dropped (bound); the incumbent is the best of the other planners' plans, then each answer found. What is
kept at ``i = L-1`` therefore contains an optimal partition, and the least ``t_iter`` (then peak) among them
is the answer. ``tests/test_fsdp_planner.py`` checks it against exhaustive search of ``fsdp_time`` and
``peak_memory`` over all partitions, depths and reshard choices.

With ``overlap="gathers"`` (:mod:`dpcomm.planner.fsdp_model`: reduce-scatters block, one link) the
backward is a sum of one term per unit, which needs the re-gather of the unit ``d`` before it, so the tails
are one number and the state carries the last ``d`` units' re-gathers instead::

    tails   b = the backward terms so far;   a_1 .. a_d = A' of the last 1..d units (a_1 the last)
    b += max(W, a_d) + R  (d >= 1),   A' + W + R  (d = 0)      for every unit but the last
    b += max(W, a_1 + .. + a_d) + R                            for the last (its A' is 0)

and ``t_iter = E_K + b + u``. The same proof holds: ``b`` adds, the ``a`` are non-decreasing in the units'
bytes and compared like the memory columns, and the bound's backward is ``b + sum b(rest) + R(rest)``.

Complexity. ``3d + 6`` numbers per state (``2d + 4`` with ``gathers``). With ``S_i`` states kept at module
``i``, module ``i`` makes ``sum_{s <= i} S_{s-1}`` candidates and filters them in ``O(n * kept * d)``; with
``S`` the most kept anywhere, ``O(L^2 S d + L (L S)^2 d)`` per ``(d, reshard)``, ``2(D+1)`` times. ``S`` is
not bounded by a polynomial in general (at worst every partition, ``2^(L-1)``); ``meta["dp_states"]`` reports
what a plan kept. On the zoo's traces it stays small (GPT-2's 75 modules: ``docs/fsdp.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.planner.fsdp_model import TIE_REL, Units, check_overlap

__all__ = ["OptimalResult", "optimal_fsdp"]

_SLACK = 1e-9  # relative: bounds compare DP sums against fsdp_time's, summed in another order


@dataclass(frozen=True, slots=True)
class OptimalResult:
    """One answer of :func:`optimal_fsdp` (times in seconds, bytes as an int)."""

    time_s: float
    peak_bytes: int
    units: Units
    depth: int
    reshard: bool
    states: int
    """States kept over all modules and every ``(d, reshard)`` run."""


def optimal_fsdp(
    f: np.ndarray,
    b: np.ndarray,
    m: np.ndarray,
    ag_cost: CommCost,
    rs_cost: CommCost,
    *,
    memory: float,
    depths: list[int],
    reshards: list[bool],
    update_s: float = 0.0,
    incumbent_s: float = np.inf,
    overlap: str = "streams",
) -> OptimalResult | None:
    """The least ``t_iter`` (then peak) over partitions of checked inputs ``f, b, m`` (seconds, bytes) with
    peak ``<= memory`` bytes, for each depth in ``depths`` and reshard choice in ``reshards`` (ties: the
    least depth, then reshard); ``None`` when nothing fits. ``incumbent_s``: a feasible plan's time, for the
    bound (``inf``: none known). ``overlap``: the model's, :data:`~dpcomm.planner.fsdp_model.OVERLAPS`."""
    L = f.size
    cf, cb, cm = (np.concatenate(([0.0], np.cumsum(x))) for x in (f, b, m))
    span = cm[None, 1:] - cm[:-1, None]  # span[s, i] = bytes of modules s..i (s <= i)
    inside = np.triu(np.ones((L, L), dtype=bool))
    A = _costs(ag_cost, np.where(inside, span, 0.0))
    R = _costs(rs_cost, np.where(inside, span, 0.0))
    rest = cm[L] - cm[1:]  # bytes after module i
    ctx = _Ctx(L, cf, cb, cm, span, A, R, float(memory), float(update_s),
               _lower(ag_cost, rest), _lower(rs_cost, rest), float(f[-1]), float(b[-1]),
               check_overlap(overlap) == "gathers")  # fmt: skip
    total = float(cm[-1])
    # phase 1: the least time of each (d, reshard), memory columns only where the budget can bind
    ub, times, states = float(incumbent_s), {}, 0
    for d in depths:
        for r in reshards:
            got = _dp(ctx, d, r, ub, peak=False, windows=r and memory < total)
            if got is not None:
                times[d, r] = got
                states += got[3]
                ub = min(ub, got[0])
    if not times:
        return None
    # phase 2: among the fastest (within a tie), the least peak: each run only looks below the best peak so
    # far (bytes are whole numbers); without reshard the peak is the total
    tmin = min(t for t, *_ in times.values())
    tie = tmin + TIE_REL * max(1.0, abs(tmin))
    best: OptimalResult | None = None
    for (d, r), (t, _, units, _) in sorted(times.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
        if t > tie:
            continue
        cand = OptimalResult(t, int(total), units, d, r, 0)
        if r:
            top = memory if best is None else min(memory, best.peak_bytes - 1)
            if best is not None and _least_window(m, d) > top:
                continue
            got = _dp(replace(ctx, M=top), d, r, tie * (1 + _SLACK), peak=True, windows=True)
            if got is None or got[0] > tie:
                continue
            states += got[3]
            cand = OptimalResult(got[0], int(got[1]), got[2], d, r, 0)
        if best is None or _better(cand, best):
            best = cand
    return OptimalResult(best.time_s, best.peak_bytes, best.units, best.depth, best.reshard, states)


def _least_window(m: np.ndarray, d: int) -> float:
    """The least peak of any plan of depth ``d`` with reshard: one unit per module (``docs/fsdp.md``)."""
    c = np.concatenate(([0.0], np.cumsum(m)))
    k = min(d + 1, m.size)
    return float((c[k:] - c[:-k]).max())


def _better(x: OptimalResult, y: OptimalResult) -> bool:
    """Less time (beyond a tie); on a tie, less peak memory (then the earlier ``(d, reshard)`` stays)."""
    tie = TIE_REL * max(1.0, abs(y.time_s))
    if x.time_s < y.time_s - tie:
        return True
    return x.time_s <= y.time_s + tie and x.peak_bytes < y.peak_bytes


def _costs(cost: CommCost, nbytes: np.ndarray) -> np.ndarray:
    many = getattr(cost, "many", None)
    if callable(many):
        return np.asarray(many(nbytes), dtype=float)
    return np.vectorize(lambda x: float(cost(float(x))), otypes=[float])(nbytes)


def _prune(X: np.ndarray, heads: slice, tails: slice, rest: slice) -> np.ndarray:
    """Indices of rows of ``X`` to keep: a row goes when another's heads exceed it by at most ``-x`` where
    its tails exceed it by at most ``x`` and its other columns (memory) are ``<=`` (module docstring, (2))."""
    order = np.argsort(X[:, heads.stop - 1] + X[:, tails].max(axis=1), kind="stable")
    kept: list[int] = []
    for j in order:
        if kept:
            K = X[kept]
            dh = (K[:, heads] - X[j, heads]).max(axis=1)
            dt = (K[:, tails] - X[j, tails]).max(axis=1)
            mem_le = np.all(K[:, rest] <= X[j, rest], axis=1)
            if np.any((dh + dt <= 0) & mem_le):
                continue
            back = (X[j, heads] - K[:, heads]).max(axis=1) + (X[j, tails] - K[:, tails]).max(axis=1)
            gone = (back <= 0) & np.all(X[j, rest] <= K[:, rest], axis=1)
            if gone.any():
                kept = [k for k, g in zip(kept, gone, strict=True) if not g]
        kept.append(int(j))
    return np.array(kept, dtype=int)


@dataclass(frozen=True, slots=True)
class _Ctx:
    """The inputs every run shares: prefix sums, unit costs ``A[s, i]``, ``R[s, i]``, budget, bounds."""

    L: int
    cf: np.ndarray
    cb: np.ndarray
    cm: np.ndarray
    span: np.ndarray
    A: np.ndarray
    R: np.ndarray
    M: float
    u: float
    ag_rest: np.ndarray
    """A lower bound on the all-gathers of the modules after ``i``, seconds."""
    rs_rest: np.ndarray
    """The same for their reduce-scatters."""
    f_last: float
    b_last: float
    blocking: bool
    """``overlap="gathers"``: the reduce-scatters block the thread (module docstring)."""


def _lower(cost: CommCost, nbytes: np.ndarray) -> np.ndarray:
    """A lower bound on the summed cost of any split of ``nbytes`` into units: one unit's cost where the
    cost is :class:`LinearCost` (``a >= 0``, so merging never costs more), else 0."""
    return _costs(cost, nbytes) if isinstance(cost, LinearCost) else np.zeros_like(nbytes)


def _dp(c: _Ctx, d: int, r: bool, ub: float, *, peak: bool, windows: bool):
    """One ``(d, reshard)`` run (module docstring): ``(t_iter, peak, units, states kept)`` or ``None``.
    ``windows``: keep ``w`` (the budget can bind, or the peak is wanted); ``peak``: keep the peak (ties)."""
    L, M, u = c.L, c.M, c.u
    total = float(c.cm[-1])
    if not r and total > M:
        return None
    # columns: 0 G | 1..d+1 E_{k-d}..E_k | cr: sum R | cr+1: tau(BS) | g: g_p..g_{p+d} | w: w_1..w_d | peak
    # (blocking: 0 G | 1..d+1 E | cr: b | g: a_1..a_d | w: w_1..w_d | peak)
    cr, g = d + 2, d + 4
    w = g + d + 1
    if c.blocking:
        g = cr + 1
        w = g + d
    nw = d if windows else 0
    width = w + nw + int(peak)
    fronts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per end module i: states, parent s, row
    states = 0
    finals = None
    for i in range(L):
        last = i == L - 1
        blocks, ps, pr = [], [], []
        for s in range(i + 1):
            X = np.zeros((1, width)) if s == 0 else fronts[s - 1][0]
            Bt = float(c.span[s, i])
            if X.shape[0] == 0 or (r and Bt > M):
                continue
            Fu, Wu = float(c.cf[i + 1] - c.cf[s]), float(c.cb[i + 1] - c.cb[s])
            Au, Ru = float(c.A[s, i]), float(c.R[s, i])
            Ap = Au if r and not last else 0.0
            Y = np.empty((X.shape[0], width))
            Gn = np.maximum(X[:, 1], X[:, 0]) + Au
            En = np.maximum(X[:, d + 1], Gn) + Fu
            Y[:, 1 : d + 1] = X[:, 2 : d + 2]
            Y[:, d + 1] = En
            Y[:, 0] = np.maximum(Gn, Y[:, 1])
            if d:
                Y[:, 1] = Y[:, 0]  # E_{k-d} is only ever read through max(E_{k-d}, G_k)
            if c.blocking:
                if not d:
                    Y[:, cr] = X[:, cr] + (Ap + Wu + Ru)
                else:
                    ahead = X[:, g : g + d].sum(axis=1) if last else X[:, g + d - 1]
                    Y[:, cr] = X[:, cr] + np.maximum(Wu, ahead) + Ru
                    Y[:, g] = Ap
                    Y[:, g + 1 : g + d] = X[:, g : g + d - 1]
            else:
                tBE = np.maximum(np.maximum(Ru + X[:, cr], X[:, cr + 1]), X[:, g + d])
                Y[:, cr] = X[:, cr] + Ru
                Y[:, cr + 1] = Wu + tBE
                Y[:, g] = Ap + np.maximum(Y[:, cr + 1], X[:, g])
                Y[:, g + 1 : g + d + 1] = X[:, g : g + d]
                if d:  # g_{p+d} is only ever read through max(tau(BS_p), g_{p+d})
                    Y[:, cr + 1] = np.maximum(Y[:, cr + 1], Y[:, g + d])
                    Y[:, g + d] = Y[:, cr + 1]
            ok = np.ones(X.shape[0], dtype=bool)
            if r:
                window = Bt + (X[:, w + d - 1] if nw else np.zeros(X.shape[0]))
                ok = window <= M
                if nw:
                    Y[:, w] = Bt
                    Y[:, w + 1 : w + d] = Bt + X[:, w : w + d - 1]
                if peak:
                    Y[:, -1] = np.maximum(X[:, -1], window)
            elif peak:
                Y[:, -1] = total
            if not last:  # the bound (module docstring, (3))
                fwd = np.maximum(En + (c.cf[L] - c.cf[i + 1]), Y[:, 0] + c.ag_rest[i] + c.f_last)
                if c.blocking:
                    bwd = Y[:, cr] + (c.cb[L] - c.cb[i + 1]) + c.rs_rest[i]
                else:
                    bwd = np.maximum(np.maximum((c.cb[L] - c.cb[i + 1]) + Y[:, cr + 1], Y[:, g]),
                                     Y[:, cr] + c.rs_rest[i] + c.b_last)  # fmt: skip
                ok &= fwd + bwd + u <= ub * (1 + _SLACK)
            idx = np.flatnonzero(ok)
            if idx.size:
                blocks.append(Y[idx])
                ps.append(np.full(idx.size, s))
                pr.append(idx)
        if not blocks:
            fronts.append((np.zeros((0, width)), np.zeros(0, int), np.zeros(0, int)))
            continue
        Y, P, Rw = np.concatenate(blocks), np.concatenate(ps), np.concatenate(pr)
        if last:
            t = Y[:, d + 1] + (Y[:, cr] if c.blocking else Y[:, g]) + u
            pk = Y[:, -1] if peak else np.zeros(t.size)
            finals = (t, pk)
            fronts.append((Y, P, Rw))
            states += Y.shape[0]
            break
        tails = slice(cr, cr + 1) if c.blocking else slice(cr, w)
        keep = _prune(Y, slice(0, d + 2), tails, slice(tails.stop, width))
        fronts.append((Y[keep], P[keep], Rw[keep]))
        states += keep.size
    if finals is None or finals[0].size == 0:
        return None
    t, pk = finals
    tmin = float(t.min())
    near = np.flatnonzero(t <= tmin + TIE_REL * max(1.0, abs(tmin)))
    j = pick = int(near[np.argmin(pk[near])])
    units, i = [], L - 1
    while i >= 0:
        _, P, Rw = fronts[i]
        s = int(P[j])
        units.append((s, i))
        j, i = int(Rw[j]), s - 1
    units.reverse()
    return float(t[pick]), float(pk[pick]), units, states
