"""``bucket:auto``: the best single bucket size, for the frameworks that take one number (issue 55).

Most frameworks take one size (the Trainer's ``ddp_bucket_cap_mb``, Accelerate's and DDP's ``bucket_cap_mb``,
DeepSpeed's ``reduce_bucket_size``, Megatron-Core's ``bucket_size``), not a list of groups. With a size
given, DDP cuts every bucket, the first included, at that cap (``_BucketCapacityConfig``: only its default
makes the first bucket 1 MiB), which is :func:`dpcomm.planner.bucket.plan_bucket` without ``first_bytes``:
walk the units in backward order, close a group once it holds ``>= c`` bytes.

Exact over the sizes. The layout depends on ``c`` only through comparisons ``held >= c``, and every
``held`` is a sum of a run of consecutive units, so between two consecutive run sums the layout is one.
Walking ``c`` upwards from the smallest unit: a layout stays while ``c`` is at most ``h``, the least
``held`` at which one of its groups closed (the last group's close changes nothing); just above ``h`` that
group no longer closes there, and the next layout is the one at the least run sum above ``h`` (found in
``O(L log L)`` by a search from each start on the prefix sums). So every distinct layout is met once,
each priced as ``optimal`` prices a partition (MG-WFBP Eq. 9's recurrence: a group starts when its last
gradient is ready and the previous group is done, then takes ``T(bytes)``), and the least modelled time
wins; ties go to the fewer groups, then the smaller size.

Symbols: ``L`` units, ``m_i`` bytes and ``r_i`` ready time of unit ``i`` in backward order, ``c`` the
size (bytes). Cost: ``O(K L log L)`` for ``K`` distinct layouts (``K <= L(L+1)/2``; a few hundred on the
zoo's models).
"""

from __future__ import annotations

import time

import numpy as np

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, cost_many, finish, layer_bytes, ready_times
from dpcomm.trace.format import Trace

__all__ = ["best_single_size", "layout", "plan_bucket_auto"]

TIE_REL = 1e-12
"""Relative difference in modelled time below which two sizes tie (as :mod:`dpcomm.planner.optimal`)."""


def layout(m: np.ndarray, c: float) -> tuple[list[int], float]:
    """Group sizes (backward order) of the cap ``c`` over bytes ``m`` (backward order), and the least
    ``held`` at which a group other than the last closed (``inf`` when none did)."""
    sizes, count, held, least = [], 0, 0.0, np.inf
    for k, x in enumerate(m):
        count += 1
        held += x
        if held >= c:
            sizes.append(count)
            if k < m.size - 1:
                least = min(least, held)
            count, held = 0, 0.0
    if count:
        sizes.append(count)
    return sizes, least


def t_end(r: np.ndarray, m: np.ndarray, sizes: list[int], cost: CommCost) -> float:
    """The end of the last group (MG-WFBP Eq. 9's recurrence), groups ``sizes`` in backward order."""
    ends = np.cumsum(sizes) - 1
    starts = ends - np.asarray(sizes) + 1
    P = np.concatenate(([0.0], np.cumsum(m)))
    T = cost_many(cost, P[ends + 1] - P[starts])
    done = -np.inf
    for e, t in zip(ends, T, strict=True):
        done = max(done, r[e]) + t
    return float(done)


def _next_run_sum(P: np.ndarray, h: float) -> float:
    """The least sum of consecutive units greater than ``h`` (``inf`` when none is)."""
    j = np.searchsorted(P, P[:-1] + h, side="right")  # from each start, the first end past h
    ok = j < P.size
    return float((P[j[ok]] - P[:-1][ok]).min()) if ok.any() else np.inf


def best_single_size(r: np.ndarray, m: np.ndarray, cost: CommCost) -> tuple[float, float, list[int], int]:
    """``(t_end, c, sizes, layouts)``: the least modelled end over every single size, the size that gives
    it (bytes), its groups (backward order) and how many distinct layouts were priced."""
    P = np.concatenate(([0.0], np.cumsum(m)))
    c = _next_run_sum(P, 0.0) if P[-1] > 0 else 1.0  # the smallest unit: a group per unit
    best: tuple[float, int, float, list[int]] | None = None
    count = 0
    while np.isfinite(c):
        sizes, least = layout(m, c)
        t = t_end(r, m, sizes, cost)
        count += 1
        if best is None or t < best[0] - TIE_REL * max(1.0, abs(best[0])):
            best = (t, len(sizes), c, sizes)
        elif t <= best[0] + TIE_REL * max(1.0, abs(best[0])) and len(sizes) < best[1]:
            best = (t, len(sizes), c, sizes)
        if not np.isfinite(least):
            break  # one group, or groups no larger size changes
        c = _next_run_sum(P, least)
    assert best is not None
    return best[0], best[2], best[3], count


def plan_bucket_auto(trace: Trace, cost: CommCost, nodes: int) -> Plan:
    """The single bucket size with the least modelled iteration time (module docstring), ``bucket:auto``;
    ``meta``: ``bucket_bytes`` (the size), ``bucket_cap_mb`` (the same in MiB, as DDP and the frameworks
    take it), ``t_iter_s`` (the modelled end of the last group) and ``layouts`` (sizes priced)."""
    t0 = time.perf_counter()
    check_nodes(nodes)
    t, c, sizes, count = best_single_size(ready_times(trace)[::-1], layer_bytes(trace)[::-1], cost)
    size = int(c)
    return finish(
        "bucket:auto", sizes, trace, nodes, t0, bucket_bytes=size, bucket_cap_mb=size / 2**20, t_iter_s=t,
        layouts=count,
    )  # fmt: skip
