"""``reduce_scatter`` and ``allgather`` of ``ring`` and ``native`` (DeAR's schedule: reduce-scatter in the
backward, all-gather in the next forward) against torch.distributed's own, and ring's traffic against its
module docstring.

Group rank ``r`` owns chunk ``chunk_bounds(N, P)[r]``. The reduce-scatter's own chunk is compared with the
same chunk of ``dist.all_reduce`` of the same inputs (bitwise for integer-valued inputs, whose sums are
exact in every dtype here; within a stated tolerance for random ones), the allgather bitwise with
``dist.all_gather`` of every rank's own chunk. Checked for ``Ring()``, ``Ring(segment_bytes=64)`` (chunks
cut into several segments), ``Native()`` on gloo (which runs ring's schedule) and native's NCCL path
(``reduce_scatter_tensor`` / ``all_gather_into_tensor`` on padded equal chunks), whose functions run on
gloo too.

One launch of 4 ranks runs everything on a group of each size P = 1..4 in turn: P = 4 on the default group
(``group=None``), smaller P on the last P ranks (group rank != global rank, so every peer goes through the
group-to-global translation). Budget (2-core VM, load average 0.1): the launch 7.9 s (mostly the workers'
start and torch's import), the whole file 10.4 s with pytest's own start.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpcomm.collectives import get
from dpcomm.collectives._p2p import chunk_bounds, count_traffic
from dpcomm.collectives.native import Native, _allgather_equal, _padded, _reduce_scatter_equal, _unpad
from dpcomm.collectives.ring import Ring

WORLD = 4
SEGMENT = 64  # bytes: a 1001-element float32 chunk of P = 4 (1,000 B) goes as 16 segments
BIG = 1 << 16


def counts(p: int) -> list[int]:
    """0, 1, N < P (empty chunks), P | N, N mod P != 0, and a large N."""
    return sorted({0, 1, max(p - 1, 1), p + 1, 12 * p, 1001, BIG})


def _sizes(n: int, p: int) -> list[int]:
    return [b - a for a, b in chunk_bounds(n, p)]


def expected_traffic(op: str, n: int, e: int, p: int, r: int, segment_bytes: int | None) -> tuple[int, int]:
    """Ring's (messages, bytes) per rank, from its module docstring, written out independently of its code:
    reduce_scatter ``P - 1`` messages (segmented: ``sum_s max(1, ceil(n_{r-1-s} / g))``), ``e (N - n_r)``
    bytes; allgather ``P - 1`` messages, ``e (N - n_{r+1})`` bytes; ``(P-1)/P S`` each when ``P | N``."""
    if p == 1 or n == 0:
        return (0, 0)
    c = _sizes(n, p)
    if op == "allgather":
        return p - 1, e * (n - c[(r + 1) % p])
    msgs = p - 1
    if segment_bytes is not None:
        g = max(1, min(max(c), segment_bytes // e))
        msgs = sum(max(1, -(-c[(r - 1 - s) % p] // g)) for s in range(p - 1))
    return msgs, e * (n - c[r])


# ---------------------------------------------------------------------------------------------------------
# Worker side (module level: the launched workers import this module).


class _NcclPath:
    """Native's NCCL functions, called directly (they only use torch.distributed, so gloo runs them)."""

    name = "native-nccl-path"

    def reduce_scatter(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        _reduce_scatter_equal(tensor.view(-1), group)

    def allgather(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        _allgather_equal(tensor.view(-1), group)


def _algorithms() -> dict[str, Any]:
    return {
        "ring": get("ring"),
        f"ring(segment_bytes={SEGMENT})": get("ring", segment_bytes=SEGMENT),
        "native": get("native"),
        "native-nccl-path": _NcclPath(),
    }


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(-1).view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _inputs(kind: str, n: int, dtype: torch.dtype, rank: int, gen: torch.Generator) -> torch.Tensor:
    """This rank's input. ``int``: values 1..7 times (rank + 1), sums <= 70 on 4 ranks (exact in bfloat16,
    whose integers are exact up to 256); ``rand``: uniform [0.5, 1) drawn from a generator seeded by the
    rank, all positive so no sum cancels (the relative error of each summation order stays <= (P-1) eps)."""
    if kind == "int":
        return ((torch.arange(n) % 7 + 1) * (rank + 1)).to(dtype)
    return (torch.rand(n, generator=gen, dtype=torch.float64) * 0.5 + 0.5).to(dtype)


def _tolerance(kind: str, dtype: torch.dtype, p: int) -> float | None:
    """rtol between two summation orders of P positive values: each within (P-1) u of the exact sum (unit
    roundoff u = eps / 2, rounded at each add), so within (P-1) eps of each other (float32: 3.6e-7 at P = 4,
    under the 1e-6 asked for); None: bitwise."""
    if kind == "int":
        return None
    if dtype == torch.float32:
        return 1e-6
    return max(p - 1, 1) * torch.finfo(dtype).eps  # float64 2.2e-16, bfloat16 2^-7 per added rank


CASES: list[tuple[str, torch.dtype]] = [
    ("int", torch.float32),
    ("rand", torch.float32),
    ("int", torch.float64),
    ("rand", torch.float64),
    ("int", torch.bfloat16),
    ("rand", torch.bfloat16),
    ("int", torch.int64),
]


def _dtypes_for(n: int) -> list[tuple[str, torch.dtype]]:
    return [("int", torch.float32), ("rand", torch.float32)] if n == BIG else CASES


def check_group(group: Any) -> dict[str, Any]:
    """Every algorithm x count x dtype on ``group`` (this rank a member): a list of failures and the number
    of checks that ran."""
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    gen = torch.Generator().manual_seed(1234 + 97 * rank + 1000 * p)
    algos = _algorithms()
    fails: list[str] = []
    ran = 0
    for n in counts(p):
        bounds = chunk_bounds(n, p)
        a, b = bounds[rank]
        c = -(-n // p)
        for kind, dtype in _dtypes_for(n):
            x0 = _inputs(kind, n, dtype, rank, gen)
            ref = x0.clone()
            dist.all_reduce(ref, group=group)  # torch's result
            rtol = _tolerance(kind, dtype, p)
            # allgather reference: every rank's own chunk, padded to ceil(N / P) (gloo's all_gather wants
            # equal sizes), gathered by torch, each cut back to its chunk's length
            mine = torch.zeros(c, dtype=dtype)
            mine[: b - a] = x0[a:b]
            gathered = [torch.empty(c, dtype=dtype) for _ in range(p)]
            if c:
                dist.all_gather(gathered, mine, group=group)
            want = torch.cat([gathered[j][: hi - lo] for j, (lo, hi) in enumerate(bounds)]) if n else x0
            e = x0.element_size()
            for name, algo in algos.items():
                if name.startswith("ring(") and n == BIG:
                    continue  # 4,096 segments per chunk: slow, and n = 1001 already cuts chunks
                where = f"{name} n={n} {kind} {dtype} P={p} rank={rank}"
                segment = getattr(algo, "segment_bytes", None)
                ring_traffic = name.startswith("ring") or name == "native"  # native on gloo: ring's
                # reduce_scatter: a 2-D view of the same values where it divides (the flat view is used)
                x = x0.clone().view(-1, 2) if n % 2 == 0 and n else x0.clone()
                try:
                    with count_traffic() as t:
                        algo.reduce_scatter(x, group=group)
                except Exception as exc:  # keep going: one failure should not hide the others
                    fails.append(f"{where} reduce_scatter: {type(exc).__name__}: {exc}")
                    continue
                got = x.view(-1)[a:b]
                if rtol is None:
                    ok = _same_bits(got, ref[a:b])
                else:
                    ok = torch.allclose(got.double(), ref[a:b].double(), rtol=rtol, atol=0)
                if not ok:
                    diff = (got.double() - ref[a:b].double()).abs().max().item() if b > a else 0.0
                    fails.append(f"{where} reduce_scatter: own chunk [{a}:{b}] differs (max abs {diff:g})")
                if ring_traffic and (t.sends, t.bytes) != expected_traffic("rs", n, e, p, rank, segment):
                    fails.append(
                        f"{where} reduce_scatter: sent {t.sends} msgs/{t.bytes} B, docstring says "
                        f"{expected_traffic('rs', n, e, p, rank, segment)}"
                    )
                # allgather: only the own chunk is set; NaN (or -1) elsewhere must all be overwritten
                y = torch.full((n,), -1 if dtype == torch.int64 else float("nan"), dtype=dtype)
                y[a:b] = x0[a:b]
                try:
                    with count_traffic() as t:
                        algo.allgather(y, group=group)
                except Exception as exc:
                    fails.append(f"{where} allgather: {type(exc).__name__}: {exc}")
                    continue
                if not _same_bits(y, want):
                    bad = (y != want).nonzero().flatten()[:3].tolist()
                    fails.append(f"{where} allgather: wrong at {bad}")
                if ring_traffic and (t.sends, t.bytes) != expected_traffic("allgather", n, e, p, rank, None):
                    fails.append(
                        f"{where} allgather: sent {t.sends} msgs/{t.bytes} B, docstring says "
                        f"{expected_traffic('allgather', n, e, p, rank, None)}"
                    )
                ran += 1
    # DeAR's round trip: reduce-scatter then allgather is an allreduce (bitwise on integer values)
    n = 1001
    f = _inputs("int", n, torch.float32, rank, gen)
    ref = f.clone()
    dist.all_reduce(ref, group=group)
    for name, algo in algos.items():
        x = f.clone()
        algo.reduce_scatter(x, group=group)
        algo.allgather(x, group=group)
        if not _same_bits(x, ref):
            fails.append(f"{name} reduce_scatter + allgather P={p} rank={rank}: not the allreduce")
    return {"rank": rank, "fails": fails, "ran": ran}


def worker() -> dict[int, dict[str, Any]]:
    """:func:`check_group` on a group of every size 1..WORLD: {P: result} for the groups this rank is in."""
    from dpcomm.launch import init_worker

    torch.set_num_threads(1)
    rank, world = init_worker(timeout_s=60)
    assert world == WORLD
    timeout = datetime.timedelta(seconds=60)
    # new_group is collective over the default group: every rank creates every group, in the same order
    groups = {p: dist.new_group(list(range(world - p, world)), timeout=timeout) for p in range(1, world)}
    groups[world] = None  # the default group
    out = {}
    for p in range(1, world + 1):
        if rank >= world - p:
            out[p] = check_group(groups[p])
        dist.barrier()  # ranks outside the group wait here, not in the next group's first call
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------------------------------------
# Test side.


@functools.cache
def _launch() -> list[dict[int, dict[str, Any]]]:
    from dpcomm.launch import launch

    return launch(worker, WORLD)


@pytest.fixture(scope="module")
def by_size() -> dict[int, list[dict[str, Any]]]:
    """One launch of 4 ranks for every P = 1..4: {P: one result per member}."""
    by_rank = _launch()
    return {p: [r[p] for r in by_rank if p in r] for p in range(1, WORLD + 1)}


@pytest.mark.slow
@pytest.mark.parametrize("p", range(1, WORLD + 1))
def test_reduce_scatter_and_allgather_match_torch(by_size, p):
    results = by_size[p]
    assert sorted(r["rank"] for r in results) == list(range(p)), results  # every member reported
    fails = sorted({f for r in results for f in r["fails"]})
    assert not fails, f"{len(fails)} failures on P={p}, first ones:\n" + "\n".join(fails[:15])
    per_rank = sum(len(_dtypes_for(n)) * (4 - (n == BIG)) for n in counts(p))  # segmented ring skips BIG
    assert all(r["ran"] == per_rank for r in results), (per_rank, [r["ran"] for r in results])


# Fast tier: no processes.


def test_both_algorithms_have_the_methods():
    for algo in (Ring(), Ring(segment_bytes=SEGMENT), Native(), get("ring"), get("native")):
        assert callable(getattr(algo, "reduce_scatter", None)) and callable(getattr(algo, "allgather", None))


def test_one_rank_and_empty_tensors_are_untouched(one_rank):
    for algo in (Ring(), Ring(segment_bytes=8), Native()):
        for n in (0, 1, 5):
            x = torch.arange(n, dtype=torch.float32)
            with count_traffic() as t:
                algo.reduce_scatter(x)
                algo.allgather(x)
            assert torch.equal(x, torch.arange(n, dtype=torch.float32)) and (t.sends, t.bytes) == (0, 0)


def test_padded_layout_is_chunk_bounds_at_equal_strides():
    flat = torch.arange(1, 8, dtype=torch.float32)  # 7 over 3: chunks [1,2,3] [4,5] [6,7]
    assert _padded(flat, 3).tolist() == [1, 2, 3, 4, 5, 0, 6, 7, 0]
    assert _padded(torch.arange(1, 3.0), 4).tolist() == [1, 2, 0, 0]  # N < P: two empty chunks
    for n in (1, 2, 3, 7, 8, 1001):
        for p in (1, 2, 3, 4, 7):
            x = torch.randn(n)
            padded = _padded(x, p)
            c = -(-n // p)
            assert padded.numel() == p * c
            for j, (lo, hi) in enumerate(chunk_bounds(n, p)):
                assert torch.equal(padded[j * c : j * c + hi - lo], x[lo:hi])
                assert not padded[j * c + hi - lo : (j + 1) * c].any()
            y = torch.empty(n)
            _unpad(padded, y, p)
            assert torch.equal(y, x)


def test_expected_traffic_is_the_docstrings_fraction_when_p_divides_n():
    for p in (2, 3, 4, 8):
        n, e = 12 * p * 5, 4
        for r in range(p):
            for op in ("rs", "allgather"):
                assert expected_traffic(op, n, e, p, r, None) == (p - 1, (p - 1) * n * e // p)
    # segmented: 1001 float32 over 4 ranks is 251, 250, 250, 250 elements; 64 B holds 16 -> 16 messages each,
    # every chunk but the own one
    assert expected_traffic("rs", 1001, 4, 4, 0, 64) == (48, 4 * 750)
    assert expected_traffic("rs", 1001, 4, 4, 1, 64) == (48, 4 * 751)  # owns a 250-element chunk
