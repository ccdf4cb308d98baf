"""``nccl-ring``: NCCL's ring all-reduce across every GPU, ``C`` channels, each ring crossing the network
once per server (a flow schedule: the messages, not an executing collective).

Symbols: ``P = M G`` ranks on ``M`` servers of ``G`` GPUs (rank ``r`` is GPU ``r mod G`` of server
``r div G``); ``C`` channels (default: one per NIC), channel ``c`` carrying ``S/C`` bytes in ``P`` chunks
of ``S/(C P)``; ``alpha`` s per message; ``B_in`` a GPU's NVLink rate each way, ``B_nic`` a NIC's rate,
``N_nic`` NICs per server.

The rings: channel ``c`` enters every server at GPU ``e_c = c G / C`` (the GPU beside NIC ``c`` when
``C = N_nic``), visits the server's GPUs ``e_c, e_c + 1, .., e_c - 1`` (mod ``G``) over NVLink, and leaves
from GPU ``e_c - 1`` to GPU ``e_c`` of the next server: one pair of hops per server crosses the network
per channel, both through NIC ``c`` (NCCL's ring search keeps a channel's send and receive on one NIC;
with rail-optimised servers the PXN route takes the last GPU's data over NVLink to the GPU beside that
NIC). Server ``M - 1`` wraps to server 0.

Steps (all channels together, a step's messages one per channel per GPU):
    1. reduce-scatter, steps ``s = 0..P-2``: ring position ``v`` sends chunk ``v - s`` (mod P) of its
       channel to position ``v + 1``;
    2. all-gather, steps ``s = 0..P-2``: position ``v`` sends chunk ``v + 1 - s``.
Bytes per GPU on the wire: ``2 (P-1)/P S`` (over NVLink or, for the ``C`` exit GPUs, the network); per
NIC, ``2 (P-1)/P S / C`` per channel it serves. Time, with ``C`` a multiple of ``N_nic``:
    ``T = 2 (P-1) (alpha + S / P * max(1 / B_in, 1 / (N_nic B_nic)))``
(per step a GPU's NVLink carries one chunk per channel, ``S/P``; a NIC ``C / N_nic`` chunks,
``S / (P N_nic)``), so busbw ``= 2 (P-1)/P S / T -> min(B_in, N_nic B_nic)``: on the ``dgx-h100`` preset,
whose rates are NCCL's achievable ones, 370 GB/s (NVLink's 370 of 450 GB/s; the 8 NICs give 8 x 48).

Source: NCCL's ring all-reduce (S. Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4",
NVIDIA blog 2019; nccl-tests ``doc/PERFORMANCE.md`` for busbw); rings across servers as NCCL's topology
search builds them (``src/graph/search.cc``: one NIC in and out per channel). Simplifications: the
chunks of a step move as max-min fair flows and the next step starts when the last has arrived (NCCL
pipelines each channel's chunks in ``NCCL_STEPS`` slots, so neighbours run up to a few slots apart); no
LL/LL128 protocols and no per-chunk protocol overhead beyond the topology's efficiency (``intra_eff``,
``nic_eff``: sjeaugey, NVIDIA/nccl-tests#212, NCCL reaches about 370 GB/s of the 450 GB/s NVLink4 line
rate), no NVLink SHARP (NVLS) or CollNet.
"""

from __future__ import annotations

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network._gpuparts import entry_gpu, parts, shape

__all__ = ["rings", "steps"]


def rings(p: int, g: int, channels: int) -> np.ndarray:
    """``(channels, p)``: the rank at each ring position of each channel."""
    g, m = shape(p, g)
    out = np.empty((channels, p), dtype=np.int64)
    for c in range(channels):
        e = entry_gpu(c, channels, g)
        local = (e + np.arange(g)) % g
        out[c] = (np.arange(m)[:, None] * g + local[None, :]).ravel()
    return out


def steps(p: int, g: int, numel: int, elem_size: int = 4, *, channels: int = 1) -> list[Step]:
    """NCCL's ring all-reduce of ``numel`` elements on ``p`` ranks, ``g`` GPUs per server."""
    if channels < 1:
        raise ValueError(f"needs at least 1 channel, got {channels}")
    order = rings(p, g, channels)
    if p == 1:
        return []
    pos = np.arange(p, dtype=np.int64)
    src = order.ravel()
    dst = order[:, (pos + 1) % p].ravel()
    lane = np.repeat(np.arange(channels, dtype=np.int64), p)  # channels post in parallel
    chunk = np.stack([parts(n, p) for n in parts(numel, channels)]) * elem_size  # (channels, p) bytes
    same = bool((chunk == chunk.flat[0]).all())
    flat = np.full(channels * p, chunk.flat[0], dtype=np.int64) if same else None
    out = []
    for s in range(2 * (p - 1)):
        j = (pos - s) % p if s < p - 1 else (pos + 1 - (s - (p - 1))) % p
        nbytes = flat if same else chunk[:, j].ravel()
        phase = "reduce-scatter" if s < p - 1 else "all-gather"
        out.append(Step(label=f"{phase} {s % (p - 1)}", src=src, dst=dst, nbytes=nbytes, lane=lane))
    return out
