"""``nccl-collnet`` (= ``nccl-collnet-direct``) and ``nccl-collnet-chain``: NCCL's all-reduces whose network
switches reduce (InfiniBand SHARP; NCCL's CollNet), as flow schedules (the messages, not an executing
collective).

Symbols: ``P = M G`` ranks on ``M`` servers of ``G`` GPUs (``M >= 2``); ``S`` bytes (the wire bytes of the
protocol, Simple: the data); ``R`` NIC links per server (``min(NICs, G)``; NIC ``n`` beside GPU ``n G/R``);
``C`` channels; ``B_in`` a GPU's NVLink rate each way, ``B_nic`` a NIC's. Switch endpoints are
:mod:`.gpufabric`'s: ``sw0 + n`` is the network switch of rail ``n`` (``sw0 = P + M``), reached through NIC
``n`` of the sender's server. Each is one pipelined step, priced by the flow model; NCCL's per-hop start-up
is its latency formula (:func:`.nccl_tuning.latency_us`; in :mod:`.nccl` the step pays ``alpha`` once per
hop of that formula where a start-up per message is given).

* **CollNet Direct** (:func:`collnet_steps`; NCCL ``RunWorkColl<..., NCCL_ALGO_COLLNET_DIRECT, ...>``):
  ``R`` head GPUs per server, one per NIC link. Every GPU sends each head its ``S/R`` share over NVLink
  (scatter), each head sends the server's sum of its share to its rail's switch, which returns the sum over
  servers, and the head sends it to every GPU of its server (gather). Per NIC ``S/R`` each way; on NVLink
  every GPU sends ``S/R`` to each other head and receives as much, and a head also receives and sends
  ``(G-1) S/R`` for its own share.
* **CollNet Chain** (:func:`collnet_chain_steps`; NCCL ``RunWorkColl<..., NCCL_ALGO_COLLNET_CHAIN, ...>``,
  ``src/device/all_reduce.h``): every channel ``c`` carries the share ``S/C`` through a chain of the ``G``
  GPUs of each server (``collnetChain.up``/``down``, ``src/graph/connect.cc``: the chain's first GPU sends
  up to the network, ``up = nRanks``, and every other GPU to the one before it). Half of a channel's
  threads reduce up the chain (``directRecvReduceDirectSend``: each GPU receives its child's partial sum,
  adds its own and sends it on), the head sends the server's sum to the network, whose switch returns the
  sum over servers; the other half broadcast it back down (``directRecvCopyDirectSend``). Here channel
  ``c``'s head is the GPU beside NIC ``c mod R`` and its chain runs on through the server's GPUs in order
  from there (``head, head+1, ..., head-1 mod G``), so heads and tails rotate over the GPUs as NCCL's
  search spreads its channels over the NICs. Cost, in bytes each way (the test checks it on a small case):
  every edge of a chain carries ``S/C`` up and ``S/C`` down; each head ``S/C`` to its rail's switch and
  ``S/C`` back, so a NIC carries ``S/R`` each way (``C/R`` channels each); a GPU sends ``S/C`` per channel
  where it is not the head (up) plus ``S/C`` per channel where it is not the tail (down), ``2 S (G-1)/G``
  each way when ``C = G`` (every GPU heads one channel and ends one). So ``T = max(2 S (G-1) / (G B_in),
  S / (R B_nic))`` where nothing else bounds it, against NCCL's own ``S / (C bwIntra / 2)``
  (``src/graph/tuning.cc``: busBw ``nChannels x bwIntra``, then x0.5 to algorithm bandwidth; its latency
  ``baseLat + 2 (G-1) intraLat + interLat``).

Source: NCCL at commit 5067397c (github.com/NVIDIA/nccl; ``src/device/all_reduce.h`` ``runCollNetChain``
and ``runCollNetDirect``'s kernels, ``src/graph/connect.cc`` ``ncclTopoPreset``, ``src/graph/tuning.cc``,
``src/enqueue.cc``: ``NCCL_ALGO_COLLNET_DIRECT``/``NCCL_ALGO_COLLNET_CHAIN``, both at most 8 GPUs per server,
``NCCL_MAX_DIRECT_ARITY + 1``; NCCL_ALGO names ``CollNetDirect``/``CollNetChain``, ``src/init.cc``).
Simplifications: each is one streaming step (NCCL's pipeline of chunks, ``calcCollChunking``, is not
drawn); every NIC beside its GPU (PCIe path PIX/PXB, as on DGX and HGX boards).
"""

from __future__ import annotations

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network._gpuparts import shape

__all__ = ["collnet_chain_steps", "collnet_steps"]


def _servers(p: int, g: int) -> tuple[int, int]:
    g, m = shape(p, g)
    if m == 1:
        raise ValueError("CollNet runs across servers")
    return g, m


def collnet_steps(p: int, g: int, nbytes: int, *, heads: int, sw0: int) -> list[Step]:
    """CollNet Direct all-reduce of ``nbytes`` on ``p`` ranks, servers of ``g`` GPUs, ``heads`` NIC links per
    server (head ``n`` is the GPU beside NIC ``n``; rail ``n``'s switch is endpoint ``sw0 + n``)."""
    g, m = _servers(p, g)
    heads = max(1, min(heads, g))
    per, share = g // heads, -(-nbytes // heads)
    gpu = np.arange(p, dtype=np.int64)
    host, local = np.divmod(gpu, g)
    src, dst = [], []
    for n in range(heads):
        head = host * g + n * per
        other = local != n * per
        src += [gpu[other], head[other]]  # every GPU's share to the head, and the result back
        dst += [head[other], gpu[other]]
        hs = np.arange(m, dtype=np.int64) * g + n * per
        sw = np.full(m, sw0 + n, dtype=np.int64)
        src += [hs, sw]
        dst += [sw, hs]
    s, d = np.concatenate(src), np.concatenate(dst)
    return [Step(label="collnet stream", src=s, dst=d, nbytes=np.full(len(s), share, dtype=np.int64))]


def collnet_chain_steps(p: int, g: int, nbytes: int, *, heads: int, channels: int, sw0: int) -> list[Step]:
    """CollNet Chain all-reduce of ``nbytes`` on ``p`` ranks, servers of ``g`` GPUs, ``heads`` NIC links per
    server and ``channels`` channels (module docstring): channel ``c``'s chain starts at the GPU beside NIC
    ``c mod heads`` (rail ``n``'s switch is endpoint ``sw0 + n``); every flow is one channel's share,
    ``ceil(nbytes / channels)`` bytes."""
    g, m = _servers(p, g)
    heads, channels = max(1, min(heads, g)), max(1, int(channels))
    per, share = g // heads, -(-nbytes // channels)
    base = np.arange(m, dtype=np.int64) * g  # each server's first GPU
    src, dst = [], []
    for c in range(channels):
        n = c % heads
        order = (n * per + np.arange(g, dtype=np.int64)) % g  # the chain: head first
        for lower, upper in zip(order[1:], order[:-1], strict=True):
            src += [base + lower, base + upper]  # up the chain (partial sums), down it (the result)
            dst += [base + upper, base + lower]
        sw = np.full(m, sw0 + n, dtype=np.int64)
        src += [base + order[0], sw]  # the head to its rail's switch and back
        dst += [sw, base + order[0]]
    s, d = np.concatenate(src), np.concatenate(dst)
    return [Step(label="collnet-chain stream", src=s, dst=d, nbytes=np.full(len(s), share, dtype=np.int64))]
