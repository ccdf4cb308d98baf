"""MG-WFBP, merged-gradient wait-free backpropagation: Algorithm 1 of Shi & Chu (section IV-B).

Names follow the paper (Table I), with layers 0-indexed here (paper layer ``l`` is our ``l-1``):
``tb[l]`` backward time, ``tc[l] = T_ar(p[l])`` communication time, ``R[l] = tau_b[l] + tb[l]`` the time
layer ``l``'s gradient is ready, ``tau_c[l]`` communication start (Eq. 20, procedure CALCULATECOMMSTART)::

    tau_c[L-1] = R[L-1];  tau_c[l] = max(tau_c[l+1] + tc[l+1], R[l])

Walking ``l = L-1 .. 1`` (the paper's ``L .. 2``), layer ``l`` is a *merged-gradient layer* (its gradients
travel with layer ``l-1``'s) when ``tau_b(l-2) - tau_c(l) < a`` in the paper's indices (Eq. 27, line 13),
i.e. here ``R[l-1] - tau_c[l] < a``. A merge sets ``tc[l] = 0``, ``p[l-1] += p[l]``,
``tc[l-1] = T_ar(p[l-1])`` (procedure MERGE, Eq. 14-16) and recomputes ``tau_c``.

Implementation: line 15 recomputes all of ``tau_c`` after each merge (``O(L^2)``), but the later tests
only read ``tau_c[k]`` for ``k < l``, which depend on ``tc``/``R`` at ``k+1 .. L-1`` alone; computing
``tau_c[l-1]`` from ``tau_c[l]`` just before it is tested gives the same numbers in ``O(L)``. The
test suite checks this against a line-by-line transcription of the printed algorithm.

Where the printed text disagrees with itself (we follow Algorithm 1):

1. The proof of Theorem 1 states the test twice as ``tau_b(l-2) - tau_c(l) < b``; Eq. 27, Algorithm 1
   line 13 and case C.2 (from which it is derived) all use the start-up ``a``. We use ``a``.
2. Algorithm 1 line 9 fills ``tau_b[l]`` only for ``l = L-1 .. 2``, yet line 13 reads ``tau_b[1]``
   (``l = 3``) and ``tau_b[0]`` (``l = 2``; there is no layer 0). We extend Eq. 6 down:
   ``tau_b[1] = tau_b[2] + t_b[2]``, ``tau_b[0] = tau_b[1] + t_b[1] = t_f + t_b``; both are the time
   paper layer ``l-1``'s gradient is ready, our ``R[l-1]``.
3. Theorem 1 claims the merged set is optimal, but the proof only shows that each merge, given the
   decisions already taken above it, makes the group holding layer ``l-1`` finish earlier (Eq. 28): a
   greedy step. So MG-WFBP never loses to WFBP, but it is not always optimal: with ``T(M) = 1 + M``
   (seconds, M in bytes), ``t_f = 0`` and three 1-byte layers with backward times ``[1, 0.5, 1]``
   (forward order), it merges layer 2 into 1 (``R[1] - tau_c[2] = 0.5 < a``) and ends at 6.5 s, while
   the groups ``{2}, {1, 0}`` end at 6.0 s (WFBP: 7.0 s; tested in ``tests/test_planners.py``).
   ``dpcomm.planner.optimal`` finds the true minimum.

What ``a`` is: for a :class:`LinearCost` the test uses its ``a`` exactly as printed. For any other
non-decreasing cost (a measured table) ``a`` is not a constant; the test uses the saving of the merge at
hand, ``a_l = T(p[l]) + T(p[l-1]) - T(p[l] + p[l-1])``: the quantity ``a`` stands for in case C.2 (for
``T = a + b*M`` it *is* ``a``), so the test is still exactly "layer ``l-1``'s group finishes earlier if
merged" (Eq. 28). A merge whose saving is negative never helps and is not made. Layers with no
parameters (absent from the paper) save nothing when merged (``T(0) = 0``): ``a_l = 0`` for them. Pass
``a=`` to force one constant for every test, as printed.
"""

from __future__ import annotations

import time

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, finish, layer_bytes, ready_times
from dpcomm.trace.format import Trace

__all__ = ["plan_mgwfbp"]


def plan_mgwfbp(trace: Trace, cost: CommCost, nodes: int, *, a: float | None = None) -> Plan:
    """Algorithm 1 (see module docstring); ``meta["merged_layers"]`` lists the merged-gradient layers."""
    t0 = time.perf_counter()
    check_nodes(nodes)
    L = trace.num_layers
    R = ready_times(trace).tolist()  # R[l] = tau_b[l] + tb[l] (paper indices l+1), seconds
    p = layer_bytes(trace).tolist()  # bytes; p[l-1] grows as layers merge into it (Eq. 16)
    tc = [cost(m) for m in p]  # Eq. 17, seconds
    linear = isinstance(cost, LinearCost)
    merged: list[int] = []
    tau_c = R[L - 1]  # tau_c[l] for the l being tested (Eq. 20, first case)
    for l in range(L - 1, 0, -1):
        if a is not None:
            a_l = a
        elif linear and p[l] > 0 and p[l - 1] > 0:
            a_l = cost.a  # as printed
        else:
            a_l = tc[l] + tc[l - 1] - cost(p[l] + p[l - 1])  # the merge's saving (module docstring)
        if R[l - 1] - tau_c < a_l and (a is not None or a_l >= 0):
            tc[l] = 0.0  # MERGE (Eq. 14-16)
            p[l - 1] += p[l]
            tc[l - 1] = cost(p[l - 1])
            merged.append(l)
        tau_c = max(tau_c + tc[l], R[l - 1])  # tau_c[l-1], as CALCULATECOMMSTART would give it
    sizes, run = [], 1
    merged_set = set(merged)
    for l in range(L - 1, -1, -1):
        if l in merged_set:  # l travels with l-1
            run += 1
        else:
            sizes.append(run)
            run = 1
    a_used = a if a is not None else (cost.a if linear else "saving of each merge")
    return finish("mgwfbp", sizes, trace, nodes, t0, merged_layers=merged, a=a_used)
