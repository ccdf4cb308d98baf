"""The FSDP2 model: a sharded data-parallel iteration as events on three streams, and :class:`FsdpPlan`.

Ours, after PyTorch's FSDP2 (``fully_shard``): the forward's all-gathers are the iBatch paper's pulls
(:mod:`dpcomm.planner.pull_model`) with a unit for a batch, and the backward's reduce-scatters are MG-WFBP's
merged gradients (:mod:`dpcomm.planner.optimal`). ``docs/fsdp.md`` writes the model out with what FSDP2
does that it leaves out. The planners: :mod:`dpcomm.planner.fsdp`; the exact minimum:
:mod:`dpcomm.planner.fsdp_optimal`.

Symbols. Modules ``i = 0..L-1`` in forward order with forward ``f_i`` and backward ``b_i`` seconds and
``m_i`` parameter bytes (unsharded, all ranks' shards together). A plan cuts them into contiguous units
``k = 1..K`` (forward order); unit ``k`` holds ``B_k`` bytes and takes ``F_k = c + sum f_i`` forward and
``W_k = c + sum b_i`` backward seconds, ``c >= 0`` FSDP2's fixed cost of a unit per pass on the thread that
computes (its hooks, the copy into the all-gather buffer and out of it, and the reduce-scatter's; ``unit_s``,
:data:`dpcomm.planner.fsdp_unit.UNIT_S`), so that more units are never free.
All-gather and reduce-scatter of a unit cost ``A_k = T_ag(B_k)`` and ``R_k = T_rs(B_k)`` seconds, functions
of the unit's *full* bytes (a ring moves ``(P-1)/P`` of them per rank: that factor is inside ``b``,
:func:`dpcomm.planner.fsdp.ring_costs`). Prefetch depth ``d >= 0``; ``reshard`` (FSDP2's
``reshard_after_forward``); ``u`` the optimizer step. ``E_j = 0`` for ``j <= 0``.

Forward (one all-gather stream; unit ``k``'s all-gather is issued when unit ``k-d`` is reached, i.e. when
unit ``k-d-1``'s forward ends; ``d = 0``: when unit ``k`` itself is reached)::

    G_k = max(E_{k-d-1}, G_{k-1}) + A_k        all-gather k ends        (G_0 = 0)
    S_k = max(E_{k-1}, G_k)                    unit k's forward starts
    E_k = S_k + F_k                            and ends; the forward ends at t0 = E_K

Backward (positions ``p = 1..K`` are units ``K+1-p``; ``A'_p`` = the unit's ``A`` where it was resharded
after forward, else 0; the last unit is never resharded after forward, its backward starts at once, as FSDP2
does for its root; re-gathers are issued like the forward's, ``d`` positions ahead, on the same stream;
each unit's reduce-scatter is issued when its backward ends, on a stream of its own)::

    G'_p = max(BE_{p-d-1}, G'_{p-1}) + A'_p    (BE_j = G'_0 = t0 for j <= 0, A'_1 = 0)
    BS_p = max(BE_{p-1}, G'_p),  BE_p = BS_p + W_p
    Q_p  = max(BE_p, Q_{p-1}) + R_p            (Q_0 = t0)
    t_iter = max(BE_K, Q_K) + u                (= Q_K + u, as R >= 0)

Overlap ``gathers`` (FSDP2 on CPU, as :func:`dpcomm.fsdp.shard` runs it there: gloo all-gathers are
asynchronous work waited for when the unit runs, but FSDP2 issues each reduce-scatter with ``async_op=False``
and reads its output at once, so it blocks the thread that runs backward; all collectives queue on one link,
first in, first out). The forward is the same. Backward, with ``T_0 = t0`` the thread's time and the link
free: position ``p``'s pre-backward hook queues the re-gathers up to position ``p+d`` not yet queued, the
unit waits for its own, runs ``W_p``, then its reduce-scatter queues behind them and the thread waits for
it (``T_p``). So re-gathers never delay compute for ``d >= 1`` (each was queued before an earlier
reduce-scatter, so it ended before it) and each position costs its own terms::

    T_1 = t0 + max(W_1, A'_2 + .. + A'_{1+d}) + R_1      (d >= 1; positions past K have A' = 0)
    T_p = T_{p-1} + max(W_p, A'_{p+d}) + R_p               (p >= 2)
    T_p = T_{p-1} + A'_p + W_p + R_p                       (d = 0, every p; A'_1 = 0)
    t_iter = T_K + u

:func:`fsdp_time` computes it by queueing events (``overlap="gathers"``), not by the closed form, which is
what :mod:`dpcomm.planner.fsdp_optimal` uses; the tests check they agree.

HSDP (FSDP2 on a 2-D mesh: ``P = G x N``, each unit sharded over a group of ``G`` ranks and replicated
across the ``N`` groups; :mod:`dpcomm.planner.hsdp`). ``A`` and ``R`` are the all-gather and
reduce-scatter within a group; after its reduce-scatter each unit's shard (``B/G`` bytes) is all-reduced
across the groups, ``C_p`` seconds (a function of ``B``). FSDP2 (``foreach_reduce``, torch 2.13) issues it
on a third stream that first waits for the reduce-scatter stream, so::

    X_p = max(Q_p, X_{p-1}) + C_p              (X_0 = t0)
    t_iter = max(BE_K, Q_K, X_K) + u           (= X_K + u)

On CPU the all-reduce is a blocking call too: under ``gathers`` it follows its reduce-scatter on the link
and the thread, ``R_p`` becomes ``R_p + C_p``. Memory is FSDP's: a unit unsharded holds ``B`` bytes.

Memory. Unit ``k``'s parameters are unsharded (``B_k`` bytes) from the issue of its all-gather until it is
resharded: after its forward if ``reshard`` (except the last unit), after its backward otherwise (and after
its backward re-gather's backward in any case). Allocation and freeing follow *program order* (FSDP2 frees
on the CPU's order, and so does this model), not the streams' times: at unit ``k``'s forward the units
``k..k+d`` are unsharded, and at position ``p``'s backward the positions ``p..p+d``. So::

    peak = max_k (B_k + .. + B_{min(k+d, K)})   with reshard;   peak = B_1 + .. + B_K   without

:func:`peak_memory` sweeps the program order; the closed form is what :mod:`dpcomm.planner.fsdp_optimal`
uses, and the tests check they agree. The sharded state (``1/P`` of parameters, gradients and optimizer
state) is the same for every plan and not counted; neither are gradients and activations.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError

__all__ = [
    "OVERLAPS",
    "TIE_REL",
    "FsdpPlan",
    "Units",
    "check_overlap",
    "check_unit_s",
    "check_units",
    "fsdp_inputs",
    "fsdp_time",
    "peak_memory",
    "unit_sums",
]

OVERLAPS = ("streams", "gathers")
"""What overlaps compute (module docstring): ``streams``, every collective on a stream of its own (FSDP2 on
GPUs); ``gathers``, only the all-gathers, the reduce-scatters block the thread, one link (FSDP2 on CPU)."""

TIE_REL = 1e-12
"""Relative difference in modelled time below which two plans tie (the one with less memory wins)."""

Units = list[tuple[int, int]]
"""``(first, last)`` module indices per unit, inclusive, 0-based, forward order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpPlan:
    """Units of modules (one ``fully_shard`` call each), a prefetch depth and the reshard choice; plain data
    like :class:`~dpcomm.plan.Plan` and :class:`~dpcomm.planner.pull_model.PullPlan`."""

    method: str
    """The planner that made it: ``per-block``, ``whole``, ``per-layer``, ``size:BYTES`` or ``optimal``."""
    num_modules: int
    """L, the number of modules (trace layers) of the model."""
    units: tuple[tuple[int, int], ...]
    """``(first, last)`` module indices per unit, inclusive, 0-based, forward order, covering ``0..L-1``."""
    depth: int
    """Prefetch depth ``d``: unit ``k``'s all-gather is issued when unit ``k-d`` is reached (both passes)."""
    reshard_after_forward: bool
    """Whether units (all but the last) are resharded after forward and gathered again in backward."""
    shard_group: int | None = None
    """HSDP: each unit sharded over groups of this many ranks and replicated across the groups (FSDP2's 2-D
    mesh, :mod:`dpcomm.planner.hsdp`); ``None``: FSDP, sharded over every rank."""
    time_s: float = field(default=float("nan"), compare=False)
    """The model's iteration time ``t_iter``, seconds (NaN when unknown)."""
    peak_bytes: int = field(default=-1, compare=False)
    """The model's peak of unsharded parameter bytes (-1 when unknown)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form facts (the budget, the candidates, DP states); not part of the plan's identity."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "units", tuple((int(a), int(b)) for a, b in self.units))
        check_units(self.units, self.num_modules)
        if isinstance(self.depth, bool) or int(self.depth) != self.depth or self.depth < 0:
            raise ValueError(f"prefetch depth must be an integer >= 0, got {self.depth!r}")
        object.__setattr__(self, "depth", int(self.depth))
        object.__setattr__(self, "reshard_after_forward", bool(self.reshard_after_forward))
        G = self.shard_group
        if G is not None and (isinstance(G, bool) or int(G) != G or G < 1):
            raise ValueError(f"HSDP shard group must be an integer >= 1, got {G!r}")

    def to_dict(self) -> dict[str, Any]:
        out = {
            "method": self.method,
            "num_modules": self.num_modules,
            "units": [list(u) for u in self.units],
            "depth": self.depth,
            "reshard_after_forward": self.reshard_after_forward,
        }
        if self.shard_group is not None:  # FSDP plans keep their identity (and hash) from before HSDP
            out["shard_group"] = int(self.shard_group)
        return out

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> FsdpPlan:
        return cls(
            method=obj["method"],
            num_modules=obj["num_modules"],
            units=[tuple(u) for u in obj["units"]],
            depth=obj["depth"],
            reshard_after_forward=obj["reshard_after_forward"],
            shard_group=obj.get("shard_group"),
        )

    def sha256(self) -> str:
        """Identity of the plan (method, units, depth, reshard) for cross-rank agreement checks."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def check_units(units: Sequence[tuple[int, int]], L: int) -> None:
    """Raise ``ValueError`` unless ``units`` cover modules ``0..L-1`` in order, each non-empty."""
    expect = 0
    for a, b in units:
        if a != expect or b < a:
            raise ValueError(f"FSDP units {list(units)} do not cover modules 0..{L - 1} in order")
        expect = b + 1
    if expect != L or L < 1:
        raise ValueError(f"FSDP units {list(units)} do not cover modules 0..{L - 1}")


def fsdp_inputs(forward_s, backward_s, param_bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(f, b, m)`` as float arrays, checked: one of each per module, finite, >= 0 (seconds, bytes; the
    bytes whole numbers, exact in a float below 2**53)."""
    f, b, m = (np.asarray(x, dtype=float).ravel() for x in (forward_s, backward_s, param_bytes))
    if not f.size == b.size == m.size or f.size < 1:
        got = f"{f.size}, {b.size}, {m.size}"
        raise UserError(f"need one forward, backward and byte count per module, got {got}")
    if not all(np.all(np.isfinite(x)) and np.all(x >= 0) for x in (f, b, m)):
        raise UserError("FSDP module times and bytes must be finite numbers >= 0")
    if np.any(m != np.floor(m)) or m.sum() >= 2**53:
        raise UserError("FSDP module bytes must be whole numbers, in all below 2**53")
    return f, b, m


def unit_sums(units: Sequence[tuple[int, int]], x: np.ndarray) -> list[float]:
    """Per unit, the sum of ``x`` over its modules (in module order)."""
    return [float(x[a : b + 1].sum()) for a, b in units]


def fsdp_time(
    units: Sequence[tuple[int, int]],
    forward_s,
    backward_s,
    param_bytes,
    ag_cost: CommCost,
    rs_cost: CommCost,
    *,
    depth: int,
    reshard: bool,
    update_s: float = 0.0,
    overlap: str = "streams",
    detail: bool = False,
    ar_cost: CommCost | None = None,
    unit_s: float = 0.0,
) -> float | dict[str, float]:
    """The model's ``t_iter`` (module docstring), seconds, by its event equations one unit at a time, with
    ``overlap`` one of :data:`OVERLAPS`. ``detail``: a dict of ``t_iter``, ``forward_end`` (``t0``),
    ``backward_end`` (``BE_K``) and ``reduce_scatter_end`` (``Q_K``; HSDP: ``X_K``) instead. ``ar_cost``:
    HSDP's all-reduce of a unit's shard across the replicas, a function of the unit's full bytes (``None``:
    FSDP; module docstring). ``unit_s``: ``c``, each unit's fixed cost per pass, seconds."""
    check_overlap(overlap)
    f, b, m = fsdp_inputs(forward_s, backward_s, param_bytes)
    check_units(units, f.size)
    c = check_unit_s(unit_s)
    d, K = int(depth), len(units)
    F, W, B = ([x + c for x in unit_sums(units, f)], [x + c for x in unit_sums(units, b)],
               unit_sums(units, m))  # fmt: skip
    A = [float(ag_cost(x)) for x in B]
    R = [float(rs_cost(x)) for x in B]
    C = [float(ar_cost(x)) if ar_cost is not None else 0.0 for x in B]
    E = [0.0] * (K + 1)  # E[k] = E_k, E[0] = 0 (and E_j = 0 for j <= 0)
    G = 0.0
    for k in range(1, K + 1):
        G = max(E[max(k - d - 1, 0)], G) + A[k - 1]
        E[k] = max(E[k - 1], G) + F[k - 1]
    t0 = E[K]
    if overlap == "gathers":  # an all-reduce blocks the thread after its reduce-scatter, on the same link
        RC = [r + c for r, c in zip(R, C, strict=True)]
        return _blocking_backward(A, W, RC, t0, d, reshard, float(update_s), detail)
    BE = [t0] * (K + 1)  # BE[p] = BE_p, BE[0] = t0
    Gb, Q, X = t0, t0, t0
    for p in range(1, K + 1):
        k = K - p  # 0-based unit index
        Ap = A[k] if reshard and p > 1 else 0.0
        Gb = max(BE[max(p - d - 1, 0)], Gb) + Ap
        BE[p] = max(BE[p - 1], Gb) + W[k]
        Q = max(BE[p], Q) + R[k]
        X = max(Q, X) + C[k]
    t_iter = max(BE[K], Q, X) + float(update_s)
    if detail:
        return {"t_iter": t_iter, "forward_end": t0, "backward_end": BE[K], "reduce_scatter_end": max(Q, X)}
    return t_iter


def check_unit_s(unit_s: float) -> float:
    """``unit_s`` as a float, checked: a finite number of seconds >= 0 (a one-line :class:`UserError`)."""
    if isinstance(unit_s, bool) or not isinstance(unit_s, int | float) or not (0 <= unit_s < math.inf):
        raise UserError(f"FSDP fixed cost per unit must be a number of seconds >= 0, got {unit_s!r}")
    return float(unit_s)


def check_overlap(overlap: str) -> str:
    if overlap not in OVERLAPS:
        raise UserError(f"unknown FSDP overlap {overlap!r}: use one of {', '.join(OVERLAPS)}")
    return overlap


def _blocking_backward(A, W, R, t0: float, d: int, reshard: bool, u: float, detail: bool):
    """Backward under ``overlap="gathers"``: one first-in-first-out link (free at ``link``) and the thread
    (at ``T``), event by event; see the module docstring."""
    K = len(A)
    T = link = t0
    queued, ends = 0, [t0] * (K + 1)  # ends[q]: re-gather of position q done
    BE = t0
    for p in range(1, K + 1):
        for q in range(queued + 1, min(p + d, K) + 1):  # pre-backward: the re-gathers now due
            link = max(link, T) + (A[K - q] if reshard and q > 1 else 0.0)
            ends[q] = link
        queued = max(queued, min(p + d, K))
        BE = max(T, ends[p]) + W[K - p]
        T = link = max(BE, link) + R[K - p]  # the reduce-scatter blocks the thread
    t_iter = T + u
    if detail:
        return {"t_iter": t_iter, "forward_end": t0, "backward_end": BE, "reduce_scatter_end": T}
    return t_iter


def peak_memory(
    units: Sequence[tuple[int, int]], param_bytes, *, depth: int, reshard: bool, silent: Any = (),
    kept: Any = (),
) -> int:  # fmt: skip
    """The model's peak of unsharded parameter bytes (module docstring), by a sweep of the program order:
    each unit's forward (issue the all-gathers due, run, reshard) then each unit's backward (issue the
    re-gathers due, run, reshard). FSDP2's backward of units of frozen layers (:mod:`dpcomm.fsdp.bound`):
    a ``silent`` unit runs no backward hook (gathers nothing at its turn, prefetches nothing); a ``kept``
    one, once gathered in backward (by the unit after it, FSDP2's default prefetch at depth 0, or a later
    unit's explicit prefetch), stays unsharded until backward ends (FSDP2's last callback reshards it)."""
    m = np.asarray(param_bytes, dtype=float).ravel()
    check_units(units, m.size)
    d, K = int(depth), len(units)
    B = [int(x) for x in unit_sums(units, m)]
    alive: set[int] = set()
    peak = 0

    def gather(k: int) -> None:
        nonlocal peak
        alive.add(k)
        peak = max(peak, sum(B[j] for j in alive))

    for k in range(K):  # forward, unit k (0-based): units up to k+d are issued by now
        for j in range(k, min(k + d, K - 1) + 1):
            if j not in alive:
                gather(j)
        if reshard and k < K - 1:
            alive.discard(k)
    for p in range(K):  # backward, position p (0-based): unit u = K-1-p and the d before it
        u = K - 1 - p
        if u in silent:
            continue
        for q in range(p, min(p + d, K - 1) + 1):
            if K - 1 - q not in alive:
                gather(K - 1 - q)
        if d == 0 and u > 0 and u - 1 in kept and u - 1 not in alive:
            gather(u - 1)
        if u not in kept:
            alive.discard(u)
    return peak
