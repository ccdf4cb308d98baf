"""Pull plans for a parameter server: which layers' parameters a worker pulls together, before forward.

Source: Wang et al., "iBatch: Saving Ethernet Bandwidth ... batching parameter communication and forward
computation" (the iBatch paper), sections "Problem Formulation" (Eq. 1-5) and "Algorithm Design"
(Algorithms 1 and 2). Names follow the paper: ``C_i`` forward time of layer ``i``, ``Tt_i`` transfer time of
layer ``i``'s parameters (from all servers), ``Ts`` the start-up of one pull, ``l_k`` the last layer of
batch ``k``, ``N`` batches. Layers are 0-based here (the paper's layer ``i`` is our ``i - 1``).

The model (the paper's Eq. 1-4, generalised so that it holds whether or not Eq. 5 does): a worker's pulls
run one after another on its link, and batch ``k``'s forward needs batch ``k``'s parameters::

    P_k = sum_{j <= k} (Ts + sum_{i in batch j} Tt_i)          batch k's pull ends   (seconds)
    F_k = max(P_k, F_{k-1}) + sum_{i in batch k} C_i           batch k's forward ends (F_0 = 0)
    time = F_N

When every batch ``k+1``'s pull outlasts batch ``k``'s forward (Eq. 5), ``F_N = P_N + sum C(batch N)``,
which is Eq. 4 (``EXE1 + EXE2 + EXE3``). Unrolled, ``F_N = max_k (P_k + sum of C from batch k's first layer
to the end)``.

A probe's verdict (ours): :func:`confirm_plan` keeps a plan whose measured ``F_N`` is within
:data:`CONFIRM_REL` of the model and otherwise falls back to the better of ``all`` and ``layer``; the model
stays the above. The parameter server's runtime does this by default (``PsSpec.probe``).

Slowdown ``d`` (ours, not the paper's; 0 by default, where the model is the above). Receiving pulls takes
CPU too: where the forward and the network threads share saturated cores, the forward runs slower while
pulls are in flight (two workers on 2 cores at 500 Mbit/s: 2-3 ms over an 8 ms pull, ``docs/ps.md``). With
``d > 0`` the forward does ``1/(1+d)`` of a second's work per second before ``P_N`` (the last pull's end)
and full speed after::

    F_k = adv(max(P_k, F_{k-1}), sum_{i in batch k} C_i)
    adv(t, w) = t + w                                   if t >= P_N
              = min(t + (1+d) w,  P_N + w - (P_N - t)/(1+d))   otherwise

which is ``max(t + w, min(t + (1+d) w, P_N + w - (P_N - t)/(1+d)))`` in one line. ``all`` is never slowed
(its forward starts at ``P_N``); plans that overlap more pay more.

Methods (:func:`plan_pulls`):

``all``     one batch: pull everything, then forward (the default PS; paper Fig. 4(a)).
``layer``   one batch per layer: layer ``i``'s forward waits for its own pull (Fig. 4(b)).
``ibatch``  the paper's two greedy algorithms (Algorithm 1 chooses ``l_1, l_2, ..`` forwards, Algorithm 2
            ``l_{N-1}, l_{N-2}, ..`` backwards); the faster candidate under the model is kept (Fig. 4(c)).
            ``all`` and ``layer`` are candidates too, so ``ibatch`` is never slower than the better of
            them under the model: the greedy rules only look one batch ahead, and where start-ups cost
            nothing (``Ts`` = 0, as our parameter server's pulls on TCP measure) layer by layer is optimal
            while Algorithm 1 may still merge (ResNet-20 on the emulated cluster: 49.7 ms against 44.6).
            ``meta["algorithm"]`` names the candidate kept (``forward``, ``backward``, ``all``, ``layer``).
            A greedy candidate is kept only when the model has it faster than the better of ``all`` and
            ``layer`` by more than ``margin`` (:data:`IBATCH_MARGIN`, 1%; 5% with dedicated servers,
            :func:`ibatch_margin`); see there why.
``optimal`` the exact minimum of the model (a dynamic program, below); ties go to the fewest batches.

Where Algorithms 1-2 leave a choice open we decide as follows (each is a reading of the printed text):

1. Alg. 1's first step fixes ``l_1`` (lines 4-5: the largest forward that batch 2's pull can still cover)
   and leaves ``l_2`` free among the pairs meeting Eq. 5; we choose ``l_2`` by the rest steps' own rule,
   the least ``Ts + comm(batch 2) - C(batch 1)`` (lines 11-12). Alg. 2's lines 4-5 fix both layers
   unless some layers take zero time; such ties go to the largest ``l_{N-2}`` (shorter batches).
2. Eq. 5 is strict (``>``). When no candidate meets it (every candidate pull hides under the forward it
   overlaps), we take the candidate that comes closest: Alg. 1 the rest of the layers as one batch
   (``l_k = L``), Alg. 2 one layer (``l_k = l_{k+1} - 1``), and a first step of ``(1, L)`` (Alg. 1) or
   ``(1, 0)`` (Alg. 2), i.e. batches ``[1], [2..L]``.
3. Alg. 2's first step chooses ``l_{N-2} = 0`` when two batches are best; then there is no rest step.

Optimal: a dynamic program over (batches so far ``k``, last layer ``i``). ``P_k`` depends only on ``k`` and
the last layer of batch ``k`` (``P_k = k Ts + sum_{j <= l_k} Tt_j``), so let ``G_k[i]`` be the earliest
``F_k`` over all partitions of layers ``0..i`` into exactly ``k`` batches. Then::

    G_1[i] = Ts + T[0..i] + C[0..i]
    G_k[i] = min_{k-1 <= s <= i}  max(k Ts + T[0..i], G_{k-1}[s-1]) + C[s..i]

Proof. A partition of ``0..i`` into ``k`` batches is a partition of ``0..s-1`` into ``k-1`` batches and the
batch ``s..i``; the batch ends at ``g(x) = max(k Ts + T[0..i], x) + C[s..i]`` where ``x`` is the end of the
prefix's forward. ``g`` is non-decreasing in ``x`` and ``P_k`` does not depend on how the prefix was cut,
so replacing the prefix by one ending at ``G_{k-1}[s-1]`` (the least possible, by induction on ``k``, and
attained) never ends later: the minimum over ``s`` is attained and is a lower bound. The answer is
``min_k G_k[L-1]``; among ``k`` within a relative ``1e-12`` of it (rounding) the least ``k`` wins, so
ties go to the fewest messages. ``O(L^3)`` work in ``L`` numpy passes of ``L x L``: GoogLeNet's 60-odd
pulled layers take milliseconds. ``tests/test_pull.py`` checks it against exhaustive search.

With a slowdown ``d > 0`` the batch's end is ``adv(max(P_k, x), C[s..i])``, and ``adv`` needs ``P_N``,
which depends on the number of batches ``N`` of the whole plan (``P_N = N Ts + T[0..L-1]``). So the DP
runs once per ``N`` with ``P_N`` fixed, keeping ``G_N[L-1]``; ``adv`` is non-decreasing in ``t`` (each
branch is, and they meet at ``t = P_N``), so the proof above holds for each ``N`` unchanged. ``N`` stops
growing once ``P_N + C_{L-1}`` (a bound on every plan of ``N`` or more batches: the last layer runs after
the last pull, at full speed) exceeds the best time found. At most ``O(L^4)`` work in ``L^2 / 2`` numpy
passes: 123 layers (GoogLeNet on our runtime) take about a second without the bound.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpcomm.errors import UserError

__all__ = [
    "CONFIRM_REL",
    "IBATCH_MARGIN",
    "IBATCH_MARGIN_DEDICATED",
    "PULL_METHODS",
    "PullPlan",
    "confirm_plan",
    "fit_slowdown",
    "ibatch_margin",
    "ibatch_backward",
    "ibatch_forward",
    "plan_pulls",
    "pull_time",
]

PULL_METHODS = ("all", "layer", "ibatch", "optimal")
"""Pull-plan methods, in the order the CLI lists them."""
TIE_REL = 1e-12
"""Relative difference in modelled time below which two plans tie (fewer batches win)."""

SLOWDOWN_MAX = 4.0
"""The largest slowdown :func:`fit_slowdown` returns (a forward 5x slower while pulling)."""
SLOWDOWN_NOISE = 0.02
"""A measurement within this fraction of the model without a slowdown fits ``d = 0``. Where the pulls,
not the forward, set a plan's time, ``F_N`` hardly moves with ``d``, and a gap of noise fitted ``d`` = 3-4
(LeNet-5 and GoogLeNet on the testbed: gaps of 0.2-0.7% against 19-69% where ``d`` is real,
``docs/ps.md``)."""

CONFIRM_REL = 0.10
""":func:`confirm_plan`: a probed plan that ran more than this fraction slower than the model is refuted.
On the testbed (2-core VM, ``docs/ps.md``), before this rule, the probes of 16 of 19 plans ran at
0.85-1.07 of the model; of the other three, two had three processes computing on two cores (1.21, 1.24)
and one was Algorithm 1's three batches with five co-located workers (the first batch 72% of the bytes):
1.31 in the probe and 1.44 in training, its first batch in at twice its modelled time every round, as the
servers' FIFO NIC queues let one worker's later batches go before another worker's first. With the rule,
23 probes ran at 0.87-1.10 and five plans were refuted at 1.10-1.22."""

IBATCH_MARGIN = 0.01
"""``ibatch`` keeps Algorithm 1's or 2's batches over the better of ``all`` and ``layer`` only for a modelled
gain of more than this fraction: a smaller gain is a bet against effects the model leaves out. One of them:
a server sends each batch to its workers one after the other, and the first gets a head start. ResNet-20,
two workers and one dedicated server at 100 Mbit/s (five runs): the first worker's ``F_N`` was 7-11 ms
shorter than the second's pulling everything and 13-21 ms shorter with Algorithm 1's three batches (72% of
the bytes in the first); layer by layer they were within 4 ms, and reversing the send order reversed it.
There Algorithm 1 was modelled 0.1-1% ahead of ``layer`` and measured 2-7% behind (13% in an earlier run;
``docs/ps.md``). 1% does not cover every such case: one of those runs gained 1.0003%, and with three
workers gains of 1.4-1.8% measured 2.5-3.1% behind. 2% would, but the paper's worked example (Fig. 4(c),
our numbers) gains 1.7% and would lose its three batches; dedicated servers that send to several workers,
where those losses were, take :data:`IBATCH_MARGIN_DEDICATED` instead. A greedy plan that *ties* the
better baseline (the same modelled time) is kept when it has fewer batches: that is the tie rule, and no
bet."""

IBATCH_MARGIN_DEDICATED = 0.05
"""``ibatch``'s margin with dedicated servers and two or more workers (:func:`ibatch_margin`): every
dedicated server then sends each batch to several workers, one after the other (every tensor is striped
over all servers, :mod:`dpcomm.ps.keys`). Measured on the testbed (2-core VM, ``docs/ps.md``), every
greedy plan modelled 0.1-1.8% ahead of ``layer`` in that placement ran behind it (two workers and one
server, three and one; up to 8.5% behind, 1.2% ahead in the model), and the three modelled 21.7-28.7%
ahead ran 27-35% ahead. No measured gain fell between 1.8% and 21.7%, so any margin in between separates
them; 5% leaves room both ways. Co-located servers keep :data:`IBATCH_MARGIN`: there greedy plans
modelled 1.1-5% ahead ran ahead (one modelled 13.3% ahead ran 5.9% behind, with three workers and their
servers on two cores, where one plan measured twice differs by up to 29%), and the simulated 72-node
reproduction is co-located."""

Batches = list[tuple[int, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class PullPlan:
    """Batches of layers pulled as one message each, in forward order; plain data like :class:`Plan`."""

    method: str
    """The method that made it: ``all``, ``layer``, ``ibatch`` or ``optimal``."""
    num_layers: int
    """L, the number of layers (pulled units) of the model."""
    batches: tuple[tuple[int, int], ...]
    """``(first, last)`` layer indices per batch, inclusive, 0-based, forward order, covering ``0..L-1``."""
    time_s: float = field(default=float("nan"), compare=False)
    """The model's execution time ``F_N`` of these batches, seconds (NaN when unknown)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form facts (the greedy candidates' times, ...); not part of the plan's identity."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "batches", tuple((int(a), int(b)) for a, b in self.batches))
        _check(self.batches, self.num_layers)

    @property
    def messages(self) -> int:
        """Pulls per iteration (one start-up ``Ts`` each)."""
        return len(self.batches)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_layers": self.num_layers,
            "batches": [list(b) for b in self.batches],
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> PullPlan:
        return cls(
            method=obj["method"], num_layers=obj["num_layers"], batches=[tuple(b) for b in obj["batches"]]
        )

    def sha256(self) -> str:
        """Identity of the plan (method and batches) for cross-rank agreement checks."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def _check(batches: Sequence[tuple[int, int]], L: int) -> None:
    expect = 0
    for a, b in batches:
        if a != expect or b < a:
            raise ValueError(f"pull batches {list(batches)} do not cover layers 0..{L - 1} in order")
        expect = b + 1
    if expect != L or L < 1:
        raise ValueError(f"pull batches {list(batches)} do not cover layers 0..{L - 1}")


def _inputs(compute_s, transfer_s, startup_s) -> tuple[np.ndarray, np.ndarray, float]:
    C = np.asarray(compute_s, dtype=float).ravel()
    T = np.asarray(transfer_s, dtype=float).ravel()
    if C.size != T.size or C.size < 1:
        raise UserError(f"need one forward and one transfer time per layer, got {C.size} and {T.size}")
    if not (np.all(np.isfinite(C)) and np.all(np.isfinite(T)) and np.isfinite(startup_s)):
        raise UserError("pull-plan times must be finite")
    if np.any(C < 0) or np.any(T < 0) or startup_s < 0:
        raise UserError("pull-plan times must be >= 0 seconds")
    return C, T, float(startup_s)


def _slowdown(d: float) -> float:
    d = float(d)
    if not (np.isfinite(d) and d >= 0):
        raise UserError(f"the forward's slowdown while pulling must be a number >= 0, got {d}")
    return d


def _adv(t, w, P_N: float, r: float):
    """When ``w`` seconds of forward (at full speed) started at ``t`` end, running ``r = 1 + d`` times slower
    before ``P_N`` (module docstring); numpy arrays or floats."""
    return np.maximum(t + w, np.minimum(t + r * w, P_N + w - (P_N - t) / r))


def pull_time(
    batches: Sequence[tuple[int, int]], compute_s, transfer_s, startup_s: float, *, slowdown: float = 0.0
) -> float:
    """The model's ``F_N`` for ``batches`` (module docstring), seconds, summed one batch at a time."""
    C, T, Ts = _inputs(compute_s, transfer_s, startup_s)
    r = 1.0 + _slowdown(slowdown)
    _check(batches, C.size)
    P_N = len(batches) * Ts + float(T.sum())
    P = F = 0.0
    for a, b in batches:
        P += Ts + float(T[a : b + 1].sum())  # this batch's pull ends
        F = float(_adv(max(P, F), float(C[a : b + 1].sum()), P_N, r))  # and its forward
    return F


def confirm_plan(
    plan: PullPlan, compute_s, transfer_s, startup_s: float, measured_s: float, *, rel: float = CONFIRM_REL
) -> PullPlan:
    """``plan`` (made under the paper's model, ``d = 0``) if its measured ``F_N`` (``measured_s``, s; a
    forward beside its pulls, :meth:`dpcomm.ps.rank.PsRank._probe_overlap`) is at most ``1 + rel`` times
    the model's, else the better of ``all`` and ``layer`` under the model (ties: ``all``, one message),
    under ``plan``'s method name, ``meta["algorithm"]`` naming it. Either way ``meta`` records
    ``probe_s``, ``probe_model_s`` and ``confirmed``. A plan that is ``all`` or ``layer`` already is kept:
    the model has no better one to offer. A refuted plan is a fact about the network the model leaves out
    (:data:`CONFIRM_REL`); the baselines are what a user would otherwise run."""
    C, T, Ts = _inputs(compute_s, transfer_s, startup_s)
    L = C.size
    model = pull_time(plan.batches, C, T, Ts)
    ok = not np.isfinite(measured_s) or measured_s <= (1.0 + rel) * model
    facts = {"probe_s": float(measured_s), "probe_model_s": model, "confirmed": bool(ok)}
    if ok or plan.messages in (1, L):
        return replace(plan, meta={**plan.meta, **facts})
    base = min((plan_pulls(C, T, Ts, m) for m in ("all", "layer")), key=lambda p: (p.time_s, p.messages))
    meta = {
        **plan.meta,
        **facts,
        "algorithm": base.method,
        "refuted_batches": [list(b) for b in plan.batches],
    }
    return replace(base, method=plan.method, meta=meta)


def fit_slowdown(
    batches: Sequence[tuple[int, int]], compute_s, transfer_s, startup_s: float, measured_s: float
) -> float:
    """The slowdown ``d`` under which the model's ``F_N`` of ``batches`` is ``measured_s`` (seconds): 0 when
    the model without one is within ``SLOWDOWN_NOISE`` of it or slower, and 0 when no ``d`` up to
    ``SLOWDOWN_MAX`` moves the model by more than that (``batches`` overlap too little for ``d`` to be
    told from noise: ``all`` never does); else at most ``SLOWDOWN_MAX``. ``F_N`` is non-decreasing in
    ``d`` (``adv`` is, for every ``t``), so bisection finds it (to ``1e-4``)."""
    lo, hi = 0.0, SLOWDOWN_MAX
    if not np.isfinite(measured_s):
        return 0.0
    band = (1 + SLOWDOWN_NOISE) * pull_time(batches, compute_s, transfer_s, startup_s)
    if measured_s <= band or pull_time(batches, compute_s, transfer_s, startup_s, slowdown=hi) <= band:
        return 0.0
    if pull_time(batches, compute_s, transfer_s, startup_s, slowdown=hi) <= measured_s:
        return hi
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        if pull_time(batches, compute_s, transfer_s, startup_s, slowdown=mid) < measured_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _cuts_to_batches(last: Sequence[int]) -> Batches:
    """Paper's ``l_1 < .. < l_N = L`` (1-based last layers) -> 0-based ``(first, last)`` pairs."""
    out, first = [], 0
    for l in last:
        out.append((first, l - 1))
        first = l
    return out


def ibatch_forward(compute_s, transfer_s, startup_s: float) -> Batches:
    """Algorithm 1: choose ``l_1, l_2, ..`` (1-based last layers) forwards; returns 0-based batches."""
    C, T, Ts = _inputs(compute_s, transfer_s, startup_s)
    L = C.size
    if L == 1:
        return [(0, 0)]
    cC = np.concatenate(([0.0], np.cumsum(C)))  # cC[l] = C_1 + .. + C_l (paper indices)
    cT = np.concatenate(([0.0], np.cumsum(T)))

    def comm(a: int, b: int) -> float:  # Ts + Tt over paper layers a+1..b
        return Ts + cT[b] - cT[a]

    # first step (lines 2-5, choice 1 of the module docstring for l_2)
    pairs = [(l1, l2) for l1 in range(1, L) for l2 in range(l1 + 1, L + 1) if comm(l1, l2) > cC[l1]]
    if pairs:
        best_overlap = max(cC[l1] for l1, _ in pairs)
        pairs = [p for p in pairs if cC[p[0]] == best_overlap]
        first_comm = min(comm(0, l1) for l1, _ in pairs)
        pairs = [p for p in pairs if comm(0, p[0]) == first_comm]
        l1, l2 = min(pairs, key=lambda p: (comm(p[0], p[1]) - cC[p[0]], p[1]))
    else:
        l1, l2 = 1, L  # choice 2
    last = [l1, l2]
    while last[-1] < L:  # rest steps (lines 7-13)
        prev2, prev = (last[-2] if len(last) > 1 else 0), last[-1]
        overlap = cC[prev] - cC[prev2]  # forward of batch k-1
        ok = [lx for lx in range(prev + 1, L + 1) if comm(prev, lx) > overlap]
        last.append(min(ok, key=lambda lx: comm(prev, lx) - overlap) if ok else L)
    return _cuts_to_batches(last)


def ibatch_backward(compute_s, transfer_s, startup_s: float) -> Batches:
    """Algorithm 2: choose ``l_{N-1}, l_{N-2}, ..`` backwards; returns 0-based batches."""
    C, T, Ts = _inputs(compute_s, transfer_s, startup_s)
    L = C.size
    if L == 1:
        return [(0, 0)]
    cC = np.concatenate(([0.0], np.cumsum(C)))
    cT = np.concatenate(([0.0], np.cumsum(T)))

    def comm(a: int, b: int) -> float:
        return Ts + cT[b] - cT[a]

    # first step: pairs (l_{N-1}, l_{N-2}) with 0 <= l_{N-2} < l_{N-1} < L meeting Eq. 5 for k = N-1
    pairs = [(a, b) for a in range(1, L) for b in range(0, a) if comm(a, L) > cC[a] - cC[b]]
    if pairs:
        best_overlap = max(cC[a] - cC[b] for a, b in pairs)
        pairs = [p for p in pairs if cC[p[0]] - cC[p[1]] == best_overlap]
        last_comp = min(cC[L] - cC[a] for a, _ in pairs)
        pairs = [p for p in pairs if cC[L] - cC[p[0]] == last_comp]
        lN1, lN2 = max(pairs, key=lambda p: (p[1], p[0]))  # choice 1: ties only with zero-time layers
    else:
        lN1, lN2 = 1, 0  # choice 2
    last = [lN2, lN1, L] if lN2 > 0 else [lN1, L]
    while last[0] > 0:  # rest steps: choose l_k for k+1 = first of `last`
        nxt, nxt2 = last[0], last[1]  # l_{k+1}, l_{k+2}
        need = comm(nxt, nxt2)  # batch k+2's pull, to hide under batch k+1's forward
        ok = [lx for lx in range(0, nxt) if need > cC[nxt] - cC[lx]]
        lk = min(ok, key=lambda lx: need - (cC[nxt] - cC[lx])) if ok else nxt - 1
        last.insert(0, lk)
    return _cuts_to_batches([l for l in last if l > 0])


def _optimal(C: np.ndarray, T: np.ndarray, Ts: float, d: float = 0.0) -> tuple[float, Batches]:
    L = C.size
    cC = np.concatenate(([0.0], np.cumsum(C)))
    cT = np.cumsum(T)  # cT[i] = T_0 + .. + T_i
    span = cC[None, 1:] - cC[:-1, None]  # span[s, i] = C_s + .. + C_i where s <= i
    span[np.tril_indices(L, -1)] = np.inf  # no batch s..i with s > i
    r = 1.0 + d

    def dp(upto: int, P_N: float) -> tuple[list[float], list[np.ndarray]]:
        """``G_k[L-1]`` for k = 1..upto and every level's cuts; d > 0: the forward slowed before ``P_N``."""
        G = _adv(Ts + cT, cC[1:], P_N, r) if d else Ts + cT + cC[1:]  # G_1[i]
        tops, cuts = [float(G[L - 1])], [np.zeros(L, dtype=np.int64)]
        buf = np.empty((L - 1, L))
        for k in range(2, upto + 1):
            # row s-1 (s = 1..L-1): adv(max(k Ts + T[0..i], G_{k-1}[s-1]), C[s..i])
            np.maximum(G[:-1, None], (k * Ts + cT)[None, :], out=buf)
            if d:
                buf = _adv(buf, span[1:, :], P_N, r)  # inf where s > i, as below
            else:
                buf += span[1:, :]
            s = np.argmin(buf, axis=0)
            G = buf[s, np.arange(L)]
            cuts.append(s + 1)
            tops.append(float(G[L - 1]))
        return tops, cuts

    if d:  # one DP per number of batches N (P_N fixed), keeping G_N[L-1]
        tops, cuts_of = [], []
        for N in range(1, L + 1):
            P_N = N * Ts + float(cT[-1])
            if tops and P_N + C[-1] > min(tops):  # every plan of N or more batches ends after P_N + C_{L-1}
                break
            t, c = dp(N, P_N)
            tops.append(t[-1])
            cuts_of.append(c)
    else:  # d = 0: one DP gives every N
        tops, cuts = dp(L, 0.0)
        cuts_of = [cuts] * L
    best = min(tops)
    limit = best + TIE_REL * max(1.0, abs(best))
    best_k = next(k for k, t in enumerate(tops, start=1) if t <= limit)
    cuts = cuts_of[best_k - 1]
    batches, i = [], L - 1
    for k in range(best_k - 1, -1, -1):
        s = int(cuts[k][i])
        batches.append((s, i))
        i = s - 1
    batches.reverse()
    return tops[best_k - 1], batches


def ibatch_margin(workers: int, servers: int) -> float:
    """``ibatch``'s margin for ``workers`` workers and ``servers`` dedicated servers (0: co-located):
    :data:`IBATCH_MARGIN_DEDICATED` where dedicated servers send to two or more workers, else
    :data:`IBATCH_MARGIN`."""
    return IBATCH_MARGIN_DEDICATED if servers >= 1 and workers >= 2 else IBATCH_MARGIN


def plan_pulls(
    compute_s,
    transfer_s,
    startup_s: float,
    method: str = "ibatch",
    *,
    slowdown: float = 0.0,
    margin: float = IBATCH_MARGIN,
) -> PullPlan:
    """The pull plan of ``method`` for per-layer forward times ``compute_s`` (``C_i``), per-layer transfer
    times ``transfer_s`` (``Tt_i``) and the start-up ``startup_s`` (``Ts``), all seconds, forward order;
    ``slowdown`` (``d``): the forward runs ``1 + d`` times slower while pulls are in flight (module
    docstring). The greedy algorithms are the paper's (they see ``C`` as given); their candidates, and
    ``optimal``, are timed with ``d``. ``margin``: ``ibatch``'s least gain of a greedy candidate over the
    better of ``all`` and ``layer`` (a fraction in [0, 1); :data:`IBATCH_MARGIN`)."""
    C, T, Ts = _inputs(compute_s, transfer_s, startup_s)
    if not 0.0 <= margin < 1.0:
        raise UserError(f"ibatch margin must be in [0, 1), not {margin!r}")
    d = _slowdown(slowdown)
    L = C.size
    name = str(method).strip().lower()
    meta: dict[str, Any] = {}
    if name == "all":
        batches: Batches = [(0, L - 1)]
    elif name == "layer":
        batches = [(i, i) for i in range(L)]
    elif name == "ibatch":
        cands = {
            "forward": ibatch_forward(C, T, Ts),
            "backward": ibatch_backward(C, T, Ts),
            "all": [(0, L - 1)],
            "layer": [(i, i) for i in range(L)],
        }
        times = {k: pull_time(b, C, T, Ts, slowdown=d) for k, b in cands.items()}
        meta = {"candidates_s": times}
        best = min(times.values())
        tied = [k for k in times if times[k] <= best + TIE_REL * max(1.0, abs(best))]
        # equal modelled time: the fewest pulls (a baseline's name where the batches are the same)
        pick = min(tied, key=lambda k: (len(cands[k]), k not in ("all", "layer")))
        base = min(("all", "layer"), key=lambda k: (times[k], len(cands[k])))
        if base not in tied and best >= (1.0 - margin) * times[base]:  # a gain of at most the margin
            pick = base
        meta["algorithm"] = pick
        if margin:
            meta["margin"] = margin
        batches = cands[pick]
    elif name == "optimal":
        meta["dp_time_s"], batches = _optimal(C, T, Ts, d)
    else:
        raise UserError(f"unknown pull method {method!r}: use one of {', '.join(PULL_METHODS)}")
    if d:
        meta["slowdown"] = d
    return PullPlan(
        method=name, num_layers=L, batches=batches, time_s=pull_time(batches, C, T, Ts, slowdown=d), meta=meta
    )
