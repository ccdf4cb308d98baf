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
  and holds for every ``j >= i`` (below); once it exceeds the incumbent, ``X`` leaves the active rows for
  good, as it does once unit ``s..i`` or its window no longer fits the budget (bytes only grow with ``i``).
- **Caps and certificates.** At most ``width`` new states per module (and ``8 width`` active rows, ``4
  width`` candidates for the dominance test) are kept, those of least bound: a beam. Every state dropped
  otherwise than by dominance (a cap, or a bound within ``slack`` of the incumbent) leaves its bound; the
  least of them and of the plans closed is :attr:`Found.bound`, a lower bound on this run's optimum.
- **Vectorised.** One step extends every active row at once (numpy over rows); dominance compares chunks
  of candidates with the kept rows one column at a time.

Bound of ``X`` (heads ``h``, tails ``tau``, ``s = i_X + 1``) over every extension by a non-last unit
``s..j``, ``j >= i``, then units ``V`` of which ``U = l..L-1`` is the last (``rest`` = modules after
``i``; ``b_ag``, ``b_rs`` the costs' bytes rates where they are
:class:`~dpcomm.costmodel.base.LinearCost`, else 0; ``G = H_0 + A(s..i)``, ``g = g_{p-1}`` and
``sum R`` the new state's)::

    forward    max( max(E_k, G) + F(s..L-1),  G + b_ag bytes(rest) + f_{L-1} )
    backward   max( W(s..L-1) + tau(BE_{p-1}),  g,  sum R + b_rs bytes(rest) + b_{L-1} )
    joint      G + b_ag bytes(rest) + min_U max( F(U) + W(U) + sum R + b_rs bytes(rest),
                                                 F(U) + g + b_ag (bytes(rest) - bytes(U)) )
    bound = max(forward + backward, joint) + u

``forward + backward``: the forward's compute and all-gather stream, then the backward's compute,
re-gather and reduce-scatter chains, must all still run (``t_iter = E_K + g_1 + u``). ``joint``: the
all-gathers run in a chain and the last unit ``U`` after them; then either ``U``'s backward and every
reduce-scatter, or (with reshard, where ``U`` is not re-gathered) every other re-gather and this unit's
chain ``g`` -- the same ``U`` for both, over the ``U`` that fit the budget. With ``x1 = F(U) + W(U)``
and ``x2 = F(U) - b_ag bytes(U)``, ``x1 - x2`` falls as ``l`` grows, so the first term is the larger
exactly for the ``U`` longer than a cut found by one binary search per row; there ``x1`` is least at the
cut, and beyond it a suffix minimum of ``x2`` answers (:func:`_last_units`). Each term is
non-decreasing in ``j`` (``A``, ``R`` and bytes are; ``A(s..j) + b bytes(rest)`` is constant for linear
costs; the ``U`` after ``j`` are fewer), so the bound at ``j = i`` holds for every ``j >= i``; the
rest's start-ups are left out to keep it so. With ``overlap="gathers"`` the backward is
``b + max(W(s..L-1), a_d) + R(s..i) + b_rs bytes(rest)`` and there is no joint term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.planner.fsdp_model import TIE_REL, Units

__all__ = ["Found", "Problem", "root_bound", "search"]

SLACK = 1e-9
"""Relative: a bound compares DP sums against ``fsdp_time``'s, summed in another order."""

_CHUNK = 256  # candidates compared at once against the kept rows (a 256 x kept x columns array)


def _costs(cost: CommCost, nbytes: np.ndarray) -> np.ndarray:
    many = getattr(cost, "many", None)
    if callable(many):
        return np.asarray(many(nbytes), dtype=float)
    return np.vectorize(lambda x: float(cost(float(x))), otypes=[float])(nbytes)


@dataclass(frozen=True, slots=True)
class Problem:
    """What every run shares: prefix sums of checked inputs (seconds, bytes), costs, budget, step."""

    cf: np.ndarray
    cb: np.ndarray
    cm: np.ndarray
    ag: CommCost
    rs: CommCost
    M: float
    """The budget of unsharded bytes (``inf``: none)."""
    u: float
    blocking: bool
    """``overlap="gathers"``: reduce-scatters block the thread (:mod:`dpcomm.planner.fsdp_model`)."""

    @classmethod
    def of(cls, f, b, m, ag, rs, *, memory: float, update_s: float, blocking: bool) -> Problem:
        cf, cb, cm = (np.concatenate(([0.0], np.cumsum(x))) for x in (f, b, m))
        return cls(cf, cb, cm, ag, rs, float(memory), float(update_s), bool(blocking))

    @property
    def L(self) -> int:
        return self.cm.size - 1

    @property
    def total(self) -> float:
        return float(self.cm[-1])

    def rate(self, cost: CommCost) -> float:
        """Seconds per byte that any split of bytes into units costs at least (start-ups aside)."""
        return float(cost.b) if isinstance(cost, LinearCost) else 0.0


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


class _Layout:
    """Columns of a state: heads ``h``, tails ``t``, extra (re-gathers ``a`` under ``gathers``, windows
    ``w``, peak), compared by ``<=`` only."""

    def __init__(self, d: int, blocking: bool, windows: bool, peak: bool) -> None:
        self.d = d
        self.nh = d + 1  # H_0 (= max(G_k, E_{k-d})), E_{k-d+1} .. E_k   (d = 0: E_k)
        self.nt = 1 if blocking else (2 if d == 0 else d + 2)  # b | sum R, g | sum R, T, g_p .. g_{p+d-1}
        self.H, self.T = 0, self.nh
        self.a = self.T + self.nt  # a_1 .. a_d (gathers)
        self.w = self.a + (d if blocking else 0)  # w_1 .. w_d
        self.nw = d if windows else 0
        self.pk = self.w + self.nw
        self.width = self.pk + int(peak)
        self.g = self.T if blocking else (self.T + 1 if d == 0 else self.T + 2)
        """The column that closes the plan: ``t_iter = E_K + X[g] + u``."""


def _extend(p: Problem, lay: _Layout, r: bool, X: np.ndarray, s: np.ndarray, i: int, last: bool):
    """States of rows ``X`` (next unit starting at ``s``) extended by unit ``s..i``: ``(Y, parts)``."""
    d, H, T = lay.d, lay.H, lay.T
    B = p.cm[i + 1] - p.cm[s]
    F, W = p.cf[i + 1] - p.cf[s], p.cb[i + 1] - p.cb[s]
    A, R = _costs(p.ag, B), _costs(p.rs, B)
    Ap = A if r and not last else np.zeros_like(A)
    n = X.shape[0]
    Y = np.empty((n, lay.width))
    G = X[:, H] + A
    Ek = X[:, H + d]
    En = np.maximum(Ek, G) + F
    if d == 0:
        Y[:, H] = En
    else:
        Y[:, H] = np.maximum(G, X[:, H + 1])
        Y[:, H + 1 : H + d] = X[:, H + 2 : H + d + 1]
        Y[:, H + d] = En
    if p.blocking:
        if d == 0:
            Y[:, T] = X[:, T] + Ap + W + R
        else:
            ahead = X[:, lay.a : lay.a + d].sum(axis=1) if last else X[:, lay.a + d - 1]
            Y[:, T] = X[:, T] + np.maximum(W, ahead) + R
            Y[:, lay.a] = Ap
            Y[:, lay.a + 1 : lay.a + d] = X[:, lay.a : lay.a + d - 1]
        tBE = None
    else:
        tBE = np.maximum(R + X[:, T], X[:, T + 1])  # tau(BE), through T = max(tau(BS_p), g_{p+d})
        tBS = W + tBE
        Y[:, T] = X[:, T] + R
        if d == 0:
            Y[:, T + 1] = Ap + tBS
        else:
            Y[:, T + 1] = np.maximum(tBS, X[:, T + 1 + d])
            Y[:, T + 2] = Ap + np.maximum(tBS, X[:, T + 2])
            Y[:, T + 3 : T + 2 + d] = X[:, T + 2 : T + 1 + d]
    window = B + (X[:, lay.w + d - 1] if lay.nw else 0.0)
    if lay.nw:
        Y[:, lay.w] = B
        Y[:, lay.w + 1 : lay.w + d] = B[:, None] + X[:, lay.w : lay.w + d - 1]
    if lay.width > lay.pk:
        Y[:, lay.pk] = np.maximum(X[:, lay.pk], window) if r else p.total
    return Y, (B, A, R, Ap, G, Ek, tBE, window)


def _bound(
    p: Problem, lay: _Layout, X: np.ndarray, s: np.ndarray, i: int, Y: np.ndarray, parts, tail
) -> np.ndarray:
    """The bound of each row over its extensions by non-last units ``s..j``, ``j >= i`` (module docstring);
    ``tail``: :func:`_last_units`."""
    B, A, R, Ap, G, Ek, tBE, _ = parts
    L, d, T = p.L, lay.d, lay.T
    rest = p.total - p.cm[i + 1]
    fwd = np.maximum(np.maximum(Ek, G) + (p.cf[L] - p.cf[s]), G + p.rate(p.ag) * rest + p.cf[L] - p.cf[L - 1])
    b_last = p.cb[L] - p.cb[L - 1]
    if p.blocking:
        ahead = X[:, lay.a + d - 1] if d else Ap
        bwd = X[:, T] + (np.maximum(p.cb[L] - p.cb[s], ahead) if d else p.cb[L] - p.cb[s] + Ap) + R
        return fwd + bwd + p.rate(p.rs) * rest + p.u
    g = Y[:, T + 1] if d == 0 else Y[:, T + 2]
    bwd = np.maximum(np.maximum((p.cb[L] - p.cb[s]) + tBE, g), Y[:, T] + p.rate(p.rs) * rest + b_last)
    # the forward's all-gathers and last unit U, then the reduce-scatters after U's backward, or every
    # re-gather but U's and the rest of the current unit's backward: U the same for both
    x1, x2, D, low, l_fit, r = tail
    lo = max(i + 1, l_fit)
    if lo > L - 1:
        return np.full(G.size, np.inf)
    c1 = Y[:, T] + p.rate(p.rs) * rest
    c2 = g + (p.rate(p.ag) * rest if r else 0.0)
    cut = np.maximum(L - np.searchsorted(D[::-1], c2 - c1, side="left"), lo)  # U = cut..: c2 + x2 is larger
    both = np.minimum(np.where(cut <= L - 1, c2 + low[np.minimum(cut, L - 1)], np.inf),
                      np.where(cut - 1 >= lo, c1 + x1[np.maximum(cut - 1, 0)], np.inf))  # fmt: skip
    return np.maximum(fwd + bwd, G + p.rate(p.ag) * rest + both) + p.u


def _last_units(p: Problem, r: bool):
    """Per start ``l`` of the last unit ``U = l..L-1``: ``x1 = F(U) + W(U)``, ``x2 = F(U) - b_ag B(U)``
    (reshard: ``U`` is not re-gathered; else ``F(U)``), ``D = x1 - x2`` (non-increasing in ``l``), the
    least ``x2`` over ``l' >= l``, and the least ``l`` whose ``U`` fits the budget."""
    Bu = p.total - p.cm[:-1]
    F, W = p.cf[-1] - p.cf[:-1], p.cb[-1] - p.cb[:-1]
    x2 = F - (p.rate(p.ag) * Bu if r else 0.0)
    fit = np.flatnonzero(Bu <= p.M) if r else np.arange(Bu.size)
    low = np.minimum.accumulate(x2[::-1])[::-1]
    return F + W, x2, W + (F - x2), low, int(fit[0]) if fit.size else p.L, r


def _close(p: Problem, lay: _Layout, r: bool, X: np.ndarray, s: np.ndarray):
    """``(t_iter, peak)`` of each row closed by one last unit ``s..L-1`` (``inf`` where it does not fit)."""
    Y, parts = _extend(p, lay, r, X, s, p.L - 1, True)
    t = Y[:, lay.H + lay.d] + Y[:, lay.g] + p.u
    B, window = parts[0], parts[7]
    if r:
        t = np.where((B <= p.M) & (window <= p.M), t, np.inf)
        peak = Y[:, lay.pk] if lay.width > lay.pk else window
    else:
        peak = np.full(t.size, p.total)
    return t, peak


def _prune(Y: np.ndarray, lay: _Layout) -> np.ndarray:
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
    leaves its bound: :attr:`Found.bound`. ``peak``: keep the peak as a column, so that among plans within a
    tie the least peak is found."""
    L, M = p.L, p.M
    if not r and p.total > M:
        return Found(np.inf, np.inf, None, np.inf, 0, False)
    lay = _Layout(d, p.blocking, windows=r and (M < p.total or peak), peak=peak)
    tail = _last_units(p, r)
    X = np.zeros((1, lay.width))  # the active rows: states, and where their next unit starts
    S = np.zeros(1, dtype=np.int64)
    ID = np.zeros(1, dtype=np.int64)  # row ids, for the units: parent row, first and last module
    parent, first, end = [np.array([-1])], [np.array([0])], [np.array([-1])]
    rows, capped = 1, False
    best = (np.inf, np.inf, -1)  # t_iter, peak, row closed
    bound = np.inf

    def close(Xn: np.ndarray, Sn: np.ndarray, IDn: np.ndarray) -> None:
        nonlocal best, ub, bound
        t, pk = _close(p, lay, r, Xn, Sn)
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

    def cap(lb: np.ndarray, n: float) -> np.ndarray:
        """Indices of the ``n`` least bounds (all, when no more); the others are dropped."""
        nonlocal capped
        if lb.size <= n:
            return np.arange(lb.size)
        o = np.argsort(lb, kind="stable")
        drop(lb[o[int(n) :]])
        capped = True
        return o[: int(n)]

    close(X, S, ID)
    for i in range(L - 1):
        Y, parts = _extend(p, lay, r, X, S, i, False)
        lb = _bound(p, lay, X, S, i, Y, parts, tail)
        fits = (parts[0] <= M) & (parts[7] <= M) if r else np.ones(lb.size, dtype=bool)  # never again
        alive = fits & (lb <= (ub * (1 + SLACK) if slack <= 0 else ub - slack))
        drop(lb[fits & ~alive])
        idx = np.flatnonzero(alive)
        idx = idx[cap(lb[idx], 8 * width)]  # the active rows: the least bounds stay
        alive[:] = False
        alive[idx] = True
        idx = idx[cap(lb[idx], 4 * width)]  # the candidates for the dominance test
        keep = _prune(Y[idx], lay)
        keep = keep[cap(lb[idx[keep]], width)]  # the new states
        new = np.arange(rows, rows + keep.size)
        rows += keep.size
        parent.append(ID[idx[keep]])
        first.append(S[idx[keep]])
        end.append(np.full(keep.size, i))
        Yk, Sk = Y[idx[keep]], np.full(keep.size, i + 1)
        X = np.concatenate((X[alive], Yk))
        S = np.concatenate((S[alive], Sk))
        ID = np.concatenate((ID[alive], new))
        close(Yk, Sk, new)
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
    lay = _Layout(d, p.blocking, windows=False, peak=False)
    X, s = np.zeros((1, lay.width)), np.zeros(1, dtype=np.int64)
    t, _ = _close(p, lay, r, X, s)
    if p.L == 1:
        return float(t[0])
    Y, parts = _extend(p, lay, r, X, s, 0, False)
    if r and parts[0][0] > p.M:
        return np.inf  # the first module alone does not fit
    return float(min(t[0], _bound(p, lay, X, s, 0, Y, parts, _last_units(p, r))[0]))
