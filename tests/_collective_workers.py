"""Worker functions for tests/test_collectives.py (module level: launched workers import them).

``matrix`` runs every registered algorithm (but ``noop``) x op x element count x dtype back to back on one
process group, checks each result against ``native`` (exact: rank-valued inputs), counts every algorithm's
sends and bytes and compares them with the formula in its module docstring (:func:`expected_traffic`,
written out here independently of the algorithms' code). It returns a compact list of failures.
``matrices`` runs it on a group of every size 1..world in one launch (one set of spawned workers).

``dead_peer`` runs one algorithm's allreduce in freshly forked workers where one worker exits at its first
send (after its receives are posted); every other worker must raise ``CollectiveError`` naming the algorithm
and the step in time.
"""

from __future__ import annotations

import datetime
import functools
import multiprocessing as mp
import os
import queue
import time
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.collectives import OPS, CollectiveError, _p2p, get, names
from dpcomm.errors import UserError
from dpcomm.launch import init_worker

MAIN_DTYPES = (torch.float32, torch.float16, torch.int64)
EXTRA_DTYPES = (torch.bfloat16, torch.float64, torch.int32)
BIG = 1 << 20
SEGMENTED = "ring(segment_bytes=64)"


def counts(p: int) -> list[int]:
    return sorted({0, 1, p - 1, 1001, BIG})


def dtypes_for(n: int, p: int) -> tuple[torch.dtype, ...]:
    if n == BIG:
        return (torch.float32,)  # the large case moves megabytes: one dtype keeps the test fast
    if n in (p - 1, 1001):
        return MAIN_DTYPES + EXTRA_DTYPES
    return MAIN_DTYPES


def pattern(n: int, dtype: torch.dtype) -> torch.Tensor:
    # Values 1..7: sums over <= 8 ranks stay <= 252, exact in every dtype tested (bfloat16: integers <= 256).
    return (torch.arange(n) % 7 + 1).to(dtype)


# ---------------------------------------------------------------------------------------------------------
# The docstrings' send/byte formulas, per rank. Returns (messages, bytes) or None when not stated.


def _sizes(n: int, k: int) -> list[int]:
    q, r = divmod(n, k)
    return [q + (1 if i < r else 0) for i in range(k)]


def _low(v: int, p: int) -> int:
    return 1 << (p - 1).bit_length() if v == 0 else v & -v


def _tree_kids(v: int, p: int) -> list[tuple[int, int]]:
    """(child, span) pairs of relative rank v in the binomial tree on p ranks."""
    out, m = [], 1
    while m < _low(v, p):
        if v + m < p:
            out.append((v + m, m))
        m <<= 1
    return out


def expected_traffic(algo, op: str, n: int, e: int, p: int, rank: int, root: int) -> tuple[int, int] | None:
    name = algo.name
    if name not in ("ring", "lp", "mst", "be", "ps"):
        return None  # native: the backend's choice; bcube, auto: their own tests (tests/test_bcube.py, ...)
    if p == 1 or n == 0:
        return (0, 0)
    S = n * e
    v = rank if op == "allreduce" else (rank - root) % p  # allreduce: relative to rank 0
    if name == "ring":
        c = _sizes(n, p)
        rs = p - 1  # reduce-scatter messages; with segments, chunk j of the step goes as ceil(n_j / g) ones
        if algo.segment_bytes is not None:
            g = max(1, min(max(c), algo.segment_bytes // e))
            rs = sum(max(1, -(-c[(v - s) % p] // g)) for s in range(p - 1))
        if op == "allreduce":
            return rs + p - 1, e * (2 * n - c[(rank + 1) % p] - c[(rank + 2) % p])
        if op == "broadcast":
            if v == 0:
                return 2 * (p - 1), e * (2 * n - c[0] - c[1])
            return (0, 0) if v == p - 1 else (p - 1, e * (n - c[(v + 1) % p]))
        return (rs, e * (n - c[1])) if v == 0 else (rs + 1, S)
    if name == "lp":
        per = max(1, algo.block_size(S, p, op) // e)
        nblocks = -(-n // per)
        if op == "broadcast":
            return (nblocks, S) if v < p - 1 else (0, 0)
        if op == "reduce":
            return (nblocks, S) if v != 0 else (0, 0)  # the chain ends at the root
        return (nblocks, S) if rank in (0, p - 1) else (2 * nblocks, 2 * S)
    if name == "mst":
        if op == "broadcast":
            k = len(_tree_kids(v, p))
            return k, k * S
        if op == "reduce":
            return (1, S) if v else (0, 0)
        k = len(_tree_kids(rank, p)) + (rank != 0)
        return k, k * S
    if name == "be":
        if op == "broadcast":
            c = _sizes(n, p)
            sends = [sum(c[k : min(k + m, p)]) for k, m in _tree_kids(v, p)]
            msgs, nbytes = len(sends), e * sum(sends)
            if v != p - 1:
                msgs, nbytes = msgs + p - 1, nbytes + e * (n - c[(v + 1) % p])
            return msgs, nbytes
        q = 1 << (p.bit_length() - 1)
        r = p - q
        L = q.bit_length() - 1
        if v < 2 * r and v % 2:
            return (1, S)
        u = v // 2 if v < 2 * r else v - r
        c = _sizes(n, q)
        fold = v < 2 * r
        if op == "allreduce":
            gather = sum(sum(c[u & ~(m - 1) : (u & ~(m - 1)) + m]) for m in (1 << j for j in range(L)))
            return 2 * L + fold, e * (n - c[u]) + e * gather + fold * S
        if u == 0:
            return L, e * (n - c[0])
        return L + 1, e * (n - c[u]) + e * sum(c[u : u + (u & -u)])
    if name == "ps":
        c = _sizes(n, p)
        if op == "allreduce":
            return 2 * (p - 1), e * (n - c[rank]) + e * (p - 1) * c[rank]
        if op == "broadcast":
            if rank == root:
                return 2 * (p - 1), e * (n - c[root]) + e * (p - 1) * c[root]
            return p - 2, e * (p - 2) * c[rank]
        return (p - 1, e * (n - c[root])) if rank == root else (p, S)
    raise AssertionError(f"no traffic formula for algorithm {name!r}")


# ---------------------------------------------------------------------------------------------------------


def _algorithms(p: int, group) -> tuple[dict, list[str]]:
    """Every registered algorithm but noop; bcube only where P is n^k (it rejects other P by design)."""
    algos, skipped = {}, []
    for name in sorted(names()):
        if name == "noop":
            continue
        try:
            algos[name] = get(name)
            if name == "bcube" and p > 1:  # the shape is checked against the group on the first call
                algos[name].allreduce(torch.zeros(1), group=group)
        except UserError:
            skipped.append(name)
            algos.pop(name, None)
    algos[SEGMENTED] = get("ring", segment_bytes=64)  # the segmented reduce-scatter too
    return algos, skipped


def _run(algo, op: str, x: torch.Tensor, root: int, group) -> None:
    if op == "allreduce":
        algo.allreduce(x, group=group)
    else:
        getattr(algo, op)(x, root=root, group=group)


def matrices(upto: int) -> dict[int, dict]:
    """:func:`matrix` on a group of every size P = 1..upto (<= world), one after another: the last P ranks
    (group rank = global rank - (world - P), so every peer and root goes through the group-to-global
    translation), the whole world on the default group (``group=None``). Returns {P: result} for the groups
    this rank is in. In a launch: the default group is up (:func:`shared`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # new_group is collective over the default group: every rank creates every group, in the same order.
    # Groups under test keep the 60 s timeout (new_group's default is 30 min); the barrier group waits while
    # a whole matrix runs on the others (up to 7 s per P measured under load), so it gets 600 s.
    groups = {
        p: dist.new_group(list(range(world - p, world)), timeout=datetime.timedelta(seconds=60))
        for p in range(1, min(upto + 1, world))
    }
    between = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=600))
    out = {}
    for p in range(1, upto + 1):
        if rank >= world - p:
            out[p] = matrix(groups.get(p))
        dist.barrier(group=between)  # ranks outside the group wait here, not in the next group's first call
    return out


WORLD = 9
"""Ranks of the :func:`shared` launch (BCube(3,2)); the matrix runs on P = 1..8 (its bfloat16 sums stay
exact up to 8 ranks, :func:`pattern`)."""


def shared(sizes: list[int]) -> dict[str, Any]:
    """One launch of :data:`WORLD` ranks for three test files (each worker's start, torch's import, costs
    more than most checks): :func:`matrices` on P = 1..8 (tests/test_collectives.py), bcube against native
    (``tests/_bcube_workers.against_native``, tests/test_bcube.py), then :func:`timing` of ``sizes`` on a
    group of ranks 0-2 (tests/test_timing.py); this rank's results by name."""
    from tests._bcube_workers import against_native

    torch.set_num_threads(1)
    rank, world = init_worker(timeout_s=120)
    assert world == WORLD
    trio = dist.new_group([0, 1, 2], timeout=datetime.timedelta(seconds=60))
    out: dict[str, Any] = {"matrix": matrices(8), "bcube": against_native()}
    if rank < 3:
        out["timing"] = timing(sizes, trio)
    dist.destroy_process_group()
    return out


TIMING_SIZES = (4, 4096, 1 << 16)
"""Elements per call that :func:`shared` times."""


@functools.cache
def shared_launch() -> list[dict[str, Any]]:
    """:func:`shared`'s launch, once per test session (in the test process); results by rank."""
    from dpcomm.launch import launch

    return launch(shared, WORLD, list(TIMING_SIZES))


def matrix(group=None) -> dict:
    """Every algorithm x op x count x dtype against native on ``group`` (this rank is a member)."""
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    algos, skipped = _algorithms(p, group)
    fails: list[str] = []
    ran = 0
    for n in counts(p):
        for dtype in dtypes_for(n, p):
            f = pattern(n, dtype)
            for i, op in enumerate(OPS):
                root = (n + i) % p
                ref = (rank + 1) * f
                _run(algos["native"], op, ref, root, group)
                exact = (root + 1) * f if op == "broadcast" else p * (p + 1) // 2 * f
                check = op != "reduce" or rank == root
                if check and not torch.equal(ref, exact):
                    fails.append(f"native {op} n={n} {dtype} root={root}: differs from the exact sum")
                for name, algo in algos.items():
                    if name == "native":
                        continue  # the reference itself, checked against the exact sum above
                    if name == SEGMENTED and n == BIG:
                        continue  # 65,536 segments of 64 B: 95% of the matrix's time; n=1001 segments it
                    x = (rank + 1) * f
                    try:
                        with _p2p.count_traffic() as t:
                            _run(algo, op, x, root, group)
                    except Exception as exc:  # keep going: one failure should not hide the others
                        fails.append(f"{name} {op} n={n} {dtype} root={root}: {type(exc).__name__}: {exc}")
                        continue
                    ran += 1
                    where = f"{name} {op} n={n} {dtype} p={p} rank={rank} root={root}"
                    if check and not torch.equal(x, ref):
                        bad = (x != ref).nonzero().flatten()[:3].tolist()
                        fails.append(f"{where}: wrong at {bad}: {x[bad].tolist()} != {ref[bad].tolist()}")
                    want = expected_traffic(algo, op, n, f.element_size(), p, rank, root)
                    if want is not None and (t.sends, t.bytes) != want:
                        fails.append(f"{where}: sent {t.sends} msgs/{t.bytes} B, docstring says {want}")
    return {"rank": rank, "fails": fails, "ran": ran, "algos": sorted(algos), "skipped": skipped}


# ---------------------------------------------------------------------------------------------------------
# Dead peer: forked workers, a TCPStore held by the parent, the victim exits at its first send.


def _dead_peer_worker(
    port: int, rank: int, world: int, algo: str, victim: int, timeout_s: float, absent: bool, q
) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    # Set-up gets a generous timeout (forked workers can be slow to start on a busy machine); the scenario
    # runs on a group whose timeout is the short one under test.
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s))
    x = torch.ones(4096)
    impl = get(algo)
    impl.allreduce(x, group=group)  # one good call first: connections are up and the schedule works
    dist.barrier()
    if rank == victim and absent:  # never arrives: the others must give up after the group's timeout
        time.sleep(3 * timeout_s)
        os._exit(0)
    if rank == victim:
        if algo == "native":
            os._exit(1)  # native has no p2p hook: die before the call

        def die(*args, **kwargs):
            os._exit(1)

        # Dies mid-call at its first send, before that send is posted (p2p ops through torch.distributed's
        # functions), or right after it is posted (ops on a group object directly, counted by _p2p._count):
        # either way most of its vector never leaves, so no peer can finish an allreduce.
        dist.isend = dist.send = die
        _p2p._count = die
    t0 = time.monotonic()
    try:
        impl.allreduce(x, group=group)
        q.put((rank, "returned", "", time.monotonic() - t0))
    except CollectiveError as exc:
        q.put((rank, "CollectiveError", str(exc), time.monotonic() - t0))
    except Exception as exc:
        q.put((rank, type(exc).__name__, str(exc), time.monotonic() - t0))
    q.close()
    q.join_thread()
    os._exit(0)


def dead_peer(
    algo: str, world: int, victim: int, timeout_s: float, deadline_s: float, absent: bool = False
) -> dict[int, tuple]:
    """Run the dead-peer scenario (``absent``: the victim stays alive but never calls); returns
    {rank: (kind, message, seconds)} for the ranks that reported."""
    # forkserver: children fork from a single-threaded server that imported torch once (cheap per child, and
    # unlike a plain fork of the test process no thread's lock is copied mid-use).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "dpcomm.collectives", __name__])
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_dead_peer_worker, args=(store.port, r, world, algo, victim, timeout_s, absent, q))
        for r in range(world)
    ]
    for pr in procs:
        pr.start()
    out: dict[int, tuple] = {}
    end = time.monotonic() + deadline_s
    try:
        while len(out) < world - 1 and time.monotonic() < end:
            try:
                rank, kind, msg, secs = q.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                break
            out[rank] = (kind, msg, secs)
    finally:
        if absent:  # every survivor has reported (or the deadline passed): the victim sleeps 3 x timeout_s
            procs[victim].kill()
        for pr in procs:
            pr.join(timeout=max(0.1, end - time.monotonic()))
            if pr.is_alive():
                pr.kill()  # only processes this function started
                pr.join()
    return out


def timing(sizes: list[int], group: Any = None) -> dict:
    """``dpcomm.timing`` on ``group`` (this rank a member): torch's own and ``ring``, every barrier mode."""
    from dpcomm.timing import time_collective

    out = {}
    for label, algo in (("torch", None), ("ring", get("ring"))):
        for barrier in ("each", "once", "none"):
            for op in OPS:
                out[label, barrier, op] = time_collective(group, op, sizes, 3, algo=algo, barrier=barrier)
    return out
