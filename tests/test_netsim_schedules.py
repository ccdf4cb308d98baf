"""The schedules the network simulator prices are the messages the real algorithms send.

Each collective module's ``steps()`` is compared with what its allreduce posts on spawned gloo processes:
the point-to-point layer is instrumented (every ``P2P.isend`` records ``(rank, peer, bytes)``) and the
multiset of messages must equal the schedule's, for P = 4, 5, 6 (non-powers of two included), an element
count that is not a multiple of P, and LP cut into several blocks. One launch per P (~5 s each here).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dpcomm.collectives import _p2p, be, get, lp, mst, ps, ring
from dpcomm.collectives.schedule import message_counts
from dpcomm.launch import init_worker, launch

NUMEL = 37  # float32: 148 bytes, not a multiple of any P tried
LP_BLOCK = 40  # bytes: 4 blocks of 10 elements
MODULES = {"ring": ring, "be": be, "mst": mst, "ps": ps}


def _record_sends() -> list[tuple[str, int, int, int]]:
    """Run every algorithm's allreduce once with ``P2P.isend`` wrapped to record each message."""
    torch.set_num_threads(1)
    rank, _ = init_worker(timeout_s=60)
    seen: list[tuple[str, int, int, int]] = []
    current = [""]
    real = _p2p.P2P.isend

    def isend(self, tensor, peer, step):
        seen.append((current[0], self.rank, peer, tensor.numel() * tensor.element_size()))
        return real(self, tensor, peer, step)

    _p2p.P2P.isend = isend
    try:
        for name in (*MODULES, "lp"):
            current[0] = name
            algo = get(name, block_bytes=LP_BLOCK) if name == "lp" else get(name)
            algo.allreduce(torch.arange(NUMEL, dtype=torch.float32) + rank)
    finally:
        _p2p.P2P.isend = real
    dist.destroy_process_group()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("p", [4, 5, 6])
def test_schedules_are_what_the_algorithms_send(p):
    sent: dict[str, Counter] = {}
    for rows in launch(_record_sends, p):
        for name, src, dst, nbytes in rows:
            sent.setdefault(name, Counter())[(src, dst, nbytes)] += 1
    for name, mod in MODULES.items():
        assert sent[name] == message_counts(mod.steps(p, NUMEL, 4)), name
    assert sent["lp"] == message_counts(lp.steps(p, NUMEL, 4, block_bytes=LP_BLOCK))


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_lp_stages_are_the_docstring_s_stage_by_stage(p):
    """``lp.steps`` (two runs of senders per stage, cut by slices) against its docstring written out: in
    stage ``t`` position ``c < p - 1`` sends up-block ``t - c`` to ``c + 1`` and ``c >= 1`` down-block
    ``t - 2p + 2 + c`` to ``c - 1``, for the blocks that exist; same messages, same order."""
    for numel, block in [(1, 4), (NUMEL, LP_BLOCK), (NUMEL, 8), (100, 4), (5, 1000)]:
        size = [4 * (b - a) for a, b in _p2p.block_bounds(numel, 4, block)]
        stages = lp.steps(p, numel, 4, block_bytes=block)
        assert len(stages) == len(size) + 2 * p - 2
        for t, st in enumerate(stages):
            nb, back = len(size), t - 2 * p + 2  # down-block of position c: back + c
            up = [(c, c + 1, size[t - c]) for c in range(p - 1) if 0 <= t - c < nb]
            down = [(c, c - 1, size[back + c]) for c in range(1, p) if 0 <= back + c < nb]
            assert st.transfers() == up + down, (numel, block, t)
            assert st.src.dtype == st.dst.dtype == st.nbytes.dtype == np.int64
