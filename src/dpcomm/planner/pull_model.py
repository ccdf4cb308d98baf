"""The iBatch paper's execution-time model of a worker's pulls and forward, and :class:`PullPlan`.

Source: Wang et al., "iBatch: Saving Ethernet Bandwidth ... batching parameter communication and forward
computation" (the iBatch paper), section "Problem Formulation" (Eq. 1-5). Names follow the paper: ``C_i``
forward time of layer ``i``, ``Tt_i`` transfer time of layer ``i``'s parameters (from all servers), ``Ts``
the start-up of one pull, ``l_k`` the last layer of batch ``k``, ``N`` batches. Layers are 0-based here (the
paper's layer ``i`` is our ``i - 1``). The planners that use this model are :mod:`dpcomm.planner.pull`
(the public entry points), :mod:`dpcomm.planner.pull_ibatch` (Algorithms 1-2) and
:mod:`dpcomm.planner.pull_optimal` (the exact DP).

The model (the paper's Eq. 1-4, generalised so that it holds whether or not Eq. 5 does): a worker's pulls
run one after another on its link, and batch ``k``'s forward needs batch ``k``'s parameters::

    P_k = sum_{j <= k} (Ts + sum_{i in batch j} Tt_i)          batch k's pull ends   (seconds)
    F_k = max(P_k, F_{k-1}) + sum_{i in batch k} C_i           batch k's forward ends (F_0 = 0)
    time = F_N

When every batch ``k+1``'s pull outlasts batch ``k``'s forward (Eq. 5), ``F_N = P_N + sum C(batch N)``,
which is Eq. 4 (``EXE1 + EXE2 + EXE3``). Unrolled, ``F_N = max_k (P_k + sum of C from batch k's first layer
to the end)``.

Slowdown ``d`` (ours, not the paper's; 0 by default, where the model is the above). Receiving pulls takes
CPU too: where the forward and the network threads share saturated cores, the forward runs slower while
pulls are in flight (two workers on 2 cores at 500 Mbit/s: 2-3 ms over an 8 ms pull, ``docs/ps.md``). With
``d > 0`` the forward does ``1/(1+d)`` of a second's work per second before ``P_N`` (the last pull's end)
and full speed after::

    F_k = adv(max(P_k, F_{k-1}), sum_{i in batch k} C_i)
    adv(t, w) = t + w                                   if t >= P_N
              = min(t + (1+d) w,  P_N + w - (P_N - t)/(1+d))   otherwise

which is ``max(t + w, min(t + (1+d) w, P_N + w - (P_N - t)/(1+d)))`` in one line. ``all`` is never slowed
(its forward starts at ``P_N``); plans that overlap more pay more. :func:`fit_slowdown` fits ``d`` to a
measured ``F_N``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpcomm.errors import UserError

__all__ = [
    "SLOWDOWN_MAX",
    "SLOWDOWN_NOISE",
    "TIE_REL",
    "Batches",
    "PullPlan",
    "adv",
    "check_batches",
    "check_slowdown",
    "fit_slowdown",
    "pull_inputs",
    "pull_time",
]

TIE_REL = 1e-12
"""Relative difference in modelled time below which two plans tie (fewer batches win)."""

SLOWDOWN_MAX = 4.0
"""The largest slowdown :func:`fit_slowdown` returns (a forward 5x slower while pulling)."""
SLOWDOWN_NOISE = 0.02
"""A measurement within this fraction of the model without a slowdown fits ``d = 0``. Where the pulls,
not the forward, set a plan's time, ``F_N`` hardly moves with ``d``, and a gap of noise fitted ``d`` = 3-4
(LeNet-5 and GoogLeNet on the testbed: gaps of 0.2-0.7% against 19-69% where ``d`` is real,
``docs/ps.md``)."""

Batches = list[tuple[int, int]]
"""``(first, last)`` layer indices per batch, inclusive, 0-based, forward order."""


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
        check_batches(self.batches, self.num_layers)

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


def check_batches(batches: Sequence[tuple[int, int]], L: int) -> None:
    """Raise ``ValueError`` unless ``batches`` cover layers ``0..L-1`` in order, each non-empty."""
    expect = 0
    for a, b in batches:
        if a != expect or b < a:
            raise ValueError(f"pull batches {list(batches)} do not cover layers 0..{L - 1} in order")
        expect = b + 1
    if expect != L or L < 1:
        raise ValueError(f"pull batches {list(batches)} do not cover layers 0..{L - 1}")


def pull_inputs(compute_s, transfer_s, startup_s) -> tuple[np.ndarray, np.ndarray, float]:
    """``(C, T, Ts)`` as float arrays and a float, checked: one of each per layer, finite, >= 0 seconds."""
    C = np.asarray(compute_s, dtype=float).ravel()
    T = np.asarray(transfer_s, dtype=float).ravel()
    if C.size != T.size or C.size < 1:
        raise UserError(f"need one forward and one transfer time per layer, got {C.size} and {T.size}")
    if not (np.all(np.isfinite(C)) and np.all(np.isfinite(T)) and np.isfinite(startup_s)):
        raise UserError("pull-plan times must be finite")
    if np.any(C < 0) or np.any(T < 0) or startup_s < 0:
        raise UserError("pull-plan times must be >= 0 seconds")
    return C, T, float(startup_s)


def check_slowdown(d: float) -> float:
    """The slowdown ``d`` as a float, checked (finite, >= 0)."""
    d = float(d)
    if not (np.isfinite(d) and d >= 0):
        raise UserError(f"the forward's slowdown while pulling must be a number >= 0, got {d}")
    return d


def adv(t, w, P_N: float, r: float):
    """When ``w`` seconds of forward (at full speed) started at ``t`` end, running ``r = 1 + d`` times slower
    before ``P_N`` (module docstring); numpy arrays or floats."""
    return np.maximum(t + w, np.minimum(t + r * w, P_N + w - (P_N - t) / r))


def pull_time(
    batches: Sequence[tuple[int, int]], compute_s, transfer_s, startup_s: float, *, slowdown: float = 0.0
) -> float:
    """The model's ``F_N`` for ``batches`` (module docstring), seconds, summed one batch at a time."""
    C, T, Ts = pull_inputs(compute_s, transfer_s, startup_s)
    r = 1.0 + check_slowdown(slowdown)
    check_batches(batches, C.size)
    P_N = len(batches) * Ts + float(T.sum())
    P = F = 0.0
    for a, b in batches:
        P += Ts + float(T[a : b + 1].sum())  # this batch's pull ends
        F = float(adv(max(P, F), float(C[a : b + 1].sum()), P_N, r))  # and its forward
    return F


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
