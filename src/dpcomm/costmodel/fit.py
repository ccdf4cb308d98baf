"""The one least-squares fit of dpcomm: measured times against a cost model that is linear in its parameters.

Every fit in dpcomm has this shape: ``t_i ~ sum_j x_j * A[i, j]``, with ``t_i`` a measured time (seconds) and
row ``A[i]`` what the model multiplies each unknown by. MG-WFBP Eq. 9's ``T_ar(M) = a + b M`` is
``A[i] = (1, M_i)`` (:func:`fit_line`, used by ``dpcomm calibrate``); the alpha-beta-gamma network of
``dpcomm bench --fit`` is ``A[i] = (dT/d alpha, dT/d beta, dT/d gamma)`` of each row's formula
(:func:`fit_least_squares`).

Weighting: ``relative`` (default) weights row ``i`` by ``1/t_i^2``, i.e. minimises relative residuals: times
span decades (4 KB to 64 MB), and an unweighted fit is set by the largest sizes alone, leaving the start-up
term to noise (often negative). ``ols`` weights every row 1. A row with ``t = 0`` gets weight 1.

``nonneg=True`` constrains every parameter to ``>= 0`` (non-negative least squares: a time has no negative
part). The solution is exact: the optimum is the unconstrained fit on some subset of the parameters (the
others at 0), so every subset is solved and the best feasible one kept; with at most a handful of
parameters that is a few tiny solves, and needs no solver library.

``R^2 = 1 - sum w r^2 / sum w (t - mean_w t)^2``, in the fit's own weights (1.0 for a perfect fit).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["WEIGHTINGS", "LinearFit", "fit_least_squares", "fit_line"]

WEIGHTINGS = ("relative", "ols")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearFit:
    """A fitted model ``t ~ A @ coef``."""

    coef: tuple[float, ...]
    """One value per column of ``A`` (seconds per unit of that column)."""
    r2: float
    """Coefficient of determination, in the fit's weighting."""
    weighting: str
    """``relative`` or ``ols``."""


def _solve(a: np.ndarray, t: np.ndarray, w: np.ndarray) -> np.ndarray:
    sw = np.sqrt(w)
    x, *_ = np.linalg.lstsq(a * sw[:, None], t * sw, rcond=None)
    return x


def fit_least_squares(
    features: Sequence[Sequence[float]] | np.ndarray,
    times: Sequence[float] | np.ndarray,
    *,
    weighting: str = "relative",
    nonneg: bool = False,
) -> LinearFit:
    """Fit ``times ~ features @ coef`` (``features``: one row per measurement, one column per parameter).

    ``weighting``: ``relative`` (``1/t^2``) or ``ols``; ``nonneg``: every coefficient ``>= 0``. A
    :class:`ValueError` for mismatched shapes, no rows or an unknown weighting.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    a = np.asarray(features, dtype=float)
    t = np.asarray(times, dtype=float)
    if a.ndim != 2 or t.ndim != 1 or a.shape[0] != t.shape[0] or a.shape[0] == 0:
        raise ValueError(f"need features (rows x params) and one time per row, got {a.shape} and {t.shape}")
    w = np.ones_like(t)
    if weighting == "relative":
        w = np.where(t > 0, 1.0 / np.where(t > 0, t, 1.0) ** 2, 1.0)
    params = a.shape[1]
    if not nonneg:
        x = _solve(a, t, w)
    else:
        best, x = math.inf, np.zeros(params)
        for size in range(params, -1, -1):
            for cols in itertools.combinations(range(params), size):
                cand = np.zeros(params)
                if cols:
                    cand[list(cols)] = _solve(a[:, cols], t, w)
                if (cand < 0).any():
                    continue
                res = float(np.sum(w * (a @ cand - t) ** 2))
                if res < best * (1 - 1e-12):
                    best, x = res, cand
    mean = float(np.sum(w * t) / np.sum(w))
    ss_res = float(np.sum(w * (a @ x - t) ** 2))
    ss_tot = float(np.sum(w * (t - mean) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return LinearFit(coef=tuple(float(v) for v in x), r2=r2, weighting=weighting)


def fit_line(
    points: Sequence[tuple[float, float]], *, weighting: str = "relative", nonneg: bool = False
) -> LinearFit:
    """MG-WFBP Eq. 9: ``t = a + b M`` through ``(M bytes, t seconds)`` points; ``coef == (a, b)``.

    Needs two or more distinct sizes (else :class:`ValueError`). ``nonneg`` keeps ``a, b >= 0`` (what a
    planner needs from a noisy measurement: a flat cost, or a line through the origin, rather than a
    negative start-up or slope).
    """
    if len({float(m) for m, _ in points}) < 2:
        raise ValueError("a line needs points at two or more different sizes")
    features = [(1.0, float(m)) for m, _ in points]
    return fit_least_squares(features, [float(t) for _, t in points], weighting=weighting, nonneg=nonneg)
