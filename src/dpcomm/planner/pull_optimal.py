"""The exact pull plan: the least ``F_N`` of the iBatch model over every split into batches (a DP).

The model and its names (``C_i``, ``Tt_i`` as ``T``, ``Ts``, ``P_k``, ``F_k``, the slowdown ``d`` and
``adv``) are :mod:`dpcomm.planner.pull_model`'s, after the iBatch paper (Wang et al., Eq. 1-4); this exact
minimum is ours (``optimal`` in :func:`dpcomm.planner.pull.plan_pulls`).

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

import numpy as np

from dpcomm.planner.pull_model import TIE_REL, Batches, adv

__all__ = ["optimal_pulls"]


def optimal_pulls(C: np.ndarray, T: np.ndarray, Ts: float, d: float = 0.0) -> tuple[float, Batches]:
    """``(F_N, batches)`` of the least ``F_N`` (module docstring) for checked inputs (as
    :func:`~dpcomm.planner.pull_model.pull_inputs` returns them) and slowdown ``d``; ties: fewest batches."""
    L = C.size
    cC = np.concatenate(([0.0], np.cumsum(C)))
    cT = np.cumsum(T)  # cT[i] = T_0 + .. + T_i
    span = cC[None, 1:] - cC[:-1, None]  # span[s, i] = C_s + .. + C_i where s <= i
    span[np.tril_indices(L, -1)] = np.inf  # no batch s..i with s > i
    r = 1.0 + d

    def dp(upto: int, P_N: float) -> tuple[list[float], list[np.ndarray]]:
        """``G_k[L-1]`` for k = 1..upto and every level's cuts; d > 0: the forward slowed before ``P_N``."""
        G = adv(Ts + cT, cC[1:], P_N, r) if d else Ts + cT + cC[1:]  # G_1[i]
        tops, cuts = [float(G[L - 1])], [np.zeros(L, dtype=np.int64)]
        buf = np.empty((L - 1, L))
        for k in range(2, upto + 1):
            # row s-1 (s = 1..L-1): adv(max(k Ts + T[0..i], G_{k-1}[s-1]), C[s..i])
            np.maximum(G[:-1, None], (k * Ts + cT)[None, :], out=buf)
            if d:
                buf = adv(buf, span[1:, :], P_N, r)  # inf where s > i, as below
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
