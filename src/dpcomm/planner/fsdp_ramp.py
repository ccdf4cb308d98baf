"""Two lower bounds on what the rest of an FSDP plan costs, by how many units its collectives' pipelines
force: the bounds that keep the exact search of :mod:`dpcomm.planner.fsdp_search` tight where compute and
collectives take about as long (issue 57: 4x the compute per GPU of the Llama-3-70B shape ran for minutes).

Symbols are :mod:`dpcomm.planner.fsdp_model`'s (``A = a_ag + b_ag B``, ``R = a_rs + b_rs B``, seconds); a
state ``X`` (heads ``H_0``, reduce-scatter tail ``y``) whose next unit starts at module ``s``, and any
completion: units ``K, .., 1`` of modules ``s..L-1`` in backward positions (``1`` the last unit ``U``,
``K >= 2`` the next unit), ``S = bytes(s..L-1)``. The all-gathers run in a chain from ``H_0`` and ``U``'s
forward follows: ``t0 >= H_0 + K a_ag + b_ag S + F(U)``. Then two paths per position ``p``:

    (1) t_iter >= t0 + W(1..p) + R(p..K) + y + u          (backward to p, then every reduce-scatter)
    (2) t_iter >= t0 + A'(2..p) + W(p..K) + W(next..) + tau(BE) + u   (re-gathers to p, then backward)

where ``tau(BE)`` is the tail after the next unit's backward (``fsdp_state``'s ``tBE``; with reshard
``A' = A`` for ``p >= 2``, else 0). So with the *lag* ``e = max_p lag_p`` (``lag_1 = 0``;
(1) ``W(2..p) - R(1..p-1)``, (2) ``A'(2..p) - W(1..p-1)``)::

    (1) t_iter >= H_0 + y + u + (b_ag + b_rs) S + [K (a_ag + a_rs) + F(U) + W(U) + e]
    (2) t_iter >= H_0 + b_ag S + W(s..L-1) + tau(BE) + u + [K a_ag + F(U) + e]

The brackets, least over the completions of ``s..L-1``, are :func:`ramp_bounds`' ``(P1[s], P2[s])``. Few
units mean large ones, and a unit whose backward (1) or re-gather (2) outruns what the other stream did
meanwhile adds to ``e``: so the units ramp up from the model's end, each a start-up. Given ``U = l..L-1``
and a lag ``e``, the fewest units reach furthest by taking, from the end, each unit as large as its lag
allows (greedy: by induction its ``p``-th start is at most any partition's, as the right side of each
constraint only grows with what is covered; an empty unit may stand in, so the count is a lower bound;
(2) stuck is infeasible: its constraints only tighten with ``p``). With reshard under a budget ``M`` every
``d + 1`` consecutive units are a window of at most ``M`` bytes, so the units before the ``r``-th from the
end, over ``x`` bytes, number at least ``(d + 1) (ceil(x / M) - 1) + 1``, and ``K >= r +`` that. For ``e``
on a grid ``e_0 = 0 < e_1 < ..``, any ``e`` in ``[e_k, e_{k+1})`` costs ``e_k`` and needs at least the
greedy count at ``e_{k+1}``. Ours. :func:`last_gather` bounds the forward's end by the last unit's gather
(issued ``d`` units before it), for ``fsdp_state`` likewise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcomm.costmodel.base import LinearCost

__all__ = ["last_gather", "ramp_bounds"]

_LAGS = np.concatenate(([0.0], np.geomspace(1e-7, 10.0, 33)))
"""The lag grid ``e_k``, seconds (exposures past 10 s cost that much anyway)."""
_STEPS = 64
"""Greedy units walked per chain; a chain not past ``s`` by then needs one more unit at least."""


def ramp_bounds(p: Any, r: bool, d: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(P1, P2)``, each an array over ``s = 0..L-1`` (module docstring; ``inf`` where no completion of
    two units or more fits) or ``None`` where it does not apply. ``p``: a
    :class:`dpcomm.planner.fsdp_state.Problem` (streams overlap); ``r``: reshard; ``d``: the depth."""
    ag, rs = p.ag, p.rs
    if p.blocking or p.L < 2 or not (isinstance(ag, LinearCost) and isinstance(rs, LinearCost)):
        return None, None
    L, cm, cf, cb = p.L, p.cm, p.cf, p.cb
    win = r and np.isfinite(p.M)
    fit = np.flatnonzero((cm[L] - cm[1:L] <= p.M) if r else np.ones(L - 1, dtype=bool)) + 1  # U's starts
    if not fit.size:
        return None, None
    l, e = np.repeat(fit, _LAGS.size), np.tile(_LAGS, fit.size)
    e_hi = np.tile(np.append(_LAGS[1:], np.inf), fit.size)  # the count is the one at the next lag
    F, W = cf[L] - cf[l], cb[L] - cb[l]
    p1 = None if p.ar is not None else _least(p, l, W + F + e, ag.a + rs.a, _walk(p, l, e_hi, 1), d, win)
    free = np.vstack((l, np.zeros_like(l)))  # no re-gathers: nothing lags, one unit before U may do
    p2 = _least(p, l, F + e, ag.a, _walk(p, l, e_hi, 2) if r else free, d, win)
    return p1, p2


def _walk(p: Any, l: np.ndarray, e: np.ndarray, path: int) -> np.ndarray:
    """The greedy starts ``l_1 = l, l_2, ..`` of every chain (columns), a row per unit (at most
    :data:`_STEPS`); ``L`` once stuck for good (path 2), ``0`` once past the first module."""
    ag, rs, L, cm, cb = p.ag, p.rs, p.L, p.cm, p.cb
    out, pos = [l.astype(np.int64)], l.astype(np.int64)
    for step in range(1, _STEPS):  # the unit at position step + 1
        live = (pos > 0) & (pos < L)
        if not live.any():
            break
        with np.errstate(invalid="ignore", divide="ignore"):
            if path == 1:  # W(x..l-1) <= e + (p-1) a_rs + b_rs bytes(l_{p-1}..)
                room = e + step * rs.a + rs.b * (cm[L] - cm[pos])
                x = np.searchsorted(cb, cb[l] - room, side="left")
            else:  # (p-1) a_ag + b_ag bytes(x..l-1) <= e + W(l_{p-1}..)
                room = e + (cb[L] - cb[pos]) - step * ag.a
                x = np.searchsorted(cm, cm[l] - room / ag.b, "left") if ag.b > 0 else np.where(room < 0, L, 0)
        x = np.where(x < pos, x, pos if path == 1 else L)  # (1) may stand still, (2) stuck for good
        pos = np.where(live, x, pos)
        out.append(pos.copy())
    return np.array(out)


def _least(p: Any, l, c0, a: float, starts: np.ndarray, d: int, win: bool) -> np.ndarray:
    """``min`` over chains of ``c0 + a K(s)`` for every ``s``, ``K(s)`` the chain's count of units over
    ``s..L-1``: the first ``r`` whose start is ``<= s``, or (not there yet, not stuck) one more than it
    walked; at least two; with windows, ``r`` plus the window count before each start after ``s``."""
    L, cm = p.L, p.cm
    s = np.arange(L)
    n_rows = starts.shape[0]
    last = starts[-1]
    short = (last > 0) & (last < L)  # walked out of steps before the first module
    if not win:
        v = np.full(L + 1, np.inf)  # by the start reached: c0 + a r, a prefix minimum over s
        R = np.arange(1, n_rows + 1)[:, None]
        np.minimum.at(v, np.where(starts < L, starts, L).ravel(), (c0[None, :] + a * R).ravel())
        out = np.minimum.accumulate(v[:L])
        w = np.full(L + 1, np.inf)  # by the last start of a short chain: every s before it
        np.minimum.at(w, last[short], c0[short] + a * (n_rows + 1))
        out = np.minimum(out, np.minimum.accumulate(w[::-1])[::-1][1:])
        return np.maximum(out, np.min(c0) + 2 * a)  # two units at least (the next one is not the last)
    M, g = p.M, d + 1
    out = np.full(L, np.inf)
    for k in range(starts.shape[1]):  # one chain at a time: rows r, columns s
        st = starts[:, k]
        ok = st < L
        st, rr = st[ok], np.arange(1, n_rows + 1)[ok]
        after = st[:, None] > s[None, :]  # the r-th start is after s: units before it cover s..st-1
        n = np.maximum(g * (np.ceil((cm[st][:, None] - cm[s][None, :]) / M) - 1) + 1, 1.0)
        K = np.maximum(np.where(after, rr[:, None] + n, 0.0).max(axis=0), after.sum(axis=0) + 1)
        fine = (~after.all(axis=0) | short[k]) & (l[k] > s)  # reached s, or may still: else no plan
        out = np.minimum(out, np.where(fine, c0[k] + a * np.maximum(K, 2), np.inf))
    return out


def last_gather(p: Any, r: bool, d: int) -> np.ndarray | None:
    """``Phi[s]`` for ``s = 0..L-1``, seconds: the last unit ``U = l..L-1``'s all-gather is issued when
    unit ``K-d-1`` ends (``fsdp_model``'s ``G_K >= E_{K-d-1} + A_K``), so with the units ``K-d..K-1`` over
    modules ``l'..l-1`` (``s <= l' <= l - d``; with reshard the window ``bytes(l'..L-1) <= M``) the forward
    ends no sooner than ``E_k + F(s..l'-1) + A(U) + F(U)``: ``Phi[s]`` is the least of ``F(s..l'-1) + A(U) +
    F(U)``. Both ``F(s..l'-1)`` and the least ``A(U) + F(U)`` over ``l >= l' + d`` grow with ``l'``, so the
    least ``l'`` allowed gives it. ``None`` without a linear all-gather cost."""
    ag = p.ag
    if p.blocking or not isinstance(ag, LinearCost) or p.L < 2:
        return None
    L, cm, cf = p.L, p.cm, p.cf
    h = ag.a + ag.b * (cm[L] - cm[:L]) + (cf[L] - cf[:L])  # A(U) + F(U) by U's start
    hm = np.append(np.minimum.accumulate(h[::-1])[::-1], np.inf)  # least over l >= x (inf past L-1)
    lm = int(np.searchsorted(cm, cm[L] - p.M, side="left")) if r and np.isfinite(p.M) else 0
    x = np.maximum(np.arange(L), lm)  # the least l' allowed
    return cf[np.minimum(x, L)] - cf[:L] + hm[np.minimum(x + d, L)]
