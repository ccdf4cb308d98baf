"""Every row of a cluster's nccl-tests table, kept: per-size factors on the fitted model, monotone by
construction.

The fit of :mod:`.fit` (start-up, achievable rates, the latency of large calls, the algorithm, size ranges)
sets a handful of physical values; a log from a real cluster has shapes those values cannot make (the p4d
ring of docs/netsim.md: 128 KiB to 32 MiB off by up to 35%, its protocol changes where NCCL's tuning model
would not change them). So the fitted model ``M`` is corrected per size, as a tuner's per-size table would:

1. **The table's monotone fit** ``y``: the measured times, made non-decreasing in size by isotonic
   regression on their logarithms (pool adjacent violators, each pool at its median: the least sum of
   absolute log errors among non-decreasing sequences, so an outlying row misses alone). A log whose
   time falls as size grows (a noisy row, a protocol switch that pays off) cannot be followed there;
   its pooled rows are where the fit misses, and the table says so.
2. **Factors** ``c_k = y_k / M(s_k)`` at the table's sizes ``s_k`` (the knots), written to the network
   file as ``fabric.row_factors`` with the algorithm they were fitted for.
3. **Pricing** a size ``S`` on a model ``M'`` (the same cluster at any server count; at the fitted count
   ``M' = M``): the knots' times ``z_k = M'(s_k) c_k``, made non-decreasing by a running maximum (at the
   fitted count they are ``y``); between two knots the model's own shape mapped onto them, ``z_k + (z_{k+1}
   - z_k) (M'(S) - M'(s_k)) / (M'(s_{k+1}) - M'(s_k))`` (log-log interpolation where the model does not
   rise there), clamped to ``[z_k, z_{k+1}]``; below the first knot ``min(z_1, z_1 M'(S) / M'(s_1))``,
   above the last ``max(z_n, z_n M'(S) / M'(s_n))``. So the price at the knots is monotone whatever the
   model does, between them it is monotone wherever the model is and never leaves its two knots' band,
   and at the fitted count every row is the monotone fit's.

This is fitting, not validation: the factors reproduce the rows they were fitted on. On another server
count they carry the fitted count's deviations from the model, which is the best the log says; the
held-out comparison of docs/netsim.md uses no factors.
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Callable, Sequence

__all__ = ["correct", "factors", "isotonic", "knot_times", "price_between"]

_KNOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(algo, ranks): model at knots}


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest ``values`` in absolute error (pool adjacent violators with each
    pooled block at its lower median): one outlying row costs that row alone, not its neighbours, as a
    least-squares fit would spread it."""
    blocks: list[list[float]] = []  # each block's values, sorted

    def level(block: list[float]) -> float:
        return block[(len(block) - 1) // 2]

    for v in values:
        blocks.append([float(v)])
        while len(blocks) > 1 and level(blocks[-2]) > level(blocks[-1]):
            last = blocks.pop()
            blocks[-1] = sorted(blocks[-1] + last)
    return [level(b) for b in blocks for _ in b]


def factors(rows: Sequence[tuple[int, float]], model_s: Sequence[float]) -> list[tuple[int, float]]:
    """``(bytes, c_k)`` per row (module docstring, points 1-2): ``rows`` ``(bytes, measured s)`` sorted by
    size, ``model_s`` the fitted model's seconds at those sizes."""
    logs = isotonic([math.log(t) for _, t in rows])
    return [(n, math.exp(y) / m) for (n, _), y, m in zip(rows, logs, model_s, strict=True)]


def knot_times(model_s: Sequence[float], row_factors: Sequence[tuple[int, float]]) -> list[float]:
    """``z_k``: the model's seconds at the knots times the factors, made non-decreasing (running maximum)."""
    out, most = [], 0.0
    for m, (_, c) in zip(model_s, row_factors, strict=True):
        most = max(most, m * c)
        out.append(most)
    return out


def price_between(
    nbytes: int, t_model: float, sizes: Sequence[int], model_s: Sequence[float], z: Sequence[float]
) -> float:
    """The corrected seconds at ``nbytes`` (module docstring, point 3) from the model's own ``t_model``
    there, the knots' sizes, the model's seconds at them and their times ``z``."""
    k = bisect.bisect_right(sizes, nbytes) - 1
    if k < 0:
        return min(z[0], z[0] * t_model / model_s[0]) if model_s[0] > 0 else z[0]
    if k == len(sizes) - 1 or nbytes == sizes[k]:
        return max(z[k], z[k] * t_model / model_s[k]) if k == len(sizes) - 1 and model_s[k] > 0 else z[k]
    lo, hi = z[k], z[k + 1]
    m0, m1 = model_s[k], model_s[k + 1]
    if m1 > m0:
        got = lo + (hi - lo) * (t_model - m0) / (m1 - m0)
    else:  # the model does not rise here: the two knots' own power law
        w = math.log(nbytes / sizes[k]) / math.log(sizes[k + 1] / sizes[k])
        got = lo * (hi / lo) ** w if lo > 0 else hi * w
    return min(max(got, lo), hi)


def correct(
    model: object,
    key: tuple,
    nbytes: int,
    t_model: float,
    row_factors: Sequence[tuple[int, float]],
    price: Callable[[int], float],
) -> float:
    """``t_model`` (the model's seconds at ``nbytes`` for the schedule ``key``) corrected by a calibration's
    ``row_factors``; ``price(size)`` is the uncorrected model at a knot (priced once per model and key)."""
    known = _KNOTS.setdefault(model, {})
    if key not in known:
        known[key] = [price(n) for n, _ in row_factors]
    model_s = known[key]
    sizes = [n for n, _ in row_factors]
    return price_between(nbytes, t_model, sizes, model_s, knot_times(model_s, row_factors))
