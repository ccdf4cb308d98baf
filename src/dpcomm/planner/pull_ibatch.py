"""The iBatch paper's two greedy pull planners: Algorithm 1 (forwards) and Algorithm 2 (backwards).

Source: Wang et al., "iBatch: Saving Ethernet Bandwidth ... batching parameter communication and forward
computation" (the iBatch paper), section "Algorithm Design" (Algorithms 1 and 2), under the model of
:mod:`dpcomm.planner.pull_model` (names as there: ``C_i``, ``Tt_i``, ``Ts``, ``l_k``, ``N``; the paper's
layers are 1-based, ours 0-based). :func:`dpcomm.planner.pull.plan_pulls` (``ibatch``) runs both and keeps
the faster candidate under the model.

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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpcomm.planner.pull_model import Batches, pull_inputs

__all__ = ["ibatch_backward", "ibatch_forward"]


def _cuts_to_batches(last: Sequence[int]) -> Batches:
    """Paper's ``l_1 < .. < l_N = L`` (1-based last layers) -> 0-based ``(first, last)`` pairs."""
    out, first = [], 0
    for l in last:
        out.append((first, l - 1))
        first = l
    return out


def ibatch_forward(compute_s, transfer_s, startup_s: float) -> Batches:
    """Algorithm 1: choose ``l_1, l_2, ..`` (1-based last layers) forwards; returns 0-based batches."""
    C, T, Ts = pull_inputs(compute_s, transfer_s, startup_s)
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
    C, T, Ts = pull_inputs(compute_s, transfer_s, startup_s)
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
