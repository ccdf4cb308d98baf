"""One ``(depth, reshard)`` search of the FSDP plan: a dynamic program over module prefixes whose states are
heads and tails of the model's event graph, pruned by dominance and bounds, vectorised over all prefixes.

The model and its symbols are :mod:`dpcomm.planner.fsdp_model`'s; the states, their recurrences and the
proof that dominance keeps an optimal plan are :mod:`dpcomm.planner.fsdp_optimal`'s docstring, which also
runs this search over depths and reshard choices and widens it until the answer is exact (or within the
asked gap). What this module adds, ours:

- **Every prefix closed at once.** A state (the units so far, ending at module ``i``) is completed by one
  last unit ``i+1..L-1`` when it is made: a real plan (the incumbent tightens early), and the state's
  other completions are its extensions by units ``i+1..j`` with ``j <= L-2``.
- **Bounds that only grow.** The bound of a state ``X`` extended by unit ``s..j`` is taken at ``j = i``
  and holds for every ``j >= i`` (:mod:`dpcomm.planner.fsdp_state`, where the states' columns, the
  recurrence and the bound are); once it exceeds the incumbent, ``X`` leaves the active rows for
  good, as it does once unit ``s..i`` or its window no longer fits the budget (bytes only grow with ``i``).
- **Caps and certificates.** At most ``width`` new states per module (and ``8 width`` active rows, ``4
  width`` candidates for the dominance test) are kept, those of least bound: a beam. Every state dropped
  otherwise than by dominance (a cap, or a bound within ``slack`` of the incumbent) leaves its bound; the
  least of them and of the plans closed is :attr:`Found.bound`, a lower bound on this run's optimum.
- **Vectorised.** One step extends every active row at once (numpy over rows); dominance compares chunks
  of candidates with the kept rows one column at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcomm.planner.fsdp_model import TIE_REL, Units
from dpcomm.planner.fsdp_state import (
    Layout,
    Problem,
    close_states,
    completion_bound,
    extend_states,
    last_unit_tails,
)

__all__ = ["Found", "Problem", "root_bound", "search"]

SLACK = 1e-9
"""Relative: a bound compares DP sums against ``fsdp_time``'s, summed in another order."""

_CHUNK = 256  # candidates compared at once against the kept rows (a 256 x kept x columns array)


@dataclass(frozen=True, slots=True)
class Found:
    """A run's answer: the best plan it closed and a lower bound on its optimum (seconds, bytes)."""

    time_s: float
    """The best plan's ``t_iter`` (``inf``: none closed that fits)."""
    peak: float
    """Its peak (the largest window only where the peak is not a column)."""
    units: Units | None
    bound: float
    """No plan of this ``(d, reshard)`` under the budget is faster (``inf``: none fits)."""
    states: int
    """States kept over all modules."""
    capped: bool
    """Whether the caps dropped states (the bound is then what certifies the plan)."""


def _prune(Y: np.ndarray, lay: Layout) -> np.ndarray:
    """Rows of ``Y`` to keep: row ``j`` goes when an earlier row ``k`` (by the sort key, which ``k <= j``
    implies) has extra columns ``<=`` and ``max(h_k - h_j) + max(tau_k - tau_j) <= 0``, i.e. every
    completion of ``k`` is as fast as the same completion of ``j`` (dominance; transitive, so a row beaten
    by a dropped row is beaten by a kept one)."""
    n, nh, nt = Y.shape[0], lay.nh, lay.nt
    if n <= 1:
        return np.arange(n)
    order = np.argsort(Y[:, nh - 1] + Y[:, nh : nh + nt].max(axis=1), kind="stable")
    Z = Y[order]

    def beats(K, C):  # K x C, one column at a time (a K x C x columns array reduces slowly)
        dh = K[:, None, 0] - C[None, :, 0]
        for c in range(1, nh):
            np.maximum(dh, K[:, None, c] - C[None, :, c], out=dh)
        dt = K[:, None, nh] - C[None, :, nh]
        for c in range(nh + 1, nh + nt):
            np.maximum(dt, K[:, None, c] - C[None, :, c], out=dt)
        ok = dh + dt <= 0
        for c in range(nh + nt, Y.shape[1]):
            ok &= K[:, None, c] <= C[None, :, c]
        return ok

    kept = np.zeros(0, dtype=np.int64)
    for c0 in range(0, n, _CHUNK):
        C = Z[c0 : c0 + _CHUNK]
        dead = beats(Z[kept], C).any(axis=0) if kept.size else np.zeros(C.shape[0], dtype=bool)
        live = np.flatnonzero(~dead)
        if live.size > 1:
            dead[live[np.triu(beats(C[live], C[live]), 1).any(axis=0)]] = True
        kept = np.concatenate((kept, c0 + np.flatnonzero(~dead)))
    return order[kept]


def search(
    p: Problem,
    d: int,
    r: bool,
    *,
    ub: float,
    slack: float = 0.0,
    width: float = np.inf,
    peak: bool = False,
) -> Found:
    """The least ``t_iter`` (then peak) of depth ``d`` and reshard ``r`` under ``p.M``, and a bound.

    ``ub``: a feasible plan's time (``inf``: none). ``slack``: a state whose bound is within this many
    seconds of ``ub`` is dropped too (0: exact). ``width``: at most this many new states per module and
    ``8 width`` active rows, the others dropped (``inf``: no cap). Every state dropped but by dominance
    leaves its bound: :attr:`Found.bound`. ``peak``: keep the peak as a column and return the least peak
    of a plan within ``ub`` (each plan found lowers the budget below its peak); the caps keep the states of
    least peak floor (:func:`_peak_floor`), and :attr:`Found.capped` is false where none they dropped had a
    floor below the answer (proven all the same)."""
    L, M = p.L, p.M
    if not r and p.total > M:
        return Found(np.inf, np.inf, None, np.inf, 0, False)
    lay = Layout(d, p.blocking, windows=r and (M < p.total or peak), peak=peak, hsdp=p.ar is not None)
    tail = last_unit_tails(p, r, d)
    X = np.zeros((1, lay.width))  # the active rows: states, and where their next unit starts
    S = np.zeros(1, dtype=np.int64)
    ID = np.zeros(1, dtype=np.int64)  # row ids, for the units: parent row, first and last module
    parent, first, end = [np.array([-1])], [np.array([0])], [np.array([-1])]
    rows, capped = 1, False
    best = (np.inf, np.inf, -1)  # t_iter, peak, row closed
    bound = np.inf
    top = M  # peak mode: the most peak bytes a plan may still have (the best one's, less one byte)
    lw = _least_windows(p.cm, d) if peak else None
    low = np.inf  # peak mode: the least peak floor of a state the caps dropped

    def finish(Xn: np.ndarray, Sn: np.ndarray, IDn: np.ndarray) -> None:
        nonlocal best, ub, bound, top
        t, pk = close_states(p, lay, r, Xn, Sn)
        if peak:  # the least peak among plans within ub (ties: the least time); then only a smaller one
            t = np.where((t <= ub) & (pk <= top), t, np.inf)
            if t.size and np.isfinite(t).any():
                j = int(np.lexsort((t, np.where(np.isfinite(t), pk, np.inf)))[0])
                best, top = (float(t[j]), float(pk[j]), int(IDn[j])), float(pk[j]) - 1
            return
        if not t.size or (tmin := float(t.min())) == np.inf:
            return
        bound = min(bound, tmin)
        j = int(np.argmin(np.where(t <= tmin + TIE_REL * max(1.0, tmin), pk, np.inf)))
        tie = TIE_REL * max(1.0, best[0]) if best[0] < np.inf else 0.0
        if tmin < best[0] - tie or (tmin <= best[0] + tie and pk[j] < best[1]):
            best = (tmin, float(pk[j]), int(IDn[j]))
        ub = min(ub, tmin)

    def drop(lb: np.ndarray) -> None:
        nonlocal bound
        if lb.size:
            bound = min(bound, float(lb.min()))

    def cap(lb: np.ndarray, n: float, floor: np.ndarray | None) -> np.ndarray:
        """Indices of the ``n`` least bounds (peak mode: least peak floors) that stay; the others are
        dropped, leaving their bounds (and peak floors)."""
        nonlocal capped, low
        if lb.size <= n:
            return np.arange(lb.size)
        o = np.argsort(lb if floor is None else floor + lb / max(ub, 1e-300), kind="stable")
        drop(lb[o[int(n) :]])
        if floor is not None:
            low = min(low, float(floor[o[int(n) :]].min()))
        capped = True
        return o[: int(n)]

    finish(X, S, ID)
    for i in range(L - 1):
        Y, parts = extend_states(p, lay, r, X, S, i, False)
        lb = completion_bound(p, lay, X, S, i, Y, parts, tail)
        fits = (parts[0] <= M) & (parts[7] <= M) if r else np.ones(lb.size, dtype=bool)  # never again
        grow = new_floor = None
        if peak:  # the peak of every extension of a row is at least grow, of each new state new_floor
            grow = np.maximum(Y[:, lay.pk], lw[S])
            new_floor = _peak_floor(p, lay, Y, i + 1, lw)
            fits &= grow <= top
        alive = fits & (lb <= (ub * (1 + SLACK) if slack <= 0 else ub - slack))
        drop(lb[fits & ~alive])
        idx = np.flatnonzero(alive)
        idx = idx[cap(lb[idx], 8 * width, None if grow is None else grow[idx])]  # the active rows
        alive[:] = False
        alive[idx] = True
        if peak:
            idx = idx[new_floor[idx] <= top]
        at = None if new_floor is None else new_floor[idx]
        idx = idx[cap(lb[idx], 4 * width, at)]  # the candidates for the dominance test
        keep = _prune(Y[idx], lay)
        keep = keep[cap(lb[idx[keep]], width, None if at is None else new_floor[idx[keep]])]  # new states
        new = np.arange(rows, rows + keep.size)
        rows += keep.size
        parent.append(ID[idx[keep]])
        first.append(S[idx[keep]])
        end.append(np.full(keep.size, i))
        Yk, Sk = Y[idx[keep]], np.full(keep.size, i + 1)
        X = np.concatenate((X[alive], Yk))
        S = np.concatenate((S[alive], Sk))
        ID = np.concatenate((ID[alive], new))
        finish(Yk, Sk, new)
    if peak:  # no state the caps dropped could have made a plan of less peak: proven all the same
        capped &= not best[1] <= low
    if best[2] < 0:
        return Found(np.inf, np.inf, None, bound, rows - 1, capped)
    par, fst, nd = (np.concatenate(x) for x in (parent, first, end))
    row = best[2]
    units = [(int(nd[row]) + 1, L - 1)]
    while row > 0:
        units.append((int(fst[row]), int(nd[row])))
        row = int(par[row])
    return Found(best[0], best[1], units[::-1], min(bound, best[0]), rows - 1, capped)


def root_bound(p: Problem, d: int, r: bool) -> float:
    """A lower bound on every plan of depth ``d`` and reshard ``r`` under ``p.M`` (``inf``: none fits):
    the one-unit plan and the bound of the empty prefix."""
    if not r and p.total > p.M:
        return np.inf
    lay = Layout(d, p.blocking, windows=False, peak=False, hsdp=p.ar is not None)
    X, s = np.zeros((1, lay.width)), np.zeros(1, dtype=np.int64)
    t, _ = close_states(p, lay, r, X, s)
    if p.L == 1:
        return float(t[0])
    Y, parts = extend_states(p, lay, r, X, s, 0, False)
    if r and parts[0][0] > p.M:
        return np.inf  # the first module alone does not fit
    return float(min(t[0], completion_bound(p, lay, X, s, 0, Y, parts, last_unit_tails(p, r, d))[0]))


def _least_windows(cm: np.ndarray, d: int) -> np.ndarray:
    """``lw[s]``: the least peak of any units covering modules ``s..L-1`` (``lw[L] = 0``), bytes: the unit
    holding module ``j`` and the ``d`` after it hold modules ``j..j+d`` at least, so a window is at least
    ``bytes(j..min(j+d, L-1))`` for every ``j >= s``."""
    L = cm.size - 1
    j = np.arange(L)
    w = cm[np.minimum(j + d + 1, L)] - cm[j]
    return np.concatenate((np.maximum.accumulate(w[::-1])[::-1], [0.0]))


def _peak_floor(p: Problem, lay: Layout, Y: np.ndarray, s: int, lw: np.ndarray) -> np.ndarray:
    """A lower bound on the peak of every completion of the states ``Y`` (next unit at module ``s``), bytes:
    their peak so far, the least windows of the rest (:func:`_least_windows`), and the windows that start
    at one of their last ``q`` units (``w_q`` bytes) and hold at least modules ``s..s+d-q`` after it."""
    out = np.maximum(Y[:, lay.pk], lw[s])
    L, cm = p.L, p.cm
    for q in range(1, lay.nw + 1):
        out = np.maximum(out, Y[:, lay.w + q - 1] + cm[min(s + lay.d + 1 - q, L)] - cm[s])
    return out
