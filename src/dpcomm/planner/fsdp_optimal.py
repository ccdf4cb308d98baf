"""The FSDP plan of least modelled ``t_iter`` over units, prefetch depths and reshard choices under a memory
budget: exact, or within a relative ``gap`` of a certified lower bound, by a dynamic program over module
prefixes with dominance, bounds and caps that widen until the answer is proven.

The model, its symbols and equations are :mod:`dpcomm.planner.fsdp_model`'s; this search is ours
(``optimal`` in :func:`dpcomm.planner.fsdp.plan_fsdp`); one ``(d, reshard)`` run is
:func:`dpcomm.planner.fsdp_search.search`. For each depth ``d`` in ``0..D`` and each reshard choice it
finds the least ``t_iter`` (ties: the least peak memory) over all ``2^(L-1)`` partitions into units whose
peak fits the budget ``M``; the best of the ``2(D+1)`` answers is the plan.

Why one scalar per prefix is not enough (as it is for MG-WFBP's and iBatch's programs): ``t_iter = t0 +
(Q_K - t0)`` is the longest path of the model's event graph, which runs forward through the units and back.
A left-to-right pass over the units sees the forward's *heads* (event times from the start) and the
backward's *tails* (longest paths from an event to the end, :math:`\\tau`), and the answer needs both.

State after the units ending at module ``i`` (the last one unit ``k``, backward position ``p = K+1-k``;
``g_q = A'_q + tau(end of G'_q)``, ``T = max(tau(BS_p), g_{p+d})``)::

    heads   H_0 = max(G_k, E_{k-d}), E_{k-d+1}, .., E_k            (d = 0: E_k)
    tails   sum_{q >= p} R_q, T, g_p, .., g_{p+d-1}                (d = 0: sum R, g_p)
    memory  w_1, .., w_d (bytes of the last 1..d units; with reshard, where the budget binds), peak

Adding unit ``k+1`` = modules ``s..i`` (``F, W, B, A, R``; ``A' = A`` with reshard unless it is the last)::

    G = H_0 + A,   E_{k+1} = max(E_k, G) + F,   H_0' = max(G, E_{k-d+1})      (the model's forward)
    tau(BE_{p-1}) = max(R + sum_{q >= p} R_q, T)                         (its reduce-scatter, the
    tau(BS_{p-1}) = W + tau(BE_{p-1})                                    next backward and, through T,
    g_{p-1} = A' + max(tau(BS_{p-1}), g_p),  T' = max(tau(BS_{p-1}), g_{p+d-1})     the re-gather it issues)
    window = B + w_d <= M  (with reshard),  peak = max(peak, window)

(``d = 0``: ``E_{k+1} = E_k + A + F``, ``g_{p-1} = A' + W + max(R + sum R, g_p)``.) A plan closed by
unit ``s..L-1`` (``A' = 0``) takes ``t_iter = E_K + g_1 + u``; its peak is ``peak`` with reshard and
``sum B`` without (``fsdp_model``'s closed form). Missing events (``g_q`` for ``q > K``, the first unit's
``T``) are 0. ``H_0`` and ``T`` fold the two values that are only ever read through their maximum.

Proof. (1) The recurrences are the model: the forward lines are its equations; the tails are the longest
paths of its backward event graph (edges ``BE_{p-1} -> BS_p``, ``G'_p -> BS_p``, ``BS_p -> BE_p``
(``W_p``), ``G'_{p-1} -> G'_p`` and ``BE_{p-d-1} -> G'_p`` (``A'_p``), ``BE_p -> Q_p``, ``Q_{p-1} -> Q_p``
(``R_p``)), read from the end; every edge out of ``t0`` is dominated by the all-gather stream's chain from
``G'_0`` (weights >= 0), so ``Q_K - t0 = g_1``; and the peak is the closed form. (2) Every later quantity
is a composition of ``max`` and ``+`` of non-negative constants with the heads and tails: for two prefixes
ending at the same module, any completion's ``t_iter`` differs by at most ``delta`` = (largest head
difference) + (largest tail difference), and later windows are non-decreasing in the memory columns. So a
prefix beaten by another with ``delta <= 0`` and memory columns ``<=`` can be dropped: every completion of
it is matched in time, peak and feasibility (dominance). (3) A prefix whose lower bound
(:mod:`dpcomm.planner.fsdp_search`: the forward, the backward and the collective streams that must still
run) exceeds a feasible plan's time can be dropped (bound). What is kept therefore contains an optimal
partition. ``tests/test_fsdp_planner.py`` checks the answer against exhaustive search of ``fsdp_time`` and
``peak_memory`` over all partitions, depths and reshard choices.

With ``overlap="gathers"`` (reduce-scatters block, one link) the backward is a sum of one term per unit,
which needs the re-gather of the unit ``d`` before it, so the tails are one number and the state carries
the last ``d`` units' re-gathers instead (compared like the memory columns)::

    tails   b = the backward terms so far;   a_1 .. a_d = A' of the last 1..d units (a_1 the last)
    b += max(W, a_d) + R  (d >= 1),   A' + W + R  (d = 0)      for every unit but the last
    b += max(W, a_1 + .. + a_d) + R                            for the last (its A' is 0)

and ``t_iter = E_K + b + u``.

Certified gap. ``S`` (the states kept at a module) has no polynomial bound (at worst every partition), and
on long traces whose collectives dominate (TinyLlama on 10 GbE, Llama-3 shapes on 64 ranks) thousands of
prefixes within a fraction of a per cent of each other stay undominated at every module. So the first pass
keeps at most ``width`` new states per module, those of least bound (a beam, which finds good plans
early), and every state it drops leaves its bound; the least such bound over all runs, over the plans
closed and over the empty prefix's bound ``LB0`` is a lower bound ``LB`` on the optimum. If ``t_iter <=
(1 + gap) LB`` the plan is returned with ``LB``; otherwise the runs are repeated with four times the
width, the incumbent, and (with ``gap > 0``) states dropped whose bound is within ``gap * LB0`` of it,
until proven (at worst uncapped). Runs go cheapest first (without reshard, then by depth) and a run whose
empty prefix's bound already exceeds the incumbent is skipped. ``gap = 0``: exact, and among the fastest
plans the least peak (a second pass per ``(d, reshard)`` with the peak as a column and the budget below
the best peak so far, and below each plan it finds, its beam ordered by a floor on the peak to come;
proven where no state the caps dropped has a floor below the answer, else widened up to
:data:`_TIE_WIDTH` and the least found kept: :attr:`OptimalResult.least_peak`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dpcomm.costmodel.base import CommCost
from dpcomm.planner.fsdp_model import TIE_REL, Units, check_overlap
from dpcomm.planner.fsdp_search import SLACK, Found, Problem, root_bound, search

__all__ = ["OptimalResult", "optimal_fsdp"]

_WIDTH = 128  # new states per module in the first pass; x4 per pass until proven
_TIE_WIDTH = 2048
"""The widest pass of the search for the least peak among the fastest plans (:func:`_tied`): where many
plans tie (compute-bound models: every unit's collectives hidden), their prefixes differ in columns that
never matter and stay undominated, so the least peak is proven only where fewer are left."""


@dataclass(frozen=True, slots=True)
class OptimalResult:
    """One answer of :func:`optimal_fsdp` (times in seconds, bytes as an int)."""

    time_s: float
    peak_bytes: int
    units: Units
    depth: int
    reshard: bool
    states: int
    """States kept over all modules, runs and passes."""
    bound_s: float
    """No plan under the budget is faster (``time_s`` itself when exact)."""
    passes: int
    """Passes of widening the caps until proven (1: the first)."""
    least_peak: bool = False
    """Exact (``gap = 0``): no plan as fast has less peak (proven); else the least peak found among them."""


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
    incumbent: OptimalResult | None = None,
    overlap: str = "streams",
    gap: float = 0.0,
    ar_cost: CommCost | None = None,
    unit_s: float = 0.0,
) -> OptimalResult | None:
    """The least ``t_iter`` (then peak) over partitions of checked inputs ``f, b, m`` (seconds, bytes) with
    peak ``<= memory`` bytes, for each depth in ``depths`` and reshard choice in ``reshards`` (ties: the
    least depth, then reshard); ``None`` when nothing fits. ``incumbent``: a feasible plan among those, for
    the bound, returned where nothing better is found. ``overlap``: the model's,
    :data:`~dpcomm.planner.fsdp_model.OVERLAPS`. ``gap``: the answer's time is at most ``(1 + gap)`` times
    :attr:`OptimalResult.bound_s` (0: exact). ``ar_cost``: HSDP's all-reduce across replicas (``None``:
    FSDP). ``unit_s``: each unit's fixed cost per pass, seconds (the model's ``c``)."""
    p = Problem.of(f, b, m, ag_cost, rs_cost, memory=memory, update_s=update_s,
                   blocking=check_overlap(overlap) == "gathers", ar=ar_cost, unit_s=unit_s)  # fmt: skip
    runs = sorted(((d, r) for d in depths for r in reshards), key=lambda x: (x[1], x[0]))  # cheap first
    roots = {x: root_bound(p, *x) for x in runs}
    lb0 = min(roots.values())
    if lb0 == np.inf:
        return None
    slack = gap * lb0
    ub = incumbent.time_s if incumbent is not None else np.inf
    kept = {x: Found(np.inf, np.inf, None, np.inf, 0, False) for x in runs}  # each run's best, all passes
    width, states, passes = float(_WIDTH), 0, 0
    while True:
        passes += 1
        cut = 0.0 if passes == 1 else slack  # the first pass looks for the best plan it can, then the cut
        bound, capped = np.inf, set()
        for x in runs:
            if roots[x] > (ub * (1 + SLACK) if cut <= 0 else ub - cut):
                bound = min(bound, roots[x])
                continue
            got = search(p, *x, ub=ub, slack=cut, width=width)
            states += got.states
            bound = min(bound, got.bound)
            if got.capped:
                capped.add(x)
            if got.time_s < kept[x].time_s:
                kept[x] = got
            ub = min(ub, got.time_s)
        bound = max(lb0, bound)
        if ub <= bound * (1 + gap) + TIE_REL * max(1.0, abs(ub)) or not capped:
            break
        width *= 4
    tmin = min([g.time_s for g in kept.values()] + [incumbent.time_s if incumbent else np.inf])
    if tmin == np.inf:
        return None
    tie = tmin + TIE_REL * max(1.0, abs(tmin))
    best: OptimalResult | None = None
    least = True  # every search for the least peak among the fastest proven
    for (d, r), g in sorted(kept.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
        if gap <= 0 and roots[d, r] <= tie and (r or g.time_s > tie or (d, r) in capped):
            # exact: the least peak among the fastest (reshard: below the best so far, whole bytes)
            top = p.M if best is None or not r else min(p.M, best.peak_bytes - 1)
            if r and best is not None and _least_window(m, d) > top:
                continue
            own = g if g.units is not None and g.time_s <= tie else None  # this run's fastest: to beat
            if own is not None and r:
                top = min(top, _peak(m, own.units, d, r) - 1)
            if not r or _least_window(m, d) <= top:
                g, n, proven = _tied(replace(p, M=top), d, r, tie)
                states += n
                least &= proven
                if g.units is None and own is not None:
                    g = own
        if g.units is None or g.time_s > tie:
            continue
        cand = OptimalResult(g.time_s, _peak(m, g.units, d, r), g.units, d, r, 0, 0.0, 0)
        if best is None or _better(cand, best):
            best = cand
    if best is None or (incumbent is not None and _better(incumbent, best)):
        best = incumbent  # nothing found beats the plan the search started from
    bound = best.time_s if gap <= 0 else min(bound, best.time_s)
    return replace(best, states=states, bound_s=bound, passes=passes, least_peak=gap <= 0 and least)


def _tied(p: Problem, d: int, r: bool, ub: float) -> tuple[Found, int, bool]:
    """The least peak of a plan within ``ub`` (the peak as a column with reshard: each plan found lowers
    the budget to its peak less one byte), ``(found, states, proven)``: widened until no cap dropped a
    state that could have had less peak, or (with reshard) past :data:`_TIE_WIDTH`, then the least found."""
    width, states, best = float(_WIDTH), 0, None
    while True:
        got = search(p, d, r, ub=ub, width=width, peak=r)
        states += got.states
        if got.units is not None:
            best = got
            if r:
                p = replace(p, M=got.peak - 1)  # a later pass looks for less peak only
        if not got.capped or (not r and got.time_s <= ub):  # without reshard every peak is the total
            return best or got, states, True
        if r and width >= _TIE_WIDTH:
            return best or got, states, False
        width *= 4


def _peak(m: np.ndarray, units: Units, d: int, r: bool) -> int:
    """``fsdp_model``'s closed form: the largest window of ``d + 1`` units with reshard, else the total."""
    B = np.array([m[a : z + 1].sum() for a, z in units])
    if not r:
        return int(B.sum())
    c = np.concatenate(([0.0], np.cumsum(B)))
    k = min(d + 1, B.size)
    return int(max((c[k:] - c[:-k]).max(), 0.0))


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
