"""``nccl-nvls`` and ``nccl-nvlstree``: NCCL's all-reduces whose NVSwitches reduce (a flow schedule: the
messages, not an executing collective; CollNet, where the network switches reduce, is :mod:`.collnet`).

Symbols: ``P = M G`` ranks on ``M`` servers of ``G`` GPUs; ``S`` bytes; ``B_in`` a GPU's NVLink rate each
way, ``B_nic`` a NIC's; ``e`` NCCL's NVLS efficiency (:data:`NVLS_EFFICIENCY`: the fraction of NVLink the
multimem loads and stores move). Switch endpoints are :mod:`.gpufabric`'s: ``P + h`` is server ``h``'s
NVSwitch, ``P + M + n`` the network switch of rail ``n``.

* **NVLS** (one server; NVLink SHARP): reduce-scatter by ``multimem.ld_reduce`` (GPU ``k`` loads its shard
  ``S/G`` reduced by the switch from every GPU: each GPU sends ``S/G`` per shard, ``S`` in all, and
  receives its reduced ``S/G``), then all-gather by ``multimem.st`` (GPU ``k`` stores its shard once, the
  switch multicasts it: each GPU sends ``S/G`` and receives ``S``). NCCL runs the two on successive chunks
  at once, so it is one step: every GPU sends ``S (1 + 1/G) / e`` to its NVSwitch and receives as much.
  ``T = S (1 + 1/G) / (e B_in)``; busbw ``2 (G-1)/(G+1) e B_in``.
* **NVLSTree** (several servers): NVLS inside each server as above, and each shard (GPU ``k`` of every
  server, on its own NIC) all-reduced across servers by NCCL's double binary tree (the trees of
  :func:`.nccl_tree.dtree_parents`, half the shard on each; an edge carries its half up and down); all of it
  pipelined, so one step. Per NIC about ``S/G`` each way on 2 servers, up to ``2 S/G`` on more.

NVLS's pipeline inside one server (:func:`nvls_rounds`): NCCL's kernel (``RunWorkColl<ncclFuncAllReduce, T,
RedOp, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>``, its ``oneNode`` branch, ``src/device/all_reduce.h``, commit
5067397c) splits a channel's warps into three groups that pass each chunk on through NCCL's step buffers:
scatter (the input into the NVLS buffers), reduce-and-broadcast (``multimem.ld_reduce`` then ``multimem.st``)
and gather (the result out); so ``D = 3`` stages, and ``n = ceil(S / (O c))`` rounds of ``O = channels x
heads`` chunks (every GPU a head: ``nHeads`` is the NVLS graph's channel count, one per GPU,
``connectNvls`` in ``src/graph/connect.cc``), ``c`` from ``calcCollChunking`` (``src/enqueue.cc``): the
Simple step (512 KiB) capped by ``NCCL_NVLS_CHUNKSIZE`` (128 KiB), then 64 KiB while ``S < 64 O c`` (``32 O
c`` in NCCL 2.17), 32 KiB while ``S < 8 O c``, 16 KiB while ``S < 2 O c``; channels 16 on Hopper, on one
Blackwell server 24 from NCCL 2.27 (``NVLS_NCHANNELS_SM100_NVL``) and 32 before. On 8 H100 at 64 MiB: 16 x
8 x 64 KiB = 8 MiB a round, ``n = 8``: the streaming step x 10/8; from 1 GiB the chunk is 128 KiB (16 MiB a
round), so the fill is two rounds of 16 MiB there.

NVLSTree's pipeline (:func:`nvls_tree_rounds`): NCCL cuts each channel's share into chunks of ``c`` bytes per
head and runs ``O = channels x heads`` of them at once (``concurrentOps`` in ``src/enqueue.cc``), so an
all-reduce is ``n = ceil(S / (O c))`` rounds through a pipeline ``D = 1 + 2 log2 M`` stages deep (the hops
NCCL's latency formula counts: the NVLS step inside the server, then up and down the tree). Like the tree's
(:mod:`.nccl_tree`), the pipeline fills and drains: ``T_flow (n + D - 1) / n``. ``c`` and ``channels`` are
NCCL's (commit 5067397c, ``src/transport/nvls.cc`` ``ncclNvlsTuning`` and ``src/enqueue.cc``): 16 channels on
Hopper (``NVLS_NCHANNELS_SM90``), 32 on Blackwell across servers (``NVLS_NCHANNELS_SM100``; on 2 servers
with NICs of at least 48 GB/s, ``ncclNvlsTreeSm100Tuning``); ``c`` = ``NCCL_NVLS_CHUNKSIZE`` 128 KiB, capped
by ``nvlsTreeMaxChunkSize`` (the chunk itself below 4 servers, 64 KiB from 4; Blackwell on 2 servers with
NICs of 48-96 GB/s beside their GPUs: 64 KiB), then halved by size (to 256, 128, 64, 32 KiB while ``S`` is
under 32, 16, 4, 1 x ``O c``).

Source: NCCL 2.17+ (NVLS, NVLSTree) and 2.12+ (CollNet); the algorithms as NCCL's maintainers describe them
(NVIDIA/nccl-tests issues 153 and 212: "With NVLink SHARP neither the algbw nor busbw correspond to the
bandwidth on the wire"); NVLS efficiency 0.85 on Hopper, 0.74 on Blackwell (NCCL ``src/graph/tuning.cc``,
``nvlsEfficiency``). Simplifications: each is priced as one streaming step (NCCL's per-hop start-up is in
its latency, :mod:`.nccl_tuning`), NVLSTree's with its pipeline fill as above; NVLS efficiency is applied
as extra bytes on the multimem flows; every NIC is taken to sit beside its GPU (PCIe path PIX/PXB, as on
DGX and HGX boards).
"""

from __future__ import annotations

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network._gpuparts import shape
from dpcomm.sim.network.nccl_tree import dtree_parents

__all__ = [
    "NVLS_CHANNELS",
    "NVLS_CHUNK",
    "NVLS_EFFICIENCY",
    "nvls_rounds",
    "nvls_steps",
    "nvls_tree_rounds",
    "nvls_tree_steps",
]

NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""Fraction of NVLink bandwidth NVLS moves (NCCL ``tuning.cc``, ``nvlsEfficiency``)."""
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}
"""NVLS channels across servers (NCCL ``src/transport/nvls.cc``: ``NVLS_NCHANNELS_SM90`` 16,
``NVLS_NCHANNELS_SM100`` 32)."""
NVLS_CHUNK = 128 * 1024
"""NVLS chunk per head, bytes (``NCCL_NVLS_CHUNKSIZE``'s default, ``src/transport/nvls.cc``)."""


NVLS_STAGES_ONE_SERVER = 3
"""Pipeline stages of NVLS inside one server: scatter, reduce-and-broadcast, gather (module docstring)."""


def _version(nccl: str | None) -> tuple[int, ...] | None:
    return tuple(int(x) for x in nccl.split(".")[:3]) if nccl else None


def nvls_rounds(arch: str, gpus: int, nbytes: int, nccl: str | None = None) -> tuple[int, int, int]:
    """``(rounds n, concurrent ops O, chunk c)`` of NCCL's NVLS all-reduce of ``nbytes`` inside one server of
    ``gpus`` ``arch`` GPUs, NCCL version ``nccl`` (None: the newest rules); module docstring."""
    ver = _version(nccl)
    channels = NVLS_CHANNELS["hopper"]
    if arch == "blackwell":
        channels = 32 if ver is not None and ver < (2, 27) else 24
    ops = channels * max(1, gpus)
    c = min(512 * 1024, NVLS_CHUNK)
    first = 32 if ver is not None and ver < (2, 18) else 64
    for times, floor in ((first, 65536), (8, 32768), (2, 16384)):
        if nbytes < times * ops * c and c > floor:
            c = floor
    return max(1, -(-int(nbytes) // (ops * c))), ops, c


def nvls_tree_rounds(
    arch: str, hosts: int, gpus: int, heads: int, nic_GBps: float, nbytes: int
) -> tuple[int, int, int]:
    """``(rounds n, concurrent ops O, chunk c)`` of NCCL's NVLSTree all-reduce of ``nbytes`` on ``hosts``
    servers of ``gpus`` ``arch`` GPUs with ``heads`` NVLS heads (GPUs with a NIC) and NICs of ``nic_GBps``
    GB/s line rate each (module docstring; NCCL ``ncclNvlsTuning`` and ``calcCollChunking``)."""
    channels = NVLS_CHANNELS.get(arch, NVLS_CHANNELS["hopper"])
    chunk = tree_max = NVLS_CHUNK
    if hosts >= 4:
        tree_max = 64 * 1024
    if arch == "blackwell":
        if hosts == 2 and nic_GBps >= 48:  # ncclNvlsTreeSm100Tuning (every NIC beside its GPU)
            tree_max = 128 * 1024
            if gpus <= 4:
                chunk = tree_max = 256 * 1024
            elif gpus >= 16 or (gpus <= 8 and nic_GBps < 96):
                tree_max = 64 * 1024
        elif nic_GBps >= 96 and gpus <= 8:
            channels, chunk, tree_max = 24, 256 * 1024, 256 * 1024
        elif nic_GBps >= 96:
            tree_max = 128 * 1024 if gpus < 32 else 64 * 1024
        elif nic_GBps >= 48:
            channels, tree_max = 24, 64 * 1024
    ops = channels * max(1, heads)
    c = min(chunk, tree_max)
    for times, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if nbytes < times * ops * c and c > floor:
            c = floor
    return max(1, -(-int(nbytes) // (ops * c))), ops, c


def _nvls_flows(
    m: int, g: int, nbytes: int, eff: float, nvs0: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every GPU to its NVSwitch (endpoint ``nvs0 + server``) and back, ``S (1 + 1/G) / e`` bytes each way."""
    gpu = np.arange(m * g, dtype=np.int64)
    nvs = nvs0 + gpu // g
    each = int(np.ceil(nbytes * (1 + 1 / g) / eff))
    size = np.full(2 * len(gpu), each, dtype=np.int64)
    return np.concatenate([gpu, nvs]), np.concatenate([nvs, gpu]), size


def nvls_steps(p: int, g: int, nbytes: int, *, eff: float, nvs0: int) -> list[Step]:
    """NVLS all-reduce of ``nbytes`` on ``p`` ranks of one server of ``g`` GPUs (``p <= g``); ``nvs0``: the
    first NVSwitch endpoint (the fabric's rank count)."""
    g, m = shape(p, g)
    if m != 1:
        raise ValueError(f"NVLS runs inside one server, not on {m} servers")
    if p == 1:
        return []
    src, dst, size = _nvls_flows(1, g, nbytes, eff, nvs0)
    return [Step(label="nvls stream", src=src, dst=dst, nbytes=size)]


def nvls_tree_steps(p: int, g: int, nbytes: int, *, eff: float, nvs0: int) -> list[Step]:
    """NVLSTree all-reduce of ``nbytes`` on ``p`` ranks, servers of ``g`` GPUs (``p`` a multiple of ``g``);
    ``nvs0``: the first NVSwitch endpoint."""
    g, m = shape(p, g)
    if m == 1:
        raise ValueError("NVLSTree runs across servers: use NVLS on one")
    src, dst, size = _nvls_flows(m, g, nbytes, eff, nvs0)
    shard = -(-nbytes // g)
    hosts = np.arange(m, dtype=np.int64)
    s_net, d_net, b_net = [src], [dst], [size]
    for t, parent in enumerate(dtree_parents(m)):
        kid = hosts[parent >= 0]
        half = shard // 2 + (shard % 2 if t == 0 else 0)
        for k in range(g):  # shard k rides GPU k's NIC on every server
            a, b = kid * g + k, parent[kid] * g + k
            s_net += [a, b]
            d_net += [b, a]
            b_net.append(np.full(2 * len(a), half, dtype=np.int64))
    return [
        Step(
            label="nvls-tree stream",
            src=np.concatenate(s_net),
            dst=np.concatenate(d_net),
            nbytes=np.concatenate(b_net),
        )
    ]
