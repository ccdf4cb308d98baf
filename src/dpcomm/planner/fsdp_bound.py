"""A lower bound on what the rest of an FSDP plan costs, start-ups counted: the bound that makes the exact
search of :mod:`dpcomm.planner.fsdp_search` prove real sizes (the Llama-3-70B shape at depth 2 under a
10% budget) instead of widening its beam for minutes.

Symbols are :mod:`dpcomm.planner.fsdp_model`'s (``A = a_ag + b_ag B``, ``R = a_rs + b_rs B``, ``A'`` the
re-gather). Why another bound: :func:`~dpcomm.planner.fsdp_state.completion_bound` prices the rest of a
plan by its bytes (``b bytes(rest)``) and leaves the rest's start-ups out (to stay non-decreasing in the
next unit's end), so where the collectives dominate every prefix's bound sits below the optimum by about
two start-ups per unit still to come (0.19 ms a block on the 70B shape, 64 ranks on 100 Gb InfiniBand:
14.7 ms over the model), and no prefix is ever pruned. More units are not free in the model, though:
fewer units are larger, and a large unit's re-gather plus backward is a path too. Ours:

Take a prefix state ``X`` whose next unit starts at module ``s``, and any completion: units ``1..K``
(forward order, ``1`` the next one, ``K = n + 1`` the last, modules ``l..L-1``), ``S = bytes(s..L-1)``.
Every gather chains from ``H_0`` (the state's first head), the last unit's forward follows, so ``t0 >=
H_0 + K a_ag + b_ag S + F(l..)``. In backward, for each unit ``k``, its re-gather waits for the re-gathers
of units ``k..K-1`` (``K``'s is none), its backward runs, and then the reduce-scatters of units ``1..k``
and of the prefix (``X``'s reduce-scatter tail ``y``, a sum of ``R``) follow on one stream::

    t_iter >= t0 + A'(k..K-1) + W_k + R(1..k) + y + u         for every k

With ``R >= A'`` per unit (same start-up and a byte rate at least the gather's, or no re-gather), ``k = K``
and the non-last unit of largest ``R + W`` (at least their mean) give::

    t_iter >= H_0 + y + u + (n+1) a_ag + b_ag S + F(l..)
              + max( [reshard] (n a_ag + b_ag (S - B_l)) + a_rs + (b_rs (S - B_l) + W(s..l-1)) / n,
                     (n+1) a_rs + b_rs S + W(l..) )

where ``n >= 1`` (the next unit is not the last; every module holds bytes, else a unit of none has no
start-up and there is no bound) and, with reshard, ``n >= ceil(bytes(s..l-1) / M)``
(every unit fits the budget), ``n <= l - s``. The right side is convex in ``n`` (a maximum of a convex and a
linear function), so its least value over whole ``n`` is at the floor or ceiling of the least of the
real ``n`` (the first term's stationary point, the crossing of the two, or the ends): :func:`suffix_bound`
takes it for every ``(s, l)`` at once and the least over ``l`` (the last unit fitting the budget), a
function of ``s`` alone, computed once per search. The bound of ``X`` is then ``H_0 + y + C(s) + u``,
and it holds for every extension of ``X`` by a next unit ``s..j`` (``C`` is over all of them). Without a
:class:`~dpcomm.costmodel.base.LinearCost` pair with ``R >= A'``, under ``overlap="gathers"`` and for HSDP
there is none (``None``): the search uses the other bound alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcomm.costmodel.base import LinearCost

__all__ = ["suffix_bound"]

_MAX_L = 2048
"""Above this many modules the ``L x L`` table is not made (memory: 8 L^2 bytes per array)."""


def suffix_bound(p: Any, r: bool) -> np.ndarray | None:
    """``C[s]`` for ``s = 0..L-1`` (module docstring; ``inf`` where no completion fits), or ``None`` where
    the bound does not apply. ``p``: a :class:`dpcomm.planner.fsdp_state.Problem`; ``r``: reshard."""
    ag, rs = p.ag, p.rs
    L = p.L
    if p.blocking or p.ar is not None or L < 2 or L > _MAX_L:
        return None
    if not (isinstance(ag, LinearCost) and isinstance(rs, LinearCost)):
        return None
    if r and (rs.a < ag.a or rs.b < ag.b):
        return None
    cm, cf, cb = p.cm, p.cf, p.cb
    if not np.all(np.diff(cm) > 0):  # a unit of no bytes moves nothing, start-up included
        return None
    s = np.arange(L)[:, None]  # next unit's first module
    l = np.arange(L)[None, :]  # last unit's first module
    valid = l > s
    S = p.total - cm[s]
    Bl = p.total - cm[l]
    Fl, Wl = cf[L] - cf[l], cb[L] - cb[l]
    mid = cm[l] - cm[s]  # bytes of s..l-1
    P = (ag.b * (S - Bl) if r else 0.0) + rs.a
    D = rs.b * mid + (cb[l] - cb[s])
    Q = rs.b * S + Wl
    lo = np.ones_like(mid)
    if r and np.isfinite(p.M):
        valid &= Bl <= p.M
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.maximum(lo, np.ceil(mid / p.M) if p.M > 0 else np.inf)
    hi = (l - s).astype(float)
    valid &= lo <= hi
    ra = ag.a * (1.0 if r else 0.0)  # a_ag per non-last unit in the first term

    def g(n: np.ndarray) -> np.ndarray:
        n = np.clip(n, lo, hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            first = ra * n + P + D / n
            out = (n + 1) * ag.a + np.maximum(first, (n + 1) * rs.a + Q)
        return np.where(np.isfinite(n), out, np.inf)

    with np.errstate(divide="ignore", invalid="ignore"):
        cands = [lo, hi]
        stat = np.sqrt(D / np.maximum(ra + ag.a, 1e-300))  # the first term's stationary point
        cands += [np.floor(stat), np.ceil(stat)]
        # crossing: (ra - a_rs) n^2 + (P - a_rs - Q) n + D = 0
        qa, qb, qc = ra - rs.a, P - rs.a - Q, D
        if qa == 0:
            roots = [np.where(qb != 0, -qc / qb, lo)]
        else:
            disc = np.sqrt(np.maximum(qb * qb - 4 * qa * qc, 0.0))
            roots = [(-qb + disc) / (2 * qa), (-qb - disc) / (2 * qa)]
        for x in roots:
            x = np.where(np.isfinite(x), x, lo)
            cands += [np.floor(x), np.ceil(x)]
    best = np.full(valid.shape, np.inf)
    for n in cands:
        best = np.minimum(best, g(n))
    best = np.where(valid, best + ag.b * S + Fl, np.inf)
    _whole_modules(p, r, best, Pf=np.where(valid, P - rs.a, 0.0), Q=Q, lo=lo, Fl=Fl, S=S)
    return best.min(axis=1)


_REFINE = 4
"""Per next unit's start, this many last units (those of least bound) are bounded again in whole modules."""
_TAUS = np.concatenate((np.geomspace(0.7, 1.0, 36, endpoint=False), np.geomspace(1.0, 1.6, 96)))
"""``tau / tau0``: where the largest non-last unit's ``R + W`` is sought, around the last unit's own."""


def _whole_modules(p: Any, r: bool, best: np.ndarray, *, Pf, Q, lo, Fl, S) -> None:
    """Raise ``best[s, l]`` (in place) for the last units ``l`` of least bound: the non-last units are made
    of whole modules, so with every unit's ``R + W`` below ``tau`` there are at least the greedy count of
    them (the most modules that fit each, ``n_tau``); over the intervals ``[tau_j, tau_{j+1})`` of a grid
    (and below and above it) the bound is the least of ``(n+1) a_ag + max([r] n a_ag + b_ag (S - B_l) +
    tau_j, (n+1) a_rs + b_rs S + W(l..))`` with ``n = n_{tau_{j+1}}`` (``n >= lo`` above the grid)."""
    ag, rs = p.ag, p.rs
    L = p.L
    cm, cb = p.cm, p.cb
    c = np.concatenate(([0.0], np.cumsum(rs.b * np.diff(cm) + np.diff(cb))))  # R + W less a_rs, summed
    ra = ag.a if r else 0.0
    fits_mem = np.searchsorted(cm, cm[:-1] + (p.M if r else np.inf), side="right") - 1
    picks = np.argsort(best, axis=1, kind="stable")[:, :_REFINE]
    for l in np.unique(picks):
        rows = np.flatnonzero((picks == l).any(axis=1) & np.isfinite(best[:, l]))
        if not rows.size:
            continue
        tau0 = np.maximum(Q[rows, l] - Pf[rows, l], 2 * rs.a)  # where the two terms meet (per row)
        taus = tau0[:, None] * _TAUS[None, :]
        # greedy counts of s..l-1 per (row, tau): walk every row's chain at once
        pos = np.repeat(rows[:, None], taus.shape[1], axis=1).astype(np.int64)
        n = np.zeros(pos.shape)
        cap = taus - rs.a
        while True:
            live = pos < l
            if not live.any():
                break
            e = np.searchsorted(c, c[pos] + cap, side="right") - 1
            e = np.minimum(np.minimum(e, fits_mem[np.minimum(pos, L - 1)]), l)
            stuck = live & (e <= pos)
            n = np.where(stuck, np.inf, n + live)
            pos = np.where(live & ~stuck, e, L)
        n = np.maximum(n, lo[rows, l][:, None])
        pf, q = Pf[rows, l][:, None], Q[rows, l][:, None]
        low = np.concatenate((np.zeros((rows.size, 1)), taus), axis=1)  # each interval's least tau
        k = np.concatenate((n, lo[rows, l][:, None]), axis=1)  # and its least count
        with np.errstate(invalid="ignore"):  # no partition (an infinite count): no completion there
            got = (k + 1) * ag.a + np.maximum(ra * k + pf + low, (k + 1) * rs.a + q)
        got = np.where(np.isfinite(k), got, np.inf)
        got = got.min(axis=1) + ag.b * S[rows, 0] + Fl[0, l]
        best[rows, l] = np.maximum(best[rows, l], got)
