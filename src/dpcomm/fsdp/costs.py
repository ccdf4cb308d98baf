"""The two collectives FSDP2 runs, measured on the real group and fitted to ``T(B) = a + b B``.

FSDP2 (torch 2.13, ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``) gathers a unit with
``dist.all_gather_single`` (each rank's ``B/P`` bytes into one flat ``B``-byte buffer) and reduces its
gradients with ``dist.reduce_scatter_single`` (of ``B`` bytes, ``ReduceOp.AVG`` for fp32 and bf16
gradients); torch 2.11 and older name them ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, so both
go through :mod:`dpcomm.compat`. Gloo on CPU implements both, ``AVG`` included (checked on 2 and 3 ranks).
``B`` is the unit's *full* bytes, the argument of the planner's costs (:mod:`dpcomm.planner.fsdp_model`):
sizes here are full bytes.

Sizes go down from the model's parameter bytes, at most :data:`MEASURE_MAX_BYTES` (a model FSDP shards may
be on ``meta`` and fit no device whole: a buffer of its bytes would materialise it, 32 GB a rank for
Llama-3-8B in fp32), by factors of 4 (at most 5), each a multiple of ``P`` elements; each is warmed up once
and timed ``reps`` times (:func:`dpcomm.timing.time_calls`), the slowest rank's median counts
(:func:`dpcomm.timing.slowest`: a collective ends for everyone when its slowest member is done), and the fit
is :func:`dpcomm.planner.autoplan.fit_linear` (``a, b >= 0``).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.distributed as dist

from dpcomm import compat
from dpcomm.costmodel.base import LinearCost
from dpcomm.planner.autoplan import fit_linear
from dpcomm.timing import group_device, slowest, time_calls

__all__ = [
    "MEASURE_MAX_BYTES",
    "Points",
    "fsdp_costs",
    "measure_fsdp_collectives",
    "measure_replica_all_reduce",
]

Points = list[tuple[int, float]]
"""``[(full bytes B, seconds)]``."""

MEASURE_MAX_BYTES = 256 << 20
"""The largest buffer timed (full bytes); the fitted line prices larger units."""


def _sizes(total_bytes: int, world: int, element: int) -> list[int]:
    """Element counts of the full buffer: ``total / 4^k``, rounded down to multiples of ``world``."""
    n = max(world, min(total_bytes, MEASURE_MAX_BYTES) // element)
    return sorted({max(world, (n // 4**k) // world * world) for k in range(5)})


def measure_fsdp_collectives(
    total_bytes: int, group: Any = None, *, reps: int = 3, dtype: torch.dtype = torch.float32
) -> tuple[Points, Points]:
    """``(all-gather points, reduce-scatter points)`` on ``group`` (every rank calls it alike)."""
    world = dist.get_world_size(group)
    dev = group_device(group)  # NCCL refuses CPU tensors
    element = torch.empty((), dtype=dtype).element_size()
    ag: Points = []
    rs: Points = []
    for n in _sizes(total_bytes, world, element):
        full, shard = (
            torch.zeros(n, dtype=dtype, device=dev),
            torch.zeros(n // world, dtype=dtype, device=dev),
        )

        def gather(full=full, shard=shard) -> None:
            compat.all_gather_single(full, shard, group=group)

        def scatter(full=full, shard=shard) -> None:
            compat.reduce_scatter_single(shard, full, op=dist.ReduceOp.AVG, group=group)

        for call, out in ((gather, ag), (scatter, rs)):
            call()  # warm-up
            times = time_calls(call, reps, barrier="each", group=group, device=dev)
            out.append((n * element, statistics.median(times)))
    worst = slowest([t for _, t in ag] + [t for _, t in rs], group)
    k = len(ag)
    return [(b, t) for (b, _), t in zip(ag, worst[:k], strict=True)], [
        (b, t) for (b, _), t in zip(rs, worst[k:], strict=True)
    ]


def fsdp_costs(
    total_bytes: int, group: Any = None, **kw: Any
) -> tuple[LinearCost, LinearCost, Points, Points]:
    """``(T_ag, T_rs, ag points, rs points)``: the fitted costs of a unit's full bytes (one rank: free)."""
    if dist.get_world_size(group) == 1:
        return LinearCost(0.0, 0.0), LinearCost(0.0, 0.0), [], []
    ag, rs = measure_fsdp_collectives(total_bytes, group, **kw)
    return fit_linear(ag), fit_linear(rs), ag, rs


def measure_replica_all_reduce(
    total_bytes: int, shard: int, group: Any = None, *, reps: int = 3, dtype: torch.dtype = torch.float32
) -> Points:
    """HSDP's third collective: after a unit's reduce-scatter over its shard group of ``shard`` ranks,
    FSDP2 all-reduces the group's ``B/shard`` bytes of gradient across the replicas (``group``; torch 2.13
    ``foreach_reduce``, ``ReduceOp.AVG``). Points are ``(full bytes B, seconds)``, the planner's argument."""
    dev = group_device(group)
    element = torch.empty((), dtype=dtype).element_size()
    out: Points = []
    for n in _sizes(total_bytes, shard, element):  # full element counts, multiples of the shard group
        piece = torch.zeros(n // shard, dtype=dtype, device=dev)

        def reduce(piece=piece) -> None:
            dist.all_reduce(piece, group=group)

        reduce()  # warm-up
        out.append((n * element, statistics.median(time_calls(reduce, reps, barrier="each", group=group,
                                                              device=dev))))  # fmt: skip
    worst = slowest([t for _, t in out], group)
    return [(b, t) for (b, _), t in zip(out, worst, strict=True)]
