"""The states of the FSDP plan search and their bounds: columns, the recurrence that adds a unit, the plan
that closes a prefix, and a lower bound on every completion of a prefix.

The states and recurrences are :mod:`dpcomm.planner.fsdp_optimal`'s docstring (the model's,
:mod:`dpcomm.planner.fsdp_model`, with HSDP's all-reduce: one more tail, ``sum C``, and ``y_{p-1} = R +
max(y_p, C + sum C)`` for the reduce-scatter tail); :mod:`dpcomm.planner.fsdp_search` runs them. Ours.

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
rest's start-ups are left out to keep it so. HSDP adds the all-reduce chain after the last unit's
backward (``sum C + b_ar bytes(rest)``, and a second joint term with ``U``'s reduce-scatter and every
all-reduce in place of every reduce-scatter). With ``overlap="gathers"`` the backward is ``b + max(W(s..L-1),
a_d) + R(s..i) + b_rs bytes(rest)`` (HSDP: ``R + C``) and there is no joint term. A unit's fixed cost
``c`` (:class:`Problem`'s ``c``) is in the ``F`` and ``W`` of every unit added; the bound leaves it out for
the units still to come (``t_iter`` only grows with it, so the bound holds).

More paths, each a bound of its own (issue 57: the ones above were tight at one compute/communication ratio
only): ``joint`` again with the forward's compute chain in place of the reduce-scatters (``F(U) +
W(s..L-1) + tau(BE)``: a small ``U`` for this path, a large one for the re-gathers, the same ``U``); the
all-gather start-ups of the units after the next one (:func:`units_after`: budget windows force a count);
the pipelines' units and lags of :mod:`dpcomm.planner.fsdp_ramp` (``P1``, ``P2``); and the last unit's
gather, issued ``d`` units before it (:func:`dpcomm.planner.fsdp_ramp.last_gather`), then every backward.
``tests/test_fsdp_ramp.py`` checks every prefix's bound against its best completion by brute force.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.planner.fsdp_bound import suffix_bound
from dpcomm.planner.fsdp_ramp import last_gather, ramp_bounds

__all__ = [
    "Layout",
    "Problem",
    "close_states",
    "completion_bound",
    "costs",
    "extend_states",
    "last_unit_tails",
]


def costs(cost: CommCost, nbytes: np.ndarray) -> np.ndarray:
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
    ar: CommCost | None = None
    """HSDP: the all-reduce of a unit's shard across the replicas (``None``: FSDP)."""
    c: float = 0.0
    """Each unit's fixed cost per pass, seconds (``unit_s``: added to its ``F`` and ``W``)."""
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """What the runs share: :func:`last_unit_tails`' suffix bounds by ``(reshard, budget)``."""

    @classmethod
    def of(
        cls, f, b, m, ag, rs, *, memory: float, update_s: float, blocking: bool, ar=None, unit_s: float = 0.0
    ) -> Problem:
        cf, cb, cm = (np.concatenate(([0.0], np.cumsum(x))) for x in (f, b, m))
        return cls(cf, cb, cm, ag, rs, float(memory), float(update_s), bool(blocking), ar, float(unit_s))

    @property
    def L(self) -> int:
        return self.cm.size - 1

    @property
    def total(self) -> float:
        return float(self.cm[-1])

    def rate(self, cost: CommCost) -> float:
        """Seconds per byte that any split of bytes into units costs at least (start-ups aside)."""
        return float(cost.b) if isinstance(cost, LinearCost) else 0.0


class Layout:
    """Columns of a state: heads ``h``, tails ``t``, extra (re-gathers ``a`` under ``gathers``, windows
    ``w``, peak), compared by ``<=`` only."""

    def __init__(self, d: int, blocking: bool, windows: bool, peak: bool, hsdp: bool = False) -> None:
        self.d = d
        self.nh = d + 1  # H_0 (= max(G_k, E_{k-d})), E_{k-d+1} .. E_k   (d = 0: E_k)
        self.nt = 1 if blocking else (2 if d == 0 else d + 2)  # b | y, g | y, T, g_p .. g_{p+d-1}
        self.H, self.T = 0, self.nh
        self.c = self.T + self.nt  # HSDP: sum C, the all-reduces' tail (streams)
        self.nt += int(hsdp and not blocking)
        self.a = self.T + self.nt  # a_1 .. a_d (gathers)
        self.w = self.a + (d if blocking else 0)  # w_1 .. w_d
        self.nw = d if windows else 0
        self.pk = self.w + self.nw
        self.width = self.pk + int(peak)
        self.g = self.T if blocking else (self.T + 1 if d == 0 else self.T + 2)
        """The column that closes the plan: ``t_iter = E_K + X[g] + u``."""


def extend_states(p: Problem, lay: Layout, r: bool, X: np.ndarray, s: np.ndarray, i: int, last: bool):
    """States of rows ``X`` (next unit starting at ``s``) extended by unit ``s..i``: ``(Y, parts)``."""
    d, H, T = lay.d, lay.H, lay.T
    B = p.cm[i + 1] - p.cm[s]
    F, W = p.cf[i + 1] - p.cf[s] + p.c, p.cb[i + 1] - p.cb[s] + p.c  # the unit's fixed cost, each pass
    A, R = costs(p.ag, B), costs(p.rs, B)
    C = None if p.ar is None else costs(p.ar, B)
    if p.blocking and C is not None:
        R = R + C  # the all-reduce blocks the thread after the reduce-scatter, on the same link
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
        Y[:, T] = R + (X[:, T] if C is None else np.maximum(X[:, T], C + X[:, lay.c]))
        if C is not None:
            Y[:, lay.c] = C + X[:, lay.c]
        tBE = np.maximum(Y[:, T], X[:, T + 1])  # tau(BE), through T = max(tau(BS_p), g_{p+d})
        tBS = W + tBE
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


def completion_bound(
    p: Problem, lay: Layout, X: np.ndarray, s: np.ndarray, i: int, Y: np.ndarray, parts, tail
) -> np.ndarray:
    """The bound of each row over its extensions by non-last units ``s..j``, ``j >= i`` (module docstring);
    ``tail``: :func:`last_unit_tails`."""
    B, A, R, Ap, G, Ek, tBE, _ = parts
    L, d, T = p.L, lay.d, lay.T
    rest = p.total - p.cm[i + 1]
    rate_c = 0.0 if p.ar is None else p.rate(p.ar)
    gathers = G + p.rate(p.ag) * rest + _start_ups(p, lay, X, s)  # the all-gather stream's chain
    fwd = np.maximum(np.maximum(Ek, G) + (p.cf[L] - p.cf[s]), gathers + p.cf[L] - p.cf[L - 1])
    b_last = p.cb[L] - p.cb[L - 1]
    if p.blocking:
        ahead = X[:, lay.a + d - 1] if d else Ap
        bwd = X[:, T] + (np.maximum(p.cb[L] - p.cb[s], ahead) if d else p.cb[L] - p.cb[s] + Ap) + R
        return fwd + bwd + (p.rate(p.rs) + rate_c) * rest + p.u
    g = Y[:, T + 1] if d == 0 else Y[:, T + 2]
    bwd = np.maximum(np.maximum((p.cb[L] - p.cb[s]) + tBE, g), Y[:, T] + p.rate(p.rs) * rest + b_last)
    if p.ar is not None:  # the all-reduce stream, after the last unit's backward
        bwd = np.maximum(bwd, Y[:, lay.c] + rate_c * rest + b_last)
    # the forward's all-gathers and last unit U, then the reduce-scatters after U's backward (HSDP: or
    # U's reduce-scatter and every all-reduce), or every re-gather but U's and this unit's chain g: the
    # same U for both, the least over the U that fit
    lo = max(i + 1, tail[0][4])
    if lo > L - 1:
        return np.full(G.size, np.inf)
    c2 = g + (p.rate(p.ag) * rest if tail[0][5] else 0.0)
    both = _joint(Y[:, T] + p.rate(p.rs) * rest, c2, tail[0], lo, L)
    if tail[1] is not None:
        both = np.maximum(both, _joint(Y[:, lay.c] + rate_c * rest, c2, tail[1], lo, L))
    # or U's forward then every backward and the tail after the next unit's (the compute chain): the least
    # last unit for the re-gathers is a large one, for this path a small one
    both = np.maximum(both, _joint((p.cb[L] - p.cb[s]) + tBE, c2, tail[4], lo, L))
    out = np.maximum(fwd + bwd, gathers + both) + p.u
    if tail[2] is not None:  # the paths through every unit of the rest, start-ups counted
        out = np.maximum(out, X[:, lay.H] + X[:, T] + tail[2][s] + p.u)
    p1, p2 = tail[3]  # the units the pipelines force (fsdp_ramp): reduce-scatters, then re-gathers
    S = p.total - p.cm[s]
    if p1 is not None:
        out = np.maximum(out, X[:, lay.H] + X[:, T] + (p.ag.b + p.rs.b) * S + p1[s] + p.u)
    if p2 is not None:
        out = np.maximum(out, X[:, lay.H] + p.ag.b * S + (p.cb[L] - p.cb[s]) + tBE + p2[s] + p.u)
    if tail[5] is not None:  # the last unit's gather, issued d units before it (fsdp_ramp.last_gather),
        # then every backward; a rest of K_s <= d units issues it at the prefix's head E_{k+K_s-d-1}
        late = X[:, lay.H + d] + tail[5][s]
        if d >= 2:
            least = p.ag.a + p.ag.b * (p.cm[L] - p.cm[L - 1]) + p.cf[L] - p.cf[L - 1]  # the least A(U) + F(U)
            few = X[:, lay.H + 1 : lay.H + d].min(axis=1) + least
            if lay.nw:  # the prefix's last unit's window holds all K_s <= d units of the rest
                few = np.where(X[:, lay.w] + S <= p.M, few, np.inf)
            late = np.minimum(late, few)
        out = np.maximum(out, late + (p.cb[L] - p.cb[s]) + tBE + p.u)
    return out


def _joint(c1: np.ndarray, c2: np.ndarray, tail, lo: int, L: int) -> np.ndarray:
    """``min_{lo <= l <= L-1} max(c1 + x1[l], c2 + x2[l])`` per row: ``x1 - x2`` falls with ``l``, so the
    first term is the larger from ``l = lo`` up to a cut (binary search), where ``x1`` is least at the cut,
    and the second beyond it, where a suffix minimum of ``x2`` answers."""
    x1, _, D, low, _, _ = tail
    cut = np.maximum(L - np.searchsorted(D[::-1], c2 - c1, side="left"), lo)  # c2 + x2 larger from cut on
    return np.minimum(np.where(cut <= L - 1, c2 + low[np.minimum(cut, L - 1)], np.inf),
                      np.where(cut - 1 >= lo, c1 + x1[np.maximum(cut - 1, 0)], np.inf))  # fmt: skip


def _last_units(p: Problem, r: bool, extra: float = 0.0, back: bool = True):
    """Per start ``l`` of the last unit ``U = l..L-1``: ``x1 = F(U) + W(U) + extra B(U)``, ``x2 = F(U) -
    b_ag B(U)`` (reshard: ``U`` is not re-gathered; else ``F(U)``), ``D = x1 - x2`` (non-increasing in
    ``l``), the least ``x2`` over ``l' >= l``, the least ``l`` whose ``U`` fits the budget, and ``r``."""
    Bu = p.total - p.cm[:-1]
    F, W = p.cf[-1] - p.cf[:-1], p.cb[-1] - p.cb[:-1]
    x1 = F + (W if back else 0.0) + extra * Bu
    x2 = F - (p.rate(p.ag) * Bu if r else 0.0)
    fit = np.flatnonzero(Bu <= p.M) if r else np.arange(Bu.size)
    low = np.minimum.accumulate(x2[::-1])[::-1]
    return x1, x2, x1 - x2, low, int(fit[0]) if fit.size else p.L, r


def last_unit_tails(p: Problem, r: bool, d: int):
    """:func:`_last_units` for the reduce-scatter path and (HSDP) the all-reduce path,
    :func:`dpcomm.planner.fsdp_bound.suffix_bound` (or None) and :func:`dpcomm.planner.fsdp_ramp.ramp_bounds`
    (a pair, each or None)."""
    key, ramps = (r, p.M), ("ramps", r, d if r and np.isfinite(p.M) else -1, p.M)  # d: windows only
    if key not in p.memo:
        p.memo[key] = suffix_bound(p, r)
    if ramps not in p.memo:
        p.memo[ramps] = ramp_bounds(p, r, d)
    issue = ("issue", r, d, p.M)
    if issue not in p.memo:
        p.memo[issue] = last_gather(p, r, d)
    return (_last_units(p, r), None if p.ar is None else _last_units(p, r, p.rate(p.rs)), p.memo[key],
            p.memo[ramps], _last_units(p, r, back=False), p.memo[issue])  # fmt: skip


def close_states(p: Problem, lay: Layout, r: bool, X: np.ndarray, s: np.ndarray):
    """``(t_iter, peak)`` of each row closed by one last unit ``s..L-1`` (``inf`` where it does not fit)."""
    Y, parts = extend_states(p, lay, r, X, s, p.L - 1, True)
    t = Y[:, lay.H + lay.d] + Y[:, lay.g] + p.u
    B, window = parts[0], parts[7]
    if r:
        t = np.where((B <= p.M) & (window <= p.M), t, np.inf)
        peak = Y[:, lay.pk] if lay.width > lay.pk else window
    else:
        peak = np.full(t.size, p.total)
    return t, peak


def _start_ups(p: Problem, lay: Layout, X: np.ndarray, s: np.ndarray) -> np.ndarray | float:
    """Seconds of all-gather start-ups that every completion of rows ``X`` (next unit from ``s``) has
    after its next unit: ``a_ag`` times the least number of units after it (:func:`units_after`), taken
    after the longest next unit that fits (``bytes + w_d <= M``), so that it holds for every one."""
    ag = p.ag
    if not isinstance(ag, LinearCost) or ag.a <= 0 or not lay.nw or not np.isfinite(p.M):
        return 0.0
    n = units_after(p, lay.d)
    room = p.M - X[:, lay.w + lay.d - 1]  # what the next unit may hold (its window)
    j = np.searchsorted(p.cm, p.cm[s] + room, side="right") - 1  # modules s..j-1 fit: next unit ends j-1
    return ag.a * n[np.clip(j, 0, p.L - 1)]


def units_after(p: Problem, d: int) -> np.ndarray:
    """``n[j]``: the least number of units over modules ``j..L-1`` (``n[L] = 0``) with reshard under the
    budget ``M``: consecutive runs of ``d + 1`` units are windows (at most ``M`` bytes), so ``ceil(n / (d +
    1))`` runs of at most ``M`` bytes cover them, at least ``g[j]`` (the fewest runs of whole modules of at
    most ``M`` bytes, packed greedily: optimal for one capacity), and ``n >= (d + 1) (g - 1) + 1``."""
    key = ("units_after", d, p.M)
    if key not in p.memo:
        L, cm = p.L, p.cm
        e = np.searchsorted(cm, cm[:-1] + p.M, side="right") - 1  # a run from j holds modules j..e-1
        g = np.zeros(L + 1)
        for j in range(L - 1, -1, -1):
            g[j] = np.inf if e[j] <= j else 1 + g[e[j]]
        p.memo[key] = np.where(g > 0, (d + 1) * (g - 1) + 1, 0.0)
    return p.memo[key]
