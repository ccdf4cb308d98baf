"""The schedules the network simulator prices are the messages the real algorithms send.

Each collective module's ``steps()`` is compared with what its allreduce posts on spawned gloo processes:
the point-to-point layer is instrumented (every ``P2P.isend`` records ``(group rank, peer, bytes)``) and the
multiset of messages must equal the schedule's, for P = 4, 5, 6 (non-powers of two included), an element
count that is not a multiple of P, and LP cut into several blocks. Budget: one launch of 6 ranks runs every
P on its own group (11-28 s on the 2-core machine under load average 6-10 from other jobs, where one launch
per P took 60-63 s under the same load, 15 s quiet).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

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
SIZES = (4, 5, 6)  # P: non-powers of two included


def _record_sends() -> dict[int, list[tuple[str, int, int, int]]]:
    """Run every algorithm's allreduce once on a group of each size in ``SIZES`` with ``P2P.isend`` wrapped to
    record each message: {P: [(algorithm, group rank, peer, bytes)]}. A group is the last P ranks (group
    rank = global rank - (world - P)); the whole world is the default group."""
    torch.set_num_threads(1)
    rank, world = init_worker(timeout_s=60)
    # collective over the default group: every rank creates every group, in the same order
    timeout = timedelta(seconds=60)  # new_group's default is 30 min
    groups = {p: dist.new_group(list(range(world - p, world)), timeout=timeout) for p in SIZES if p < world}
    seen: dict[int, list[tuple[str, int, int, int]]] = {}
    current: list = [0, ""]  # size, algorithm
    real = _p2p.P2P.isend

    def isend(self, tensor, peer, step):
        seen[current[0]].append((current[1], self.rank, peer, tensor.numel() * tensor.element_size()))
        return real(self, tensor, peer, step)

    _p2p.P2P.isend = isend
    try:
        for p in SIZES:
            if rank < world - p:
                continue  # not a member (the groups nest: it waits in the next one's first call, ~ms)
            group = groups.get(p)
            seen[p] = []
            for name in (*MODULES, "lp"):
                current[:] = [p, name]
                algo = get(name, block_bytes=LP_BLOCK) if name == "lp" else get(name)
                algo.allreduce(torch.arange(NUMEL, dtype=torch.float32) + dist.get_rank(group), group=group)
    finally:
        _p2p.P2P.isend = real
    dist.destroy_process_group()
    return seen


@pytest.fixture(scope="module")
def sends_by_size() -> dict[int, dict[str, Counter]]:
    """One launch of max(SIZES) ranks: {P: {algorithm: Counter of (src, dst, bytes)}}."""
    sent: dict[int, dict[str, Counter]] = {p: {} for p in SIZES}
    for by_size in launch(_record_sends, max(SIZES)):
        for p, rows in by_size.items():
            for name, src, dst, nbytes in rows:
                sent[p].setdefault(name, Counter())[(src, dst, nbytes)] += 1
    return sent


@pytest.mark.slow
@pytest.mark.parametrize("p", SIZES)
def test_schedules_are_what_the_algorithms_send(sends_by_size, p):
    sent = sends_by_size[p]
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
