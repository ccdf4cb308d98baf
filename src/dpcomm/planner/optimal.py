"""The exact minimum of ``t_iter`` over all contiguous partitions: a dynamic program over backward prefixes.

Problem (MG-WFBP Eq. 23, without the paper's greedy): layers in *backward* order ``i = 0..L-1`` (layer
``L-1-i``) become ready at ``r_0 <= r_1 <= ... <= r_{L-1} = t_f + t_b`` (``r_i = R_{L-1-i}``) and hold
``m_i`` bytes. A plan cuts this sequence into consecutive groups; a group ``s..i`` is ready at ``r_i``
(its lowest-index layer's time), starts at ``max(r_i, end of the previous group)`` and lasts
``T(m_s + ... + m_i)``. ``t_iter`` is the end of the last group.

Recurrence: let ``E[i]`` be the earliest end of the group holding ``i`` over all partitions of ``0..i``
(``E[-1] = -inf``: nothing before). Then::

    E[i] = min_{0 <= s <= i}  max(r_i, E[s-1]) + T(m_s + ... + m_i),      t_iter = E[L-1]

Proof. Any partition of ``0..i`` is a partition of ``0..s-1`` (for some ``s``) followed by the group
``s..i``, whose end is ``g(x) = max(r_i, x) + T(m_s..m_i)`` where ``x`` is the end of the partition of
``0..s-1``. ``g`` is non-decreasing in ``x``, so replacing that partition by one ending at ``E[s-1]``
(the least possible ``x``, by induction) never makes the group end later; and ``E[s-1]`` is attained,
so the minimum over ``s`` of ``g(E[s-1])`` is both reachable and a lower bound. By induction on ``i``,
``E[L-1]`` is the minimum of ``t_iter`` over all ``2^(L-1)`` contiguous partitions. The argument uses
nothing about ``T`` but that it is a function of the group's bytes: it holds for ``a + b*M``, for measured
tables, and for any non-decreasing cost. ``t_iter`` never drops below ``t_f + t_b`` since ``T >= 0``.

Cost: ``L(L+1)/2`` evaluations of ``T``, one numpy row per ``i`` (``O(L^2)`` work, ``O(L)`` Python
steps): ResNet-50 (161 layers) and 2,000 layers are timed in ``benchmarks/planners.py``.
Ties go to the earliest cut (fewer, larger groups).
"""

from __future__ import annotations

import time

import numpy as np

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, cost_many, finish, layer_bytes, no_opts, ready_times
from dpcomm.trace.format import Trace

__all__ = ["optimal_partition", "plan_optimal"]


def optimal_partition(ready_backward: np.ndarray, bytes_backward: np.ndarray, cost: CommCost):
    """``(t_end, sizes)``: the least end of the last group, and group sizes in communication order.

    ``ready_backward``/``bytes_backward`` are ``r_i``/``m_i`` in backward order (see module docstring).
    """
    r = np.asarray(ready_backward, dtype=float)
    L = r.size
    P = np.concatenate(([0.0], np.cumsum(np.asarray(bytes_backward, dtype=float))))  # P[i] = m_0..m_{i-1}
    E_before = np.empty(L + 1)  # E_before[s] = E[s-1]; E[-1] = -inf
    E_before[0] = -np.inf
    cut = np.empty(L, dtype=np.int64)  # cut[i] = s of the best last group s..i
    for i in range(L):
        cand = np.maximum(E_before[: i + 1], r[i]) + cost_many(cost, P[i + 1] - P[: i + 1])
        s = int(np.argmin(cand))
        cut[i] = s
        E_before[i + 1] = cand[s]
    sizes, i = [], L - 1
    while i >= 0:
        s = int(cut[i])
        sizes.append(i - s + 1)
        i = s - 1
    sizes.reverse()  # found last group first; communication order starts with backward index 0
    return float(E_before[L]), sizes


def plan_optimal(trace: Trace, cost: CommCost, nodes: int, **opts) -> Plan:
    """The minimum-``t_iter`` plan; ``meta["t_iter_s"]`` is the DP's value (update time excluded)."""
    t0 = time.perf_counter()
    no_opts("optimal", opts)
    check_nodes(nodes)
    t_end, sizes = optimal_partition(ready_times(trace)[::-1], layer_bytes(trace)[::-1], cost)
    return finish("optimal", sizes, trace, nodes, t0, t_iter_s=t_end)
