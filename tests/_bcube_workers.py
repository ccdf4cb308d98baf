"""Worker for tests/test_bcube.py: bcube against torch.distributed's own collectives on 4, 8 and 9 ranks.

On the 9 ranks of ``tests/_collective_workers.shared``'s launch: BCube(3,2) on the default group (and once
more with its level groups bound to the ``lo`` interface), BCube(2,3) on ranks 0..7 and BCube(2,2) on ranks
0..3 (sub-groups: level groups built directly on the store), and a 6-rank group that must be refused. Inputs
are small integers: exact sums.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dpcomm.collectives._p2p import count_traffic
from dpcomm.collectives.base import get
from dpcomm.collectives.bcube import make_level_groups
from dpcomm.errors import UserError

DTYPES = (torch.float32, torch.float16, torch.int64)


def _input(count: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    # values 1..12 per rank: a 9-rank sum stays <= 108, exact in float16
    return ((torch.arange(count) + 3 * rank) % 5 + rank % 8 + 1).to(dtype)


def _cases(group, algo, me: int, size: int) -> list[str]:
    bad = []
    for dtype in DTYPES:
        for count in (0, 1, size - 1, 1001, 2**20):
            x = _input(count, me, dtype)
            ref = x.clone()
            dist.all_reduce(ref, group=group)
            got = x.clone()
            algo.allreduce(got, group=group)
            if not torch.equal(got, ref):
                bad.append(f"P={size} allreduce {dtype} n={count}")
            for root in (0, size - 1) if count < 2**20 else (size - 1,):
                groot = dist.get_global_rank(group, root) if group is not None else root
                ref = x.clone()
                dist.broadcast(ref, src=groot, group=group)
                got = x.clone()
                algo.broadcast(got, root=root, group=group)
                if not torch.equal(got, ref):
                    bad.append(f"P={size} broadcast root={root} {dtype} n={count}")
                ref = x.clone()
                dist.reduce(ref, dst=groot, group=group)
                got = x.clone()
                algo.reduce(got, root=root, group=group)
                if me == root and not torch.equal(got, ref):
                    bad.append(f"P={size} reduce root={root} {dtype} n={count}")
    return bad


def _traffic(group, algo, size: int) -> tuple[int, int, int]:
    """(messages, bytes) this rank sent in one float32 allreduce of M bytes, M a multiple of k N pieces."""
    x = torch.ones(size * 3 * 37, dtype=torch.float32)  # k N divides 3 * 37 * N for k in (2, 3)
    with count_traffic() as t:
        algo.allreduce(x, group=group)
    return t.sends, t.bytes, x.numel() * x.element_size()


def against_native() -> dict:
    """On the default group of 9 ranks (tests/_collective_workers.shared's launch). ``bad``: every mismatch
    (empty: all equal); ``refused``: the 6-rank group's UserError; ``traffic``: world size -> (messages,
    bytes, M) of one allreduce."""
    t0 = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 9
    marks = {"init": time.perf_counter() - t0}
    algo = get("bcube")
    out = {"bad": _cases(None, algo, rank, world), "refused": None, "traffic": {9: _traffic(None, algo, 9)}}
    out["marks"] = marks
    marks["P=9"] = time.perf_counter() - t0
    # level groups bound to a named interface (loopback here; one NIC per level on the emulated cluster)
    lg = make_level_groups(3, 2, ["lo", "lo"])
    x = _input(1001, rank, torch.float32)
    ref = x.clone()
    dist.all_reduce(ref)
    get("bcube", level_groups=lg).allreduce(x)
    if lg.interfaces != ("lo", "lo") or not torch.equal(x, ref):
        out["bad"].append("interface-bound level groups")
    sub8 = dist.new_group(list(range(8)))
    sub4 = dist.new_group(list(range(4)))
    sub6 = dist.new_group(list(range(6)))
    if rank < 8:
        out["bad"] += _cases(sub8, algo, dist.get_rank(sub8), 8)
        out["traffic"][8] = _traffic(sub8, algo, 8)
    marks["P=8"] = time.perf_counter() - t0
    if rank < 4:
        out["bad"] += _cases(sub4, algo, dist.get_rank(sub4), 4)
        out["traffic"][4] = _traffic(sub4, algo, 4)
    if rank < 6:
        try:
            algo.allreduce(torch.ones(3), group=sub6)
            out["bad"].append("P=6 was not refused")
        except UserError as exc:
            out["refused"] = str(exc)
    dist.barrier()
    marks["end"] = time.perf_counter() - t0
    return out
