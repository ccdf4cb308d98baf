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

Inputs are rank-valued small integers (exact sums in every dtype), rebuilt for every size on the group's
device (:func:`group_device`: CUDA under NCCL, else the CPU; ``device=`` overrides it, e.g. gloo on CUDA
tensors); sizes are bytes, rounded to whole elements (at least one).

A timed call counts until its work is *done*, not until it returns. An asynchronous call returns once its
work is queued: ``dist.all_reduce(..., async_op=True)`` hands back a work handle, and on a GPU every call
(NCCL's collectives, kernels) only enqueues work on a CUDA stream. So the loop waits for what ``call``
returns (:func:`wait`: work handles, futures, lists of them) and then for the device
(:func:`synchronize`) before it reads the clock, and synchronizes before it starts the clock too, so work
queued earlier (an input's copy) is not counted. This is nccl-tests' timing: host clock around the loop,
the stream drained at both ends. :func:`now` is the same reading for timed trials and spans (a clock read
after the device finished what was queued before it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.ops import OPS

__all__ = [
    "BARRIERS",
    "STATS",
    "call_op",
    "group_device",
    "now",
    "rank_input",
    "slowest",
    "synchronize",
    "time_calls",
    "time_collective",
    "wait",
]

BARRIERS = ("each", "once", "none")
STATS = ("median", "mean")


Device = torch.device | str | int | None
"""A device as torch takes it (``"cuda:0"``, ``0``, a ``torch.device``); None: the CPU (nothing queued)."""


def synchronize(device: Device = None) -> None:
    """Wait until every piece of work queued on ``device`` has run: ``torch.cuda.synchronize(device)`` on
    a CUDA device; on the CPU (or None) a call's work is done when it returns, so nothing to wait for."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def wait(handle: Any) -> None:
    """Wait for what an asynchronous call returned: a ``torch.distributed`` work handle (``async_op=True``)
    or a ``torch.futures.Future`` (both have ``wait()``), or a list or tuple of them. Anything else (None,
    a tensor) has nothing to wait for. On CUDA a work's ``wait()`` only orders the current stream after
    it; :func:`synchronize` then waits for the stream."""
    if isinstance(handle, list | tuple):
        for h in handle:
            wait(h)
    elif not isinstance(handle, torch.Tensor) and callable(getattr(handle, "wait", None)):
        handle.wait()


def now(device: Device = None) -> float:
    """``time.perf_counter()`` seconds, read once ``device`` has run everything queued before the call
    (:func:`synchronize`): the clock for timed trials and spans around device work (the DDP and FSDP2
    trials, the runtime's iterations). On the CPU: ``time.perf_counter()``."""
    synchronize(device)
    return time.perf_counter()


def group_device(group: Any = None) -> torch.device:
    """The device ``group``'s collectives take tensors on: the current CUDA device where its backend is
    NCCL (NCCL refuses CPU tensors), else the CPU (gloo; gloo also takes CUDA tensors for all-reduce and
    broadcast, which a caller asks for by passing ``device=``)."""
    if "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def call_op(algo: Any, op: str, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> Any:
    """One ``op`` by ``algo`` (a registered collective) on ``tensor``, in place; returns what ``algo``
    returns (None for a blocking call; a work handle for an asynchronous one: :func:`wait`)."""
    if op == "allreduce":
        return algo.allreduce(tensor, group=group)
    if op == "broadcast":
        return algo.broadcast(tensor, root=root, group=group)
    if op == "reduce":
        return algo.reduce(tensor, root=root, group=group)
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


def rank_input(
    numel: int, rank: int, dtype: torch.dtype = torch.float32, device: Device = None
) -> torch.Tensor:
    """``1..7 + rank`` on ``device`` (None: the CPU): sums over <= 64 ranks stay exact even in bfloat16 while
    ``P (7 + P) <= 256``, and in float16 up to 2048, so results compare with ``atol = 0``."""
    return ((torch.arange(numel, device=device) % 7) + rank % 8 + 1).to(dtype)


def time_calls(
    call: Callable[[], Any], iters: int, *, barrier: str = "each", group: Any = None, device: Device = None
) -> list[float]:
    """This rank's seconds for each of ``iters`` calls of ``call`` (``barrier``: see the module docstring),
    each until its work is done: what ``call`` returns is waited for (:func:`wait`) and ``device`` (where
    the work runs; None: the CPU) synchronized before the clock is read, and before it is started."""
    if barrier not in BARRIERS:
        raise ValueError(f"barrier must be one of {BARRIERS}, got {barrier!r}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if barrier == "once":
        synchronize(device)
        dist.barrier(group=group)
        t0 = time.perf_counter()
        handles = [call() for _ in range(iters)]  # back to back: the next call does not wait for the last
        wait(handles)
        return [(now(device) - t0) / iters] * iters
    times = []
    for _ in range(iters):
        synchronize(device)
        if barrier == "each":
            dist.barrier(group=group)
        t0 = time.perf_counter()
        wait(call())
        times.append(now(device) - t0)
    return times


def slowest(values: Sequence[float], group: Any = None) -> list[float]:
    """Element-wise maximum of ``values`` over the group's ranks (every rank gets the same list)."""
    t = torch.tensor(list(values), dtype=torch.float64, device=group_device(group))  # NCCL: on the GPU
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
    device: Device = None,
) -> list[float]:
    """Seconds of one ``op`` per size in ``sizes`` (bytes), the slowest rank's ``stat`` of ``iters`` calls.

    Collective over ``group`` (None: the default group): every rank calls it with the same arguments.
    ``algo``: an algorithm instance (``dpcomm.collectives.get(name)``), or None for ``torch.distributed``'s
    own collective. ``warmup`` untimed calls per size come first (they also build any groups
    or connections the algorithm needs). ``device``: where the inputs live and the work runs (None: the
    group's, :func:`group_device`).
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if stat not in STATS:
        raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
    impl = _Torch() if algo is None else algo
    rank = dist.get_rank(group)
    dev = group_device(group) if device is None else torch.device(device)
    esize = torch.empty((), dtype=dtype).element_size()
    per_size = []
    for nbytes in sizes:
        x = rank_input(max(1, -(-int(nbytes) // esize)), rank, dtype, dev)

        def one(x: torch.Tensor = x) -> Any:
            return call_op(impl, op, x, root=root, group=group)

        for _ in range(warmup):
            wait(one())
        times = time_calls(one, iters, barrier=barrier, group=group, device=dev)
        per_size.append(statistics.median(times) if stat == "median" else statistics.fmean(times))
    return slowest(per_size, group)
