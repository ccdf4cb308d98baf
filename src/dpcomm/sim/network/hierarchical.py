"""``hierarchical``: all-reduce on servers of several GPUs as intra reduce-scatter, rail all-reduce, intra
all-gather (a flow schedule: the messages, not an executing collective).

Symbols: ``P = M G`` ranks on ``M`` servers of ``G`` GPUs (rank ``r`` is GPU ``v = r mod G`` of server
``h = r div G``), ``S`` bytes of ``N`` elements; shard ``k`` is the ``k``-th of ``G`` near-equal pieces
(``S/G`` bytes), cut again into ``M`` sub-chunks (``S/(G M)``); ``alpha`` s per message; ``B_in`` a GPU's
intra-server rate each way (NVLink), ``B_nic`` a NIC's rate each way, ``N_nic`` NICs per server.

Steps (each a :class:`~dpcomm.collectives.schedule.Step`; all servers, and all rails, in parallel):
    1. intra-server reduce-scatter, steps ``s = 0..G-2``: GPU ``v`` sends shard ``v - s`` (mod G) to GPU
       ``v + 1`` of its server (a ring, as :mod:`dpcomm.collectives.ring`); GPU ``v`` ends with the
       server's sum of shard ``v + 1``;
    2. inter-server all-reduce per rail, steps ``s = 0..2(M-1)-1``: GPU ``v`` of every server runs a ring
       all-reduce of its shard with GPU ``v`` of the other servers (server ``h`` sends to ``h + 1``); with
       one NIC per GPU (rail-optimised) every rail has its own NIC and rail switch;
    3. intra-server all-gather, steps ``s = 0..G-2``: GPU ``v`` sends shard ``v + 1 - s`` to ``v + 1``.

Bytes on the wire per GPU: ``2 (G-1)/G S`` on the intra-server fabric, ``2 (M-1)/(M G) S`` through the
network (the server's NICs carry ``2 (M-1)/M S`` in all, against ``2 (P-1)/P S`` per GPU for a flat ring).
Time (no contention beyond the above; ``G / N_nic`` rails share a NIC):
    ``T = 2 (G-1) (alpha + S / (G B_in)) + 2 (M-1) (alpha + S / (G M) * (G / N_nic) / B_nic)``.
With PCIe (one bus of ``B_bus`` per server) a step 1 or 3 moves ``S/G`` per GPU over the shared bus:
``S / B_bus`` per step, and step 2 crosses the bus twice per server.

Source: H. Mikami et al., "Massively Distributed SGD: ImageNet/ResNet-50 Training in a Flash" (2018,
sec. 3, "2D-Torus all-reduce": reduce-scatter in one dimension, all-reduce in the other, all-gather back),
here with the server as one dimension and the rails as the other; X. Jia et al., "Highly Scalable Deep
Learning Training System with Mixed-Precision" (2018, sec. 3.3, hierarchical all-reduce with reduce and
broadcast inside a group); the ring steps are Patarasuk & Yuan (JPDC 2009). Simplification: each phase
waits for the previous one (no overlap of the intra and inter phases).
"""

from __future__ import annotations

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network._gpuparts import parts, shape

__all__ = ["steps"]


def steps(p: int, g: int, numel: int, elem_size: int = 4) -> list[Step]:
    """The hierarchical all-reduce of ``numel`` elements on ``p`` ranks, ``g`` GPUs per server."""
    g, m = shape(p, g)
    if p == 1:
        return []
    rank = np.arange(p, dtype=np.int64)
    host, local = np.divmod(rank, g)
    shard = parts(numel, g) * elem_size
    nxt = host * g + (local + 1) % g
    out = [
        Step(label=f"intra reduce-scatter {s}", src=rank, dst=nxt, nbytes=shard[(local - s) % g])
        for s in range(g - 1)
    ]
    if m > 1:
        held = (local + 1) % g  # the shard GPU v holds after step 1
        sub = np.stack([parts(n, m) for n in parts(numel, g)]) * elem_size  # (g, m) bytes
        up = ((host + 1) % m) * g + local  # the same GPU of the next server: the rail's ring
        for s in range(2 * (m - 1)):
            j = (host - s) % m if s < m - 1 else (host + 1 - (s - (m - 1))) % m
            phase = "reduce-scatter" if s < m - 1 else "all-gather"
            out.append(Step(label=f"rail {phase} {s % (m - 1)}", src=rank, dst=up, nbytes=sub[held, j]))
    out += [
        Step(label=f"intra all-gather {s}", src=rank, dst=nxt, nbytes=shard[(local + 1 - s) % g])
        for s in range(g - 1)
    ]
    return out
