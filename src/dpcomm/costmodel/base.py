"""All-reduce cost functions as the planners consume them: ``T_ar(M)`` seconds for ``M`` bytes.

MG-WFBP Eq. 9 reduces every all-reduce algorithm, for a fixed number of nodes N, to the linear form
``T_ar(M) = a + b*M``; :class:`LinearCost` is that form. :class:`MeasuredCost` is a table of measured
(bytes, seconds) points, interpolated linearly between points and extrapolated from the last two, made
non-decreasing (a running maximum) so the planners' optimality argument still holds.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["CommCost", "LinearCost", "MeasuredCost"]


@runtime_checkable
class CommCost(Protocol):
    """A non-decreasing cost of one collective call: seconds for ``nbytes`` bytes (``nbytes >= 0``)."""

    def __call__(self, nbytes: float) -> float: ...


@dataclass(frozen=True, slots=True)
class LinearCost:
    """``T(M) = a + b*M`` (MG-WFBP Eq. 9). ``a``: start-up seconds; ``b``: seconds per byte.

    ``T(0) = 0``: a call that moves nothing is not made.
    """

    a: float
    b: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)) or self.a < 0 or self.b < 0:
            raise ValueError(f"linear cost needs finite a >= 0 and b >= 0, got a={self.a}, b={self.b}")

    def __call__(self, nbytes: float) -> float:
        return self.a + self.b * nbytes if nbytes > 0 else 0.0

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`__call__` on every element of an array (the planners' vectorised path)."""
        return np.where(nbytes > 0, self.a + self.b * nbytes, 0.0)


@dataclass(frozen=True, slots=True)
class MeasuredCost:
    """Piecewise-linear, non-decreasing interpolation of measured ``(bytes, seconds)`` points."""

    points: tuple[tuple[float, float], ...]
    _xs: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)
    """The points' byte counts (sorted), kept for the bisection of every call."""

    def __post_init__(self) -> None:
        pts = sorted((float(m), float(t)) for m, t in self.points)
        if len(pts) < 2:
            raise ValueError("a measured cost needs at least two (bytes, seconds) points")
        if any(m < 0 or t < 0 or not math.isfinite(t) for m, t in pts):
            raise ValueError("measured points need bytes >= 0 and finite seconds >= 0")
        if len({m for m, _ in pts}) != len(pts):
            raise ValueError("measured points need distinct byte counts")
        mono, best = [], 0.0
        for m, t in pts:
            best = max(best, t)
            mono.append((m, best))
        object.__setattr__(self, "points", tuple(mono))
        object.__setattr__(self, "_xs", tuple(m for m, _ in mono))

    def __call__(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        pts, xs = self.points, self._xs
        i = bisect.bisect_left(xs, nbytes)
        if i == 0:
            return pts[0][1]  # below the smallest measurement: the start-up cost dominates
        if i == len(pts):
            (m0, t0), (m1, t1) = pts[-2], pts[-1]
        else:
            (m0, t0), (m1, t1) = pts[i - 1], pts[i]
        slope = (t1 - t0) / (m1 - m0)
        return t0 + slope * (nbytes - m0) if i < len(pts) else t1 + slope * (nbytes - m1)

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`__call__` on every element of an array: the same clamping below the first point and
        extrapolation past the last."""
        xs = np.asarray(self._xs)
        ys = np.array([t for _, t in self.points])
        out = np.interp(nbytes, xs, ys)  # clamps to ys[0] below xs[0]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(nbytes > xs[-1], ys[-1] + slope * (nbytes - xs[-1]), out)
        return np.where(nbytes > 0, out, 0.0)
