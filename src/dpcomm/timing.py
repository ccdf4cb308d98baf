"""The one timed-collective loop of dpcomm: ``dpcomm bench``, ``dpcomm calibrate``, the runtime's cost
measurement and the testbed's benchmarks all time collectives through it.

``time_collective(group, op, sizes, iters)`` returns, per message size, the seconds of one ``op`` as the
*slowest* rank saw it (a collective ends for everyone only when its slowest member is done): per rank the
median (or mean) of ``iters`` timed calls after ``warmup`` untimed ones, then the maximum over the group.
:func:`time_calls` is the loop itself, for drivers that keep per-rank times (``dpcomm bench``).

Synchronisation (``barrier``), the one choice that changes what a number means:

- ``each`` (default): a barrier before every call, each call timed alone, so a call's time is its own and
  not a peer's lateness (``dpcomm calibrate``, the testbed);
- ``once``: one barrier, then the ``iters`` calls back to back, timed as a loop, every entry the loop's mean
  (nccl-tests' timing: one barrier's skew is spread over the loop; ``dpcomm bench``);
- ``none``: no barrier (calls inside a running job, where a barrier would cost more than the call).

Inputs are rank-valued small integers (exact sums in every dtype), rebuilt for every size; sizes are bytes,
rounded to whole elements (at least one).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.ops import OPS

__all__ = ["BARRIERS", "STATS", "call_op", "rank_input", "slowest", "time_calls", "time_collective"]

BARRIERS = ("each", "once", "none")
STATS = ("median", "mean")


def call_op(algo: Any, op: str, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
    """One ``op`` by ``algo`` (a registered collective) on ``tensor``, in place."""
    if op == "allreduce":
        algo.allreduce(tensor, group=group)
    elif op == "broadcast":
        algo.broadcast(tensor, root=root, group=group)
    elif op == "reduce":
        algo.reduce(tensor, root=root, group=group)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")


class _Torch:
    """``torch.distributed``'s own collectives behind the algorithms' signature."""

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        dist.all_reduce(tensor, group=group)

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        dist.broadcast(
            tensor, src=dist.get_global_rank(group, root) if group is not None else root, group=group
        )

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        dist.reduce(tensor, dst=dist.get_global_rank(group, root) if group is not None else root, group=group)


def rank_input(numel: int, rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``1..7 + rank``: sums over <= 64 ranks stay exact even in bfloat16 while ``P (7 + P) <= 256``, and in
    float16 up to 2048, so results compare with ``atol = 0``."""
    return ((torch.arange(numel) % 7) + rank % 8 + 1).to(dtype)


def time_calls(
    call: Callable[[], None], iters: int, *, barrier: str = "each", group: Any = None
) -> list[float]:
    """This rank's seconds for each of ``iters`` calls of ``call`` (``barrier``: see the module docstring)."""
    if barrier not in BARRIERS:
        raise ValueError(f"barrier must be one of {BARRIERS}, got {barrier!r}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if barrier == "once":
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        return [(time.perf_counter() - t0) / iters] * iters
    times = []
    for _ in range(iters):
        if barrier == "each":
            dist.barrier(group=group)
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def slowest(values: Sequence[float], group: Any = None) -> list[float]:
    """Element-wise maximum of ``values`` over the group's ranks (every rank gets the same list)."""
    t = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def time_collective(
    group: Any,
    op: str,
    sizes: Sequence[int],
    iters: int,
    *,
    algo: Any = None,
    warmup: int = 1,
    dtype: torch.dtype = torch.float32,
    barrier: str = "each",
    stat: str = "median",
    root: int = 0,
) -> list[float]:
    """Seconds of one ``op`` per size in ``sizes`` (bytes), the slowest rank's ``stat`` of ``iters`` calls.

    Collective over ``group`` (None: the default group): every rank calls it with the same arguments.
    ``algo``: an algorithm instance (``dpcomm.collectives.get(name)``), or None for ``torch.distributed``'s
    own collective. ``warmup`` untimed calls per size come first (they also build any groups
    or connections the algorithm needs).
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if stat not in STATS:
        raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
    impl = _Torch() if algo is None else algo
    rank = dist.get_rank(group)
    esize = torch.empty((), dtype=dtype).element_size()
    per_size = []
    for nbytes in sizes:
        x = rank_input(max(1, -(-int(nbytes) // esize)), rank, dtype)

        def one(x: torch.Tensor = x) -> None:
            call_op(impl, op, x, root=root, group=group)

        for _ in range(warmup):
            one()
        times = time_calls(one, iters, barrier=barrier, group=group)
        per_size.append(statistics.median(times) if stat == "median" else statistics.fmean(times))
    return slowest(per_size, group)
