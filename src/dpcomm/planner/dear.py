"""DeAR's schedule, planned exactly: reduce-scatter groups in backward, the same groups all-gathered in the
next forward (Zhang, Shi, Chu et al., "DeAR: Accelerating Distributed Deep Learning with Fine-Grained
All-Reduce Pipelining", ICDCS 2023; MG-WFBP's merge and iBatch's batching in one partition).

Each all-reduce is cut in its two halves. A group's gradients are *reduce-scattered* as soon as they are
ready in backward (rank ``r`` ends with the sum of chunk ``r``), each rank steps the optimizer on its chunk
only (optimizer state sharded, ZeRO-1), and the group's parameters are *all-gathered* during the next
forward, whose layers each wait for their group's gather. On a ring each half costs half an all-reduce:
``(P-1) alpha + (P-1)/P M beta`` (Patarasuk & Yuan 2009), so :func:`rs_ag_costs` halves the all-reduce cost
unless it is a :class:`SplitCost` carrying the halves as measured.

Model of one steady iteration, groups ``j = 1..K`` in *forward* order (group ``j`` holds layers
``s_j..e_j``), ``A(G)``/``R(G)`` the all-gather/reduce-scatter seconds of a group's bytes:

- forward: every gather is queued at the step's end (time 0) in forward order, one at a time, so group
  ``j``'s gather ends at ``sum_{i <= j} A(G_i)``; layer ``l`` starts at ``max(end of layer l-1, gather of
  its group)``. Unrolled, the forward ends at ``Fend = max_j (sum_{i <= j} A(G_i) + Fsuf(s_j))`` with
  ``Fsuf(s)`` the forward seconds of layers ``s..L-1``.
- backward starts at ``Fend``; group ``j`` is ready ``Bsuf(s_j)`` later (its lowest layer's gradient) and the
  reduce-scatters run in backward order (``j = K`` first), each from ``max(ready, previous end)``. Unrolled
  the same way, the last one ends ``Rend = max_j (Bsuf(s_j) + sum_{i <= j} R(G_i))`` after ``Fend``.
- the step on the shards takes ``update_s``; ``t_iter = Fend + Rend + update_s``.

Both terms are maxima over groups of a quantity fixed by the group (``s_j``) and by the sums of costs of
the groups before it in forward order. So a dynamic program over *forward prefixes* (node ``i``: layers
``0..i-1`` covered) carries, per partial partition, the label ``(A, R, Fmax, Rmax)`` of its cost sums and
running maxima; extending it by the group ``i..e`` gives ``A' = A + A(i..e)``, ``R' = R + R(i..e)``,
``Fmax' = max(Fmax, A' + Fsuf(i))``, ``Rmax' = max(Rmax, Bsuf(i) + R')``. Every quantity of the final
objective ``Fmax + Rmax`` is non-decreasing in each of the four, so a label that another at the same node
beats or equals in all four (and in its group count) is never needed: keeping the non-dominated labels
(a Pareto front) is exact, for any non-decreasing cost. A label is also dropped when its lower bound
(:func:`_rest_bounds`: what the layers left must still add to each maximum) exceeds the time of a plan
already known: the best of the all-reduce ``optimal`` plan's groups priced in this model and the plan of
the same program keeping two labels per node of least bound (a beam; fast). Ties (relative ``1e-12``) go
to fewer groups.
``tests/test_dear.py`` checks the program against exhaustive search.

Limits of the schedule (:func:`limits`): no plan beats ``max(F, AG) + max(B, RS) + update``, with ``AG`` and
``RS`` every gather/reduce-scatter of the model in one message; an all-reduce plan's is ``F + max(B, C)``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, cost_many, finish, layer_bytes, no_opts
from dpcomm.planner.optimal import TIE_REL, plan_optimal
from dpcomm.trace.format import Trace

__all__ = [
    "HalfCost",
    "DearTimes",
    "SplitCost",
    "dear_partition",
    "dear_times",
    "limits",
    "plan_dear",
    "rs_ag_costs",
    "split_cost",
]


@dataclass(frozen=True, slots=True)
class HalfCost:
    """Half of another cost (a reduce-scatter or an all-gather of ``M`` bytes: half a ring all-reduce)."""

    full: CommCost

    def __call__(self, nbytes: float) -> float:
        return 0.5 * self.full(nbytes)

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        return 0.5 * cost_many(self.full, nbytes)


@dataclass(frozen=True, slots=True)
class SplitCost:
    """An all-reduce cost that also carries measured reduce-scatter and all-gather costs (the runtime times
    the collective's own halves where they are not half an all-reduce: dpcomm's ring beside gloo's
    all-reduce). Called, it is the all-reduce cost, so every all-reduce planner reads it unchanged."""

    allreduce: CommCost
    rs: CommCost
    ag: CommCost

    def __call__(self, nbytes: float) -> float:
        return self.allreduce(nbytes)

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        return cost_many(self.allreduce, nbytes)

    def __str__(self) -> str:
        return f"{self.allreduce}; reduce-scatter {self.rs}; all-gather {self.ag}"


def split_cost(allreduce: CommCost, halves: dict[str, Any] | None) -> CommCost:
    """``allreduce`` with the halves a run measured (``{"rs": points, "ag": points}``, ``(bytes, seconds)``,
    as a result's ``cost["halves"]`` holds them), each fitted as the runtime fits them; unchanged without."""
    if not halves or not halves.get("rs") or not halves.get("ag"):
        return allreduce
    from dpcomm.planner.autoplan import fit_linear

    return SplitCost(allreduce, fit_linear(halves["rs"]), fit_linear(halves["ag"]))


def rs_ag_costs(allreduce: CommCost) -> tuple[CommCost, CommCost]:
    """``(reduce-scatter, all-gather)`` costs: a :class:`SplitCost`'s own, else each half of the all-reduce
    cost (a ring's halves)."""
    if isinstance(allreduce, SplitCost):
        return allreduce.rs, allreduce.ag
    if isinstance(allreduce, LinearCost):
        half = LinearCost(allreduce.a / 2, allreduce.b / 2)
        return half, half
    half = HalfCost(allreduce)
    return half, half


@dataclass(frozen=True, slots=True, kw_only=True)
class DearTimes:
    """One iteration of a DeAR plan in the model (seconds): the forward with its gathers, the backward with
    its reduce-scatters (from the forward's end), and per group (forward order) the gather's and the
    reduce-scatter's start and end."""

    forward_end_s: float
    backward_end_s: float
    """The last reduce-scatter's end (never before backward's), from the forward's end."""
    t_iter_s: float
    gathers: tuple[tuple[float, float], ...]
    scatters: tuple[tuple[float, float], ...]
    layer_starts: tuple[float, ...]
    """Each layer's forward start (it waits for its group's gather)."""


MAX_LABELS = 60_000
"""Labels the exact search makes before it stops with the best plan so far and a certified gap
(``meta["gap"]``: that plan's time over the least lower bound left, less one). Over the 38 shipped traces
at 4 to 64 nodes of ``10gbe`` and ``100gb-ib`` (380 plans, 38 s in all on the 2-core VM, at most 2.9 s
each), 372 were exact; the rest stopped within a certified 1.7% (Inception-v3 and BERT-Base in bf16,
TinyLlama): ``benchmarks/dear_planner.py``."""


def _suffix(x: np.ndarray) -> np.ndarray:
    """``out[s] = x[s] + .. + x[L-1]``, summed one at a time from the end (``out[L] = 0``)."""
    out = [0.0] * (x.size + 1)
    for i in range(x.size - 1, -1, -1):
        out[i] = out[i + 1] + float(x[i])
    return np.array(out)


def _forward_groups(plan: Plan) -> list[tuple[int, int]]:
    """``(s, e)`` per group, forward order."""
    return sorted((g[0], g[-1]) for g in plan.groups)


def dear_times(
    trace: Trace, plan: Plan, rs: CommCost, ag: CommCost, nodes: int, update_s: float = 0.0
) -> DearTimes:
    """The model's iteration (module docstring) for ``plan``'s groups, event by event."""
    layers = trace.layers
    nb = layer_bytes(trace)
    groups = _forward_groups(plan)
    multi = nodes > 1
    gathers, t = [], 0.0
    for s, e in groups:
        dur = ag(float(nb[s : e + 1].sum())) if multi else 0.0
        gathers.append((t, t + dur))
        t += dur
    starts, t = [], 0.0
    group_of = [0] * len(layers)
    for j, (s, e) in enumerate(groups):
        for l in range(s, e + 1):
            group_of[l] = j
    for l, layer in enumerate(layers):
        t = max(t, gathers[group_of[l]][1])
        starts.append(t)
        t += layer.forward_s
    f_end, ready = t, [0.0] * len(layers)
    t = 0.0
    for l in range(len(layers) - 1, -1, -1):
        t += layers[l].backward_s
        ready[l] = t
    b_end, scatters, end = t, [(0.0, 0.0)] * len(groups), -math.inf
    for j in range(len(groups) - 1, -1, -1):
        s, e = groups[j]
        dur = rs(float(nb[s : e + 1].sum())) if multi else 0.0
        start = max(ready[s], end)
        end = start + dur
        scatters[j] = (start, end)
    b_end = max(b_end, end)
    return DearTimes(
        forward_end_s=f_end,
        backward_end_s=b_end,
        t_iter_s=f_end + b_end + update_s,
        gathers=tuple(gathers),
        scatters=tuple(scatters),
        layer_starts=tuple(starts),
    )


def limits(trace: Trace, cost: CommCost, nodes: int, update_s: float = 0.0) -> dict[str, float]:
    """Lower bounds of one iteration, seconds: ``allreduce`` = ``F + max(B, C)`` (every all-reduce plan),
    ``dear`` = ``max(F, AG) + max(B, RS)`` (every DeAR plan), both plus ``update_s``; ``C``, ``AG`` and
    ``RS`` move the whole model in one message."""
    f = sum(layer.forward_s for layer in trace.layers)
    b = sum(layer.backward_s for layer in trace.layers)
    total = float(layer_bytes(trace).sum())
    rs, ag = rs_ag_costs(cost)
    c = cost(total) if nodes > 1 else 0.0
    a, r = (ag(total), rs(total)) if nodes > 1 else (0.0, 0.0)
    return {"allreduce": f + max(b, c) + update_s, "dear": max(f, a) + max(b, r) + update_s}


def dear_partition(
    fwd: np.ndarray,
    bwd: np.ndarray,
    nbytes: np.ndarray,
    rs: CommCost,
    ag: CommCost,
    upper: float = math.inf,
    beam: int | None = None,
    max_labels: int | None = None,
) -> tuple[float, list[tuple[int, int]], float]:
    """``(Fend + Rend, groups, bound)``: the exact least time of the two phases (module docstring) over every
    contiguous partition, its groups ``(s, e)`` in forward order, and a lower bound of every plan's time
    (the time itself when the search ran to its end). ``upper``: a time some plan reaches (labels that
    cannot beat it are dropped; ``inf``: none known); ``(inf, [], bound)`` when nothing beats it.
    ``beam``: keep only that many labels per node, those of least lower bound -- a fast plan, not the exact
    one. ``max_labels``: stop after making that many labels; the bound is then the least lower bound of the
    labels not yet expanded (every plan passes through one of them or one they dominate)."""
    L = int(nbytes.size)
    fsuf, bsuf = _suffix(np.asarray(fwd, float)), _suffix(np.asarray(bwd, float))
    cum = np.concatenate(([0.0], np.cumsum(np.asarray(nbytes, float))))
    span = cum[None, 1:] - cum[:-1, None]  # span[s, e] = bytes of s..e where s <= e
    inside = np.triu(np.ones((L, L), dtype=bool))
    A = np.where(inside, cost_many(ag, np.where(inside, span, 0.0)), np.inf)
    R = np.where(inside, cost_many(rs, np.where(inside, span, 0.0)), np.inf)
    limit = upper * (1 + TIE_REL) if math.isfinite(upper) else math.inf
    gf, gr = _rest_bounds(A, fsuf, ag), _rest_bounds(R, bsuf, rs)

    def bound(lab: tuple, j: int) -> float:
        return max(lab[3], lab[1] + float(gf[j])) + max(lab[4], lab[2] + float(gr[j]))

    # label: (k, A, R, Fmax, Rmax, parent label, s); fronts[i]: labels covering layers 0..i-1
    fronts: list[list[tuple]] = [[] for _ in range(L + 1)]
    fronts[0] = [(0, 0.0, 0.0, -math.inf, -math.inf, None, -1)]
    made = 0
    for i in range(L):
        Fi, Bi = float(fsuf[i]), float(bsuf[i])
        if beam is not None:
            fronts[i].sort(key=lambda x, i=i: bound(x, i))
            del fronts[i][beam:]
        for n, lab in enumerate(fronts[i]):
            if max_labels is not None and made > max_labels:  # stop: bound what is left unexpanded
                left = [(x, i) for x in fronts[i][n:]] + [
                    (x, j) for j in range(i + 1, L + 1) for x in fronts[j]
                ]
                return math.inf, [], min(min((bound(x, j) for x, j in left), default=math.inf), upper)
            k, a0, r0, fm, rm = lab[:5]
            if bound(lab, i) > limit:
                continue
            for e in range(i, L):
                a1, r1 = a0 + float(A[i, e]), r0 + float(R[i, e])
                new = (k + 1, a1, r1, max(fm, a1 + Fi), max(rm, Bi + r1), lab, i)
                if bound(new, e + 1) > limit:
                    continue
                made += 1
                _insert(fronts[e + 1], new)
    if not fronts[L]:  # nothing beats ``upper``
        return math.inf, [], upper
    best = min(fronts[L], key=lambda x: (x[3] + x[4], x[0]))
    t_best = best[3] + best[4]
    tie = t_best + TIE_REL * max(1.0, abs(t_best))
    best = min((x for x in fronts[L] if x[3] + x[4] <= tie), key=lambda x: x[0])
    groups, lab, end = [], best, L
    while lab[5] is not None:
        groups.append((lab[6], end - 1))
        end = lab[6]
        lab = lab[5]
    groups.reverse()
    return float(best[3] + best[4]), groups, float(best[3] + best[4])


def _rest_bounds(C: np.ndarray, suffix: np.ndarray, cost: CommCost) -> np.ndarray:
    """``g[i]``: the least the layers ``i..L-1`` still add to a phase's maximum beyond the cost sum so far
    (``g[L] = -inf``: nothing left). The group holding layer ``j`` adds ``sum so far + (its costs up to it)
    + suffix(its start)``, at least ``C[j, j] + suffix[j]`` for any non-decreasing cost, and at least
    ``C[i, j] + suffix[j]`` for a subadditive one (``a + b M`` with ``a >= 0``: merging never costs more
    than the parts), whose cost sum from ``i`` to ``j`` is at least the cost of their bytes at once."""
    L = C.shape[0]
    if _subadditive(cost):
        inside = np.triu(np.ones((L, L), dtype=bool))
        g = np.where(inside, C + suffix[None, :L], -np.inf).max(axis=1)
    else:
        own = np.diag(C) + suffix[:L]
        g = np.maximum.accumulate(own[::-1])[::-1]  # max over j >= i
    return np.concatenate((g, [-np.inf]))


def _subadditive(cost: CommCost) -> bool:
    while isinstance(cost, HalfCost):
        cost = cost.full
    return isinstance(cost, LinearCost)


def _insert(front: list[tuple], new: tuple) -> None:
    """Add ``new`` to ``front`` unless a label there is no worse in count, sums and maxima; drop the labels
    ``new`` is no worse than."""
    key = new[:5]
    for lab in front:
        if all(x <= y for x, y in zip(lab[:5], key, strict=True)):
            return
    front[:] = [lab for lab in front if not all(y <= x for x, y in zip(lab[:5], key, strict=True))]
    front.append(new)


def plan_dear(trace: Trace, cost: CommCost, nodes: int, update_s: float = 0.0, **opts) -> Plan:
    """The least-``t_iter`` DeAR plan for the all-reduce ``cost`` (its halves price the two phases);
    ``meta``: the model's ``t_iter_s`` (update excluded), both limits and ``gap`` (0: exact; else the
    certified bound of a search stopped at :data:`MAX_LABELS`)."""
    t0 = time.perf_counter()
    no_opts("dear", opts)
    check_nodes(nodes)
    rs, ag = rs_ag_costs(cost)
    L = trace.num_layers
    gap = 0.0
    if nodes == 1:
        groups = [(0, L - 1)]
        t_best = dear_times(trace, Plan.from_sizes("dear", [L], L), rs, ag, nodes).t_iter_s
    else:
        fwd = np.array([layer.forward_s for layer in trace.layers])
        bwd = np.array([layer.backward_s for layer in trace.layers])
        nb = layer_bytes(trace)
        seed = Plan(schedule="dear", num_layers=L, groups=plan_optimal(trace, cost, nodes).groups)
        incumbent = (dear_times(trace, seed, rs, ag, nodes).t_iter_s, _forward_groups(seed))
        t_beam, g_beam, _ = dear_partition(fwd, bwd, nb, rs, ag, incumbent[0], beam=2)  # a close plan, fast
        if g_beam:
            incumbent = (t_beam, g_beam)
        t_best, groups, lb = dear_partition(fwd, bwd, nb, rs, ag, incumbent[0], max_labels=MAX_LABELS)
        if not groups:  # nothing beats the incumbent (it is the best), or the search stopped at its cap
            t_best, groups = incumbent
        gap = 0.0 if lb >= t_best * (1 - TIE_REL) else t_best / lb - 1
    sizes = [e - s + 1 for s, e in reversed(groups)]  # communication (backward) order
    lim = limits(trace, cost, nodes)
    return finish("dear", sizes, trace, nodes, t0, t_iter_s=t_best, limit_s=lim["dear"],
                  allreduce_limit_s=lim["allreduce"], gap=gap)  # fmt: skip
