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

Ties: among partitions of equal ``t_iter`` (within a relative ``1e-12``, the rounding of summing times in
another order) the plan has the *fewest groups*, i.e. the fewest messages and start-ups. The recurrence
above cannot see this (a prefix that ends later with fewer groups is as good whenever ``r_i`` is later
still), so a second dynamic program counts groups: ``E_k[i]``, the earliest end of a partition of ``0..i``
into exactly ``k`` groups, obeys the same recurrence with ``E_{k-1}`` on the right::

    E_1[i] = r_i + T(m_0..m_i),    E_k[i] = min_{1 <= s <= i}  max(r_i, E_{k-1}[s-1]) + T(m_s + ... + m_i)

(same proof, with the count of the prefix fixed), and the plan is the least ``k`` with
``E_k[L-1] <= t_iter``. Example: GoogLeNet's K80 trace at 64 nodes, where the first recurrence alone kept
19 groups and MG-WFBP reaches the same time with 11 (tested in ``tests/test_pull.py``).

Cost: ``L(L+1)/2`` evaluations of ``T``, once, as one ``L x L`` table (``8 L^2`` bytes: 32 MB at 2,000
layers) that both programs read; the first takes one numpy row per ``i`` (``O(L^2)`` work, ``O(L)``
Python steps), the second ``L^2/2`` work per group count tried up to the answer ``k`` (``O(k L^2)``, one
pass over the upper triangle per ``k``): ResNet-50 (161 layers) and 2,000 layers are timed in
``benchmarks/planners.py``.
"""

from __future__ import annotations

import time

import numpy as np

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, cost_many, finish, layer_bytes, no_opts, ready_times
from dpcomm.trace.format import Trace

__all__ = ["TIE_REL", "optimal_partition", "plan_optimal"]

TIE_REL = 1e-12
"""Relative difference in modelled time below which two plans tie (and the one with fewer messages wins)."""


def optimal_partition(ready_backward: np.ndarray, bytes_backward: np.ndarray, cost: CommCost):
    """``(t_end, sizes)``: the least end of the last group, and group sizes in communication order.

    ``ready_backward``/``bytes_backward`` are ``r_i``/``m_i`` in backward order (see module docstring).
    """
    r = np.asarray(ready_backward, dtype=float)
    L = r.size
    T = _group_times(np.asarray(bytes_backward, dtype=float), cost)
    E_before = np.empty(L + 1)  # E_before[s] = E[s-1]; E[-1] = -inf
    E_before[0] = -np.inf
    for i in range(L):
        cand = np.maximum(E_before[: i + 1], r[i]) + T[: i + 1, i]
        E_before[i + 1] = cand.min()
    t_best = float(E_before[L])
    return _fewest_groups(r, T, t_best)


def _group_times(m: np.ndarray, cost: CommCost) -> np.ndarray:
    """``T[s, i]``: seconds of the group ``s..i`` (``s <= i``), ``inf`` below the diagonal (no group);
    the one evaluation of the cost over the upper triangle that both programs read."""
    L = m.size
    P = np.concatenate(([0.0], np.cumsum(m)))  # P[i] = m_0..m_{i-1}
    span = P[None, 1:] - P[:-1, None]  # span[s, i] = m_s + .. + m_i (bytes) where s <= i
    inside = np.triu(np.ones((L, L), dtype=bool))
    return np.where(inside, cost_many(cost, np.where(inside, span, 0.0)), np.inf)


def _fewest_groups(r: np.ndarray, T: np.ndarray, t_best: float) -> tuple[float, list[int]]:
    """The least ``k`` whose ``E_k[L-1]`` reaches ``t_best`` (module docstring), with its group sizes.

    Each ``k`` is one pass over the upper triangle ``s <= i`` in row blocks (a block of rows ``s`` only
    needs columns ``i >= s``); the ``E_k`` rows are kept and the cuts found again along the answer's path.
    """
    L = r.size
    limit = t_best + TIE_REL * max(1.0, abs(t_best))
    rows = [r + T[0]]  # E_1[i]: one group 0..i
    block = 256
    buf = np.empty((min(block, max(L - 1, 1)), L))
    while rows[-1][L - 1] > limit and len(rows) < L:
        E, new = rows[-1], np.full(L, np.inf)
        for a in range(1, L, block):  # rows s = a..b-1, columns i = a..L-1
            b = min(L, a + block)
            view = buf[: b - a, : L - a]
            np.maximum(E[a - 1 : b - 1, None], r[None, a:], out=view)  # start of group s..i
            view += T[a:b, a:]
            np.minimum(new[a:], view.min(axis=0), out=new[a:])
        rows.append(new)
    sizes, i = [], L - 1
    for k in range(len(rows) - 1, 0, -1):  # the last group first: find its start s again
        cand = np.maximum(rows[k - 1][:i], r[i]) + T[1 : i + 1, i]  # s = 1..i
        s = 1 + int(np.argmin(cand))  # earliest s among equals: the largest last group
        sizes.append(i - s + 1)
        i = s - 1
    sizes.append(i + 1)  # the first group 0..i
    sizes.reverse()  # communication order starts with backward index 0
    return float(rows[-1][L - 1]), sizes


def plan_optimal(trace: Trace, cost: CommCost, nodes: int, **opts) -> Plan:
    """The minimum-``t_iter`` plan; ``meta["t_iter_s"]`` is the DP's value (update time excluded)."""
    t0 = time.perf_counter()
    no_opts("optimal", opts)
    check_nodes(nodes)
    t_end, sizes = optimal_partition(ready_times(trace)[::-1], layer_bytes(trace)[::-1], cost)
    return finish("optimal", sizes, trace, nodes, t0, t_iter_s=t_end)
