"""NCCL's choice of all-reduce algorithm and protocol, and its start-up for each, on a multi-GPU cluster.

Our reading of NCCL's tuning model (github.com/NVIDIA/nccl, ``src/graph/tuning.cc``, ``ncclTopoTuneModel``
and ``ncclTopoGetAlgoTime``; ``src/graph/search.cc`` for the channels; commit 5067397c): NCCL prices every
(algorithm, protocol) pair of an all-reduce of ``S`` bytes as ``time = latency + S / bandwidth`` and runs
the cheapest; ``NCCL_ALGO`` and ``NCCL_PROTO`` only narrow the candidates. The tables
(:mod:`.nccl_tables`) are NCCL's published constants (microseconds, GB/s); the code that combines them is
ours.

Symbols: ``P`` ranks on ``M`` servers of ``G = P / M`` GPUs; ``C`` channels of an algorithm, each moving
``b`` GB/s (``b_intra`` inside a server, ``b_inter`` across servers: NCCL's ``graph->bwIntra/bwInter``).

* **Latency** (per call): ``base[a][p]`` plus, per algorithm, hops times each hop's latency ``hw[link][a][p]``
  (link: NVLink, PCI, or NET across servers, the last plus the transport's own latency, twice for Simple):
  ring ``(2(P-1) - 2(M-1)) lat_intra + 2(M-1) lat_inter`` (``lat_intra`` at least the network post overhead
  on more than one server, 1 us on Intel CPUs, x3 for Simple), and x1.4 (x1.9 before Ampere) for Simple
  when every channel's share of each rank is at least 64 bytes (the ring's plateau); tree ``2 ((G-1)
  lat_intra + log2(M) lat_inter)``; NVLS ``lat_intra (+ lat_inter)``; NVLSTree ``lat_intra + 2 log2(M)
  lat_inter``; CollNet Direct ``2 (min(1, G-1) lat_intra + 0.4 (G-1)) + lat_inter``; Chain ``2 (G-1)
  lat_intra + lat_inter``. With one GPU per server the tree's network hop is used for every algorithm.
* **Bandwidth** (per call, GB/s of bus bandwidth, then turned into algorithm bandwidth): ``C b`` (``b_intra``
  on up to 2 servers and for CollNet, else ``b_inter``), then: ring LL ``min(llMax, x0.5)``, ring LL128
  ``min(x0.92, C perChRingLL128)``, tree ``min(x0.92, C perChTree)``, tree LL ``min(x1/3.8, llMax)``, tree
  LL128 ``min(x 7/9 or 120/128, C perChTreeLL128)``, tree on a plain tree pattern x0.85; NVLS/NVLSTree use
  ``min(b_intra nvlsEff (C-1)/C x2, b_inter (x2 for NVLSTree on 2 servers), perChNVLSTree)`` per channel;
  CollNet Direct divides by the GPU-per-NIC factor and x0.85 from Hopper. Ring, NVLS and NVLSTree turn
  bus into algorithm bandwidth with ``P / (2 (P-1))``, the others with 1/2.
* **Time**: ``latency + S / (1000 x algbw)`` us, the tree's (and NVLSTree's on Blackwell) bandwidth times a
  correction factor by size (``treeCorrectionFactor``, 64 B to 256 MB).

Channels and per-channel speed, our simplification of NCCL's topology search (``ncclTopoCompute``), from
the cluster's achievable rates (:class:`~dpcomm.topology.MultiGPU`): across servers a ring or tree channel
per NIC (NICs joined per GPU count once per GPU) at the fastest of NCCL's inter-node speeds (``speedArray
Inter``) not above a NIC's achievable rate; on one server as many channels as the GPU's NVLink carries at
the fastest intra-node speed (``speedArrayIntra``) that gives at least two; channels doubled (and their
speed halved) when the speed is at least 25 GB/s, except from Hopper at under 50 GB/s with more than 4
channels (``ncclTopoDupChannels``); a tree's intra-server speed then rises through the same speeds while
it is under twice the inter-server one and NVLink carries it (the search's second pass). NVLS: one
channel per GPU up to 16 (``NCCL_MAX_NVLS_ARITY``), at the fastest speed whose total fits NVLink x
G/(G-1). What this leaves out: NCCL's search also weighs PCIe paths,
crossing NICs and CPU sockets; AMD CPUs (Intel's figures are used); a tuner plugin's own model. NCCL's
constants are in :mod:`.nccl_tables`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcomm.sim.network import nccl_tables as T
from dpcomm.topology.multigpu import ARCHS, MultiGPU

__all__ = [
    "ALGORITHMS",
    "PROTOCOLS",
    "Choice",
    "Graph",
    "algorithms_for",
    "bus_bandwidth",
    "cap_bandwidth",
    "choose",
    "graph",
    "hop_latency_us",
    "latency_us",
    "predict_us",
]

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree")
"""NCCL's all-reduce algorithms (``NCCL_ALGO`` names, lower case); PAT runs only all-gather and
reduce-scatter, so it is not among them."""
PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True, slots=True)
class Graph:
    """One algorithm's channels as NCCL's search would lay them: ``channels`` x ``bw_intra`` / ``bw_inter``
    GB/s each; ``pattern_tree``: a plain tree (not NCCL's balanced one), whose bandwidth NCCL cuts by 15%."""

    channels: int
    bw_intra: float
    bw_inter: float
    pattern_tree: bool = False


@dataclass(frozen=True, slots=True)
class Choice:
    """What NCCL runs for one all-reduce: algorithm, protocol, channels, and its own predicted time."""

    algorithm: str
    protocol: str
    channels: int
    time_us: float


def _speeds(table: dict, arch: str) -> tuple[float, ...]:
    return table["blackwell" if arch == "blackwell" else "hopper" if arch == "hopper" else "volta"]


def _nic_GBps(t: MultiGPU, nic_bps: float) -> float:
    """One GPU's achievable network rate in GB/s: its NIC's (or its joined NICs') line rate x fraction."""
    rate = t.nic_bps if t.nic_bps is not None else nic_bps
    return rate / 8e9 * t.nic_fraction * max(1, t.nic_count // t.gpus)


def _intra_GBps(t: MultiGPU) -> float:
    """A GPU's achievable intra-server rate in GB/s (NVLink each way; a PCIe server's shared bus)."""
    return t.intra_bps / 8e9 * t.intra_eff


def graph(t: MultiGPU, algorithm: str, nic_bps: float) -> Graph | None:
    """Channels of ``algorithm`` on ``t`` (None where NCCL would not have it); see the module docstring."""
    m, g, arch = t.hosts, t.gpus, t.arch
    intra = _intra_GBps(t)
    if algorithm in ("nvls", "nvls_tree"):
        if not t.nvls or g < 2 or (algorithm == "nvls" and m > 1) or (algorithm == "nvls_tree" and m == 1):
            return None
        ch = min(T.MAX_NVLS_ARITY, g)
        room = intra * g / (g - 1)  # NCCL lets non-ring patterns use NVLink x G/(G-1)
        speeds = _speeds(T.SPEED_INTER if m > 1 else T.SPEED_INTRA, arch)
        cap = _nic_GBps(t, nic_bps) if m > 1 else math.inf
        s = next((x for x in speeds if x <= cap and x * ch <= room), speeds[-1])
        return Graph(ch, s, s)
    if algorithm.startswith("collnet"):
        # NCCL (5067397c): CollNet on switches that reduce, across servers of at most 8 GPUs (src/enqueue.cc,
        # NCCL_MAX_DIRECT_ARITY + 1), Direct only on NVSwitch (src/graph/tuning.cc: nvsCount == 0 disables it)
        if not t.sharp or m == 1 or g > 8 or (algorithm == "collnet_direct" and t.intra != "nvlink"):
            return None
        links = min(t.nic_count, g)
        return Graph(links, intra / links, _nic_GBps(t, nic_bps))
    if m == 1:  # one server: as many channels as NVLink carries at the fastest speed giving at least two
        speeds = _speeds(T.SPEED_INTRA, arch)
        s = next((x for x in speeds if intra / x >= 2), speeds[-1])
        ch = max(1, min(T.MAX_CHANNELS // 2, int(intra // s)))
    else:  # a channel per NIC (joined NICs count once per GPU), at the fastest speed a NIC carries
        speeds = _speeds(T.SPEED_INTER, arch)
        s = next((x for x in speeds if x <= _nic_GBps(t, nic_bps) * 1.0001), speeds[-1])
        ch = min(max(1, min(t.nic_count, g)), T.MAX_CHANNELS // 2)
    later = ARCHS.index(arch) >= ARCHS.index("hopper")
    if s >= 25 and not (later and s < 50 and ch > 4):  # ncclTopoDupChannels
        dup = min(2 * ch, T.MAX_CHANNELS)
        s, ch = s / -(-dup // ch), dup
    if t.channels is not None:  # a calibration's count (NCCL's search found more), each at the same speed
        ch = t.channels
    s_intra = s
    if algorithm == "tree" and m > 1:  # the search's second pass raises a tree's bwIntra (up to ~2 bwInter)
        room = intra * g / (g - 1) if g > 1 else math.inf
        for x in reversed(speeds):
            if x > s_intra and s_intra < 2 * s and x * ch <= room:
                s_intra = x
    return Graph(ch, s_intra, s)


def algorithms_for(t: MultiGPU, nic_bps: float) -> tuple[str, ...]:
    """The algorithms NCCL has on ``t`` (NVLS on one NVSwitch server of Hopper or later, NVLSTree on
    several, CollNet where the switches reduce)."""
    return tuple(a for a in ALGORITHMS if graph(t, a, nic_bps) is not None)


def _idx(m: int) -> int:
    return 0 if m == 1 else 1 if m == 2 else 2


def _hop(t: MultiGPU, algorithm: str, protocol: str) -> tuple[float, float]:
    """``(lat_intra, lat_inter)`` of one hop, microseconds (module docstring)."""
    p = PROTOCOLS.index(protocol)
    intra = T.HW_LAT["nvlink" if t.intra == "nvlink" else "pci"][algorithm][p]
    ppn1 = t.gpus == 1
    inter = T.HW_LAT["net"]["tree" if ppn1 else algorithm][p] + t.link.latency_s * 1e6
    if protocol == "Simple":  # the flush after a receive costs the transport's latency once more
        inter += t.link.latency_s * 1e6
    return intra, inter


def hop_latency_us(t: MultiGPU) -> tuple[float, float]:
    """``(inside a server, between servers)``: the start-up of one message of a schedule that is not NCCL's
    own (``ring``, ``hierarchical``, ...), microseconds: NCCL's per-hop latency of its Simple-protocol ring
    over NVLink (or PCI) and over the network (plus the transport's own latency, twice, as NCCL adds it
    for Simple), and at least the network post overhead inside a server of a multi-server cluster."""
    intra, inter = _hop(t, "ring", "Simple")
    if t.hosts > 1:
        intra = max(intra, 3 * T.NET_OVERHEAD_US)
    return intra, inter


def latency_us(t: MultiGPU, algorithm: str, protocol: str) -> float:
    """NCCL's latency of one all-reduce by ``algorithm`` and ``protocol`` on ``t``, microseconds (before
    the ring's plateau factor, which depends on the size: :func:`predict_us`)."""
    m, g, p_all = t.hosts, t.gpus, t.servers
    intra, inter = _hop(t, algorithm, protocol)
    lat = T.BASE_LAT[algorithm][PROTOCOLS.index(protocol)]
    logm = int(math.log2(m)) if m > 1 else 0  # NCCL's log2i: the floor
    if algorithm == "ring":
        if m > 1:
            intra = max(intra, T.NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
        steps, net_steps = 2 * (p_all - 1), 2 * (m - 1)
        return lat + (steps - net_steps) * intra + net_steps * inter
    if algorithm == "tree":
        return lat + 2 * ((g - 1) * intra + logm * inter)
    if algorithm == "collnet_direct":
        return lat + 2 * (min(1, g - 1) * intra + (g - 1) * 0.4) + inter
    if algorithm == "collnet_chain":
        return lat + 2 * (g - 1) * intra + inter
    if algorithm == "nvls":
        return intra + (inter if m > 1 else 0.0)
    return lat + intra + 2 * logm * inter  # nvls_tree


def bus_bandwidth(t: MultiGPU, algorithm: str, protocol: str, nic_bps: float) -> float:
    """NCCL's algorithm bandwidth (GB/s) of ``algorithm`` with ``protocol`` on ``t``; 0 where it does not
    run (module docstring)."""
    gr = graph(t, algorithm, nic_bps)
    if gr is None or (algorithm.startswith(("nvls", "collnet")) and protocol != "Simple"):
        return 0.0
    m, g, p_all, arch = t.hosts, t.gpus, t.servers, t.arch
    i = _idx(m)
    collnet = algorithm.startswith("collnet")
    bw = gr.bw_intra if (m <= 2 or collnet) else gr.bw_inter
    if algorithm in ("nvls", "nvls_tree"):
        if gr.channels < 2:
            return 0.0
        intra = gr.bw_intra * T.NVLS_EFF[arch] * (gr.channels - 1) / gr.channels * 2  # pipelines two ops
        inter = gr.bw_inter * (2 if (m <= 2 and algorithm == "nvls_tree") else 1)
        cap = T.PER_CH_NVLS_TREE[arch][i] if algorithm == "nvls_tree" else math.inf
        bw = min(intra, inter, cap)
    bus = gr.channels * bw
    ll_max = T.LL_MAX_BW_1[arch] if m == 1 else T.LL_MAX_BW_N[0 if m == 2 else 1]
    if algorithm == "ring" and protocol == "LL":
        bus = min(ll_max, bus * 0.5)
    if algorithm == "ring" and protocol == "LL128":
        bus = min(bus * 0.92, gr.channels * T.PER_CH_RING_LL128[arch][i])
    if algorithm == "tree":
        bus = min(bus * 0.92, gr.channels * T.PER_CH_TREE[arch][i])
        if protocol == "LL":
            bus = min(bus / 3.8, ll_max)
        if protocol == "LL128":
            bus = min(bus * (7 / 9 if m == 1 else 120 / 128), gr.channels * T.PER_CH_TREE_LL128[arch][i])
        if gr.pattern_tree:
            bus *= 0.85
    if algorithm == "collnet_direct":
        factor = g / gr.channels
        bus /= factor - (factor - 1) / 2
        if ARCHS.index(arch) >= ARCHS.index("hopper"):
            bus *= 0.85
    ratio = p_all / (2 * (p_all - 1)) if algorithm in ("ring", "nvls", "nvls_tree") else 0.5
    return bus * ratio


def cap_bandwidth(t: MultiGPU, algorithm: str, protocol: str, nic_bps: float) -> float | None:
    """NCCL's algorithm bandwidth (GB/s) of ``algorithm`` and ``protocol`` on ``t`` from its per-channel caps
    alone (``llMaxBw``, ``perChMaxRingLL128Bw``, ``perChMaxTreeBw``, ``perChMaxTreeLL128Bw``,
    ``perChMaxNVLSTreeBw``: limits of the GPU's copy loops, measured by NCCL, not of any link), None where
    NCCL sets none (ring and NVLS with Simple). :mod:`.nccl` prices no all-reduce faster than this."""
    gr = graph(t, algorithm, nic_bps)
    if gr is None:
        return None
    m, arch, p_all, i = t.hosts, t.arch, t.servers, _idx(t.hosts)
    ll_max = T.LL_MAX_BW_1[arch] if m == 1 else T.LL_MAX_BW_N[0 if m == 2 else 1]
    bus = None
    if algorithm == "ring" and protocol == "LL":
        bus = ll_max
    elif algorithm == "ring" and protocol == "LL128":
        bus = gr.channels * T.PER_CH_RING_LL128[arch][i]
    elif algorithm == "tree":
        bus = gr.channels * T.PER_CH_TREE[arch][i]
        if protocol == "LL":
            bus = min(bus / 3.8, ll_max)
        elif protocol == "LL128":
            bus = min(bus * (7 / 9 if m == 1 else 120 / 128), gr.channels * T.PER_CH_TREE_LL128[arch][i])
    elif algorithm == "nvls_tree" and T.PER_CH_NVLS_TREE[arch][i] > 0:
        bus = gr.channels * T.PER_CH_NVLS_TREE[arch][i]
    if bus is None:
        return None
    return bus * (p_all / (2 * (p_all - 1)) if algorithm in ("ring", "nvls", "nvls_tree") else 0.5)


def predict_us(t: MultiGPU, algorithm: str, protocol: str, nbytes: int, nic_bps: float) -> float:
    """NCCL's own predicted time of one all-reduce of ``nbytes``, microseconds (inf where it does not run)."""
    bw = bus_bandwidth(t, algorithm, protocol, nic_bps)
    if bw <= 0:
        return math.inf
    lat = latency_us(t, algorithm, protocol)
    log_size = int(math.log2(nbytes >> 6)) if nbytes >> 6 else -1
    if algorithm == "tree" and 0 <= log_size < 23:
        bw *= T.TREE_CORRECTION[protocol][log_size]
    if algorithm == "nvls_tree" and t.arch == "blackwell" and 0 <= log_size < 24:
        bw *= T.TREE_CORRECTION[protocol][log_size]
    if algorithm == "ring" and protocol == "Simple" and t.hosts > 1:
        ch = graph(t, "ring", nic_bps).channels
        if nbytes / (ch * t.servers) >= 64:
            lat *= 1.9 if t.arch == "volta" else 1.4  # the ring's plateau
    return lat + nbytes / (1000 * bw)


def choose(
    t: MultiGPU,
    nbytes: int,
    nic_bps: float,
    *,
    algorithms: tuple[str, ...] | None = None,
    protocols: tuple[str, ...] | None = None,
) -> Choice:
    """The (algorithm, protocol) NCCL runs for an all-reduce of ``nbytes`` on ``t``: the cheapest by
    :func:`predict_us` among ``algorithms`` x ``protocols`` (default: all it has; NCCL_ALGO / NCCL_PROTO
    narrow them). LL128 counts only with NVLink inside servers (NCCL enables it by default there)."""
    algos = algorithms or ALGORITHMS
    protos = protocols or PROTOCOLS
    best: Choice | None = None
    for a in algos:
        for p in protos:
            if p == "LL128" and t.intra != "nvlink" and protocols is None:
                continue
            us = predict_us(t, a, p, max(int(nbytes), 1), nic_bps)
            if math.isfinite(us) and (best is None or us < best.time_us):
                best = Choice(a, p, graph(t, a, nic_bps).channels, us)
    if best is None:
        raise ValueError(f"no algorithm of {', '.join(algos)} with {', '.join(protos)} runs on {t.spec}")
    return best
