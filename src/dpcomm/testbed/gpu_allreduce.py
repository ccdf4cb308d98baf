"""The multi-GPU all-reduces the emulated cluster runs for ``dpcomm validate``: NCCL's ring over every rank
with ``C`` channels, and the hierarchical all-reduce, on gloo point-to-point sends between the ranks of
servers of ``G`` ranks each (``dpcomm testbed up --gpus-per-server G``).

Symbols: ``P = M G`` ranks on ``M`` servers (rank ``r`` is rank ``r mod G`` of server ``r div G``), ``N``
elements, ``S`` bytes. Each schedule moves exactly the messages of the flow model's schedule of the same
name, step by step, so the measured time and the flow model's price are of the same plan:

- ``nccl-ring:C`` (:mod:`dpcomm.sim.network.nccl_ring`): the data cut into ``C`` channel slices; channel
  ``c`` is a ring all-reduce of its slice over all ``P`` ranks in the order
  :func:`dpcomm.sim.network.nccl_ring.rings` gives (it enters each server at rank ``c G / C`` and leaves
  it once), ``2 (P-1)`` steps of ``S / (C P)`` per channel, every channel's message of a step posted
  together. ``nccl-ring:1`` is the plain ring over ranks in server order (dpcomm's ``ring``).
- ``hierarchical`` (:mod:`dpcomm.sim.network.hierarchical`): 1. ring reduce-scatter of ``G`` shards inside
  each server (``G - 1`` steps of ``S/G``; rank ``v`` ends with the server's sum of shard ``v + 1``);
  2. ring all-reduce of that shard over the same rank of every server (a rail: ``2 (M-1)`` steps of
  ``S/(G M)``); 3. ring all-gather of the shards inside the server (``G - 1`` steps).

Every receive is summed (``reduce-scatter`` steps) or kept in place (``all-gather``), so the result is the
all-reduce's, and :func:`check_sum` checks it exactly on rank-valued inputs. A step waits for its own
sends and receives only (no barrier between steps), and a rank posts the next step's receive before it
waits for this step's: gloo sends a message only once its receive is posted, so without that every step
would begin with the receiver's go-ahead, a small message queued behind a full NIC queue the other way
(NCCL likewise keeps ``NCCL_STEPS`` slots of each channel posted ahead). Measured on ``g2-s3``, one
channel, 4 MB: 678 ms without it (flow model 598 ms, -11.8%), with it: see docs/validate.md.

Sources: the flow schedules' modules above (NCCL's rings; Mikami et al. 2018 and Jia et al. 2018 for the
hierarchical all-reduce; Patarasuk & Yuan 2009 for the ring steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ALGORITHMS", "allreduce", "bounds", "check_sum", "parse", "rank_valued"]

ALGORITHMS = ("nccl-ring", "hierarchical")
"""Names (``nccl-ring:C`` takes a channel count, default 1)."""


def parse(name: str) -> tuple[str, int]:
    """``"nccl-ring:2"`` -> ``("nccl-ring", 2)``; ``"hierarchical"`` -> ``("hierarchical", 1)``."""
    base, _, arg = name.partition(":")
    if base not in ALGORITHMS or (arg and (base != "nccl-ring" or not arg.isdigit() or int(arg) < 1)):
        raise ValueError(f"unknown multi-GPU all-reduce {name!r} (nccl-ring[:C], hierarchical)")
    return base, int(arg or 1)


def bounds(n: int, count: int, start: int = 0) -> list[tuple[int, int]]:
    """``count`` near-equal pieces of ``n`` elements from ``start``, the first ``n mod count`` one longer
    (as the flow model's schedules cut them)."""
    base, extra = divmod(n, count)
    out, a = [], start
    for i in range(count):
        b = a + base + (1 if i < extra else 0)
        out.append((a, b))
        a = b
    return out


def _rings(flat: torch.Tensor, rings: Sequence[tuple[Sequence[int], list[tuple[int, int]]]], *,
           reduce: bool, own: int, tag0: int) -> None:  # fmt: skip
    """Advance ``rings`` (each: the global ranks in ring order, and one chunk per position) together by
    ``len(order) - 1`` steps; this rank's position ``v`` starts by sending chunk ``v + own`` to ``v + 1``.
    ``reduce``: a received chunk is added in (reduce-scatter; ``own = 0`` ends with chunk ``v + 1`` summed),
    else it replaces the local one (all-gather, ``own = 1`` after a reduce-scatter)."""
    me = dist.get_rank()
    mine = [(order, chunks, list(order).index(me)) for order, chunks in rings if me in order]
    if not mine:
        return
    p = len(mine[0][0])

    def post_recvs(s: int) -> list[tuple[Any, torch.Tensor, int, int]]:
        out = []
        for c, (order, chunks, v) in enumerate(mine):
            ra, rb = chunks[(v + own - s - 1) % p]
            buf = torch.empty(rb - ra, dtype=flat.dtype) if reduce else flat[ra:rb]
            out.append((dist.irecv(buf, order[(v - 1) % p], tag=tag0 + s * len(mine) + c), buf, ra, rb))
        return out

    recvs = post_recvs(0)
    for s in range(p - 1):
        sends = []
        for c, (order, chunks, v) in enumerate(mine):
            sa, sb = chunks[(v + own - s) % p]
            sends.append(dist.isend(flat[sa:sb], order[(v + 1) % p], tag=tag0 + s * len(mine) + c))
        # the next step's receive is posted before this step's is waited for (module docstring); in place
        # (all-gather) it is chunk v + own - s - 2, neither sent nor received in this step when p >= 3
        ahead = post_recvs(s + 1) if s + 2 < p else []
        for r, buf, ra, rb in recvs:
            r.wait()
            if reduce:
                flat[ra:rb] += buf
        for w in sends:
            w.wait()
        recvs = ahead


def allreduce(flat: torch.Tensor, name: str, gpus: int) -> None:
    """All-reduce (sum) the 1-D ``flat`` in place over the default group with schedule ``name``
    (:data:`ALGORITHMS`), ``gpus`` ranks per server (module docstring)."""
    algo, channels = parse(name)
    p, n = dist.get_world_size(), flat.numel()
    if p == 1 or n == 0:
        return
    g = min(gpus, p)
    if p % g:
        raise ValueError(f"{p} ranks do not fill servers of {g}")
    m = p // g
    if algo == "nccl-ring":
        from dpcomm.sim.network.nccl_ring import rings as ring_orders  # the flow model's own ring order

        orders = ring_orders(p, g, channels).tolist()
        slices = bounds(n, channels)
        rings = [(orders[c], bounds(b - a, p, a)) for c, (a, b) in enumerate(slices)]
        _rings(flat, rings, reduce=True, own=0, tag0=0)
        _rings(flat, rings, reduce=False, own=1, tag0=1 << 20)
        return
    shards = bounds(n, g)
    local = [(list(range(x * g, (x + 1) * g)), shards) for x in range(m)]
    if g > 1:
        _rings(flat, local, reduce=True, own=0, tag0=0)
    if m > 1:  # the rail of local rank u all-reduces shard u + 1 (what the reduce-scatter left it)
        held = [shards[(u + 1) % g] for u in range(g)]
        rails = [([x * g + u for x in range(m)], bounds(b - a, m, a)) for u, (a, b) in enumerate(held)]
        _rings(flat, rails, reduce=True, own=0, tag0=1 << 20)
        _rings(flat, rails, reduce=False, own=1, tag0=2 << 20)
    if g > 1:
        _rings(flat, local, reduce=False, own=1, tag0=3 << 20)


def rank_valued(n: int, rank: int) -> torch.Tensor:
    """A float32 input whose sum over ranks is exact: element ``i`` of rank ``r`` is ``i mod 7 + r``."""
    return (torch.arange(n, dtype=torch.int64) % 7 + rank).to(torch.float32)


def check_sum(flat: torch.Tensor, p: int) -> bool:
    """Whether ``flat`` is the all-reduce of :func:`rank_valued` over ``p`` ranks, exactly."""
    want = (torch.arange(flat.numel(), dtype=torch.int64) % 7 * p + p * (p - 1) // 2).to(torch.float32)
    return bool(torch.equal(flat, want))
