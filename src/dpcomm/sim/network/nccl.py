"""``nccl``, ``nccl-ring``, ``nccl-tree``, ``nccl-nvls``, ``nccl-nvlstree``, ``nccl-collnet`` (=
``nccl-collnet-direct``), ``nccl-collnet-chain``: an all-reduce as NCCL runs it on a multi-GPU fabric, priced
by the flow model (CollNet's schedules: :mod:`.collnet`).

Names: ``nccl`` is NCCL's own choice (no ``NCCL_ALGO`` set); ``nccl-ALGO`` forces the algorithm
(``NCCL_ALGO=Ring``, ...); either takes ``:LL``, ``:LL128`` or ``:Simple`` to force the protocol
(``NCCL_PROTO``), e.g. ``nccl-ring:LL128`` or ``nccl:Simple``. Where the protocol is not forced, NCCL's
tuning model picks it (:func:`.nccl_tuning.choose`), and the channels are that model's.

Price of one all-reduce of ``S`` bytes on ``P`` ranks: ``T = L + T_flow``, where

* ``L`` is NCCL's latency for the chosen algorithm and protocol (:func:`.nccl_tuning.latency_us`, with the
  ring's plateau factor of :func:`.nccl_tuning.predict_us`) when the model takes the fabric's own start-up
  (:attr:`.engine.FlowModel.nccl`); otherwise (a start-up given by the user: ``--alpha-us``, a network
  file) the schedule's steps each pay ``alpha`` per message as every other schedule does (NVLS, NVLSTree
  and CollNet, one streaming step each, pay it once per hop of NCCL's latency formula), and ``L = 0``;
* a topology fitted by ``dpcomm calibrate --from-nccl-tests`` may carry ``lat_scale=F``: then an LL128 or
  Simple call's ``L`` is ``F`` times NCCL's latency whatever the start-up, and its messages pay none (the
  latency of a bandwidth-bound call, which the small rows' LL start-up does not tell, fitted to the
  table's large rows: :mod:`.fit`); ``algo=`` narrows ``nccl`` to one algorithm, as ``NCCL_ALGO`` does;
  with ``ranges=``, a message takes the values of the range its size falls in (:mod:`.size_model`);
* ``T_flow`` is the flow model's time of the algorithm's messages (:mod:`.nccl_ring`, :mod:`.nccl_tree`,
  :mod:`.nvls`; NVLSTree's and one server's NVLS streaming step stretched by its pipeline's fill, ``(n + D -
  1) / n`` for ``n`` rounds of NCCL's chunks through ``D`` stages, :func:`.nvls.nvls_tree_rounds` and
  :func:`.nvls.nvls_rounds`), their bytes grown by the
  protocol's wire format: LL sends a 4-byte flag with every 4
  bytes of data (x2), LL128 8 bytes of flags per 128 (x128/120), Simple none; and at least ``S`` over
  the bandwidth NCCL's per-channel caps allow (:func:`.nccl_tuning.cap_bandwidth`: LL, LL128, the tree and
  NVLSTree; limits of the GPU's copy loops that NCCL measured, not of any link).

So at large sizes (Simple) the price is the flow model's on the fabric's achievable rates, and at small
sizes NCCL's measured latencies: the two ends the published tables are fitted and checked at
(docs/netsim.md).
"""

from __future__ import annotations

import dataclasses
import math

from dpcomm.errors import UserError
from dpcomm.messages import Step
from dpcomm.sim.network import collnet, nccl_ring, nccl_tree, nccl_tuning, nvls, size_model
from dpcomm.sim.network._gpuparts import shape
from dpcomm.topology.multigpu import MultiGPU

__all__ = ["ALGOS", "NAMES", "WIRE", "Picked", "parse_protocol", "pick", "price", "ranks_topology"]

ALGOS = {
    "nccl-ring": "ring",
    "nccl-tree": "tree",
    "nccl-nvls": "nvls",
    "nccl-nvlstree": "nvls_tree",
    "nccl-collnet": "collnet_direct",
    "nccl-collnet-direct": "collnet_direct",
    "nccl-collnet-chain": "collnet_chain",
}
"""Our names of NCCL's algorithms, and NCCL's (lower-case ``NCCL_ALGO`` values)."""
NAMES = ("nccl", *ALGOS)
WIRE = {"LL": 2.0, "LL128": 128 / 120, "Simple": 1.0}
"""Wire bytes per payload byte of each protocol (NCCL's LL: 8-byte lines of 4 data + 4 flag bytes; LL128:
128-byte lines with 8 flag bytes)."""
_ELEM = 4


@dataclasses.dataclass(frozen=True, slots=True)
class Picked:
    """The algorithm, protocol and channels one all-reduce runs with, and NCCL's own predicted time."""

    algorithm: str
    protocol: str
    channels: int
    nccl_us: float

    @property
    def label(self) -> str:
        """``nvls_tree/Simple x8``."""
        return f"{self.algorithm}/{self.protocol} x{self.channels}"


def parse_protocol(text: str | None) -> str | None:
    """``"ll128"`` -> ``"LL128"``; None stays None; anything else a one-line :class:`UserError`."""
    if text is None:
        return None
    for p in nccl_tuning.PROTOCOLS:
        if text.strip().lower() == p.lower():
            return p
    raise UserError(f"unknown NCCL protocol '{text}' (choose from {', '.join(nccl_tuning.PROTOCOLS)})")


def ranks_topology(t: MultiGPU, p: int) -> MultiGPU:
    """``t`` cut to the servers ``p`` ranks fill (the first ones; fewer ranks than a server: part of one)."""
    g, m = shape(p, t.gpus)
    if (m, g) == (t.hosts, t.gpus):
        return t
    nics = t.nic_count if g == t.gpus else g
    return dataclasses.replace(t, hosts=m, gpus=g, nics=nics)


def pick(t: MultiGPU, name: str, protocol: str | None, nbytes: int, p: int, nic_bps: float) -> Picked:
    """What runs for ``name`` (``nccl`` or ``nccl-ALGO``) with ``protocol`` (None: NCCL's choice)."""
    sub = ranks_topology(t, p)
    if name == "nccl" and t.algo is not None:  # the cluster's NCCL_ALGO, or what its calibration picked
        name = f"nccl-{t.algo}"
    algos = (ALGOS[name],) if name in ALGOS else None
    protos = (protocol,) if protocol else (t.proto,) if t.proto else None  # NCCL_PROTO, or the cluster's
    if algos and nccl_tuning.graph(sub, algos[0], nic_bps) is None:
        why = {
            "nvls": "NVLink SHARP on one server of Hopper or later GPUs on NVSwitch",
            "nvls_tree": "NVLink SHARP (Hopper or later on NVSwitch) and more than one server",
            "collnet_direct": "switches that reduce (sharp=1), NVSwitch, and servers (2+) of at most 8 GPUs",
            "collnet_chain": "switches that reduce (sharp=1) and servers (2+) of at most 8 GPUs",
        }
        raise UserError(f"{name} needs {why.get(algos[0], 'another fabric')}; {t.spec} has none")
    try:
        c = nccl_tuning.choose(sub, max(int(nbytes), 1), nic_bps, algorithms=algos, protocols=protos)
    except ValueError:
        raise UserError(f"{name} does not run with protocol {protocol} on {t.spec}") from None
    return Picked(c.algorithm, c.protocol, c.channels, c.time_us)


def _tree_chunk(t: MultiGPU, picked: Picked, nbytes: int) -> int:
    """Data bytes of one pipeline chunk of NCCL's tree (``src/enqueue.cc``): a step of the protocol's buffer
    (``NCCL_STEPS`` = 8 per buffer: Simple 4 MiB, so 512 KiB; LL 512 KiB of 16-byte lines half data, so
    32 KiB; LL128 4,915,200 bytes of 120/128 data, so 576,000), and for LL128 halved while a channel would
    get fewer chunks than ``(1 + log2 M + 0.1 G) x 64 / G`` (down to 128 KiB), then ``x 16 / G`` (to 32
    KiB)."""
    if picked.protocol == "Simple":
        return nccl_tree.CHUNK
    if picked.protocol == "LL":
        return 32 * 1024
    chunk, ch, g = 576_000, max(1, picked.channels), t.gpus
    steps_ll128 = 1 + (int(math.log2(t.hosts)) if t.hosts > 1 else 0) + 0.1 * g
    while nbytes // (ch * chunk) < steps_ll128 * 64 / g and chunk > 131072:
        chunk //= 2
    while nbytes // (ch * chunk) < steps_ll128 * 16 / g and chunk > 32768:
        chunk //= 2
    return chunk


def steps(t: MultiGPU, picked: Picked, p: int, nbytes: int, ranks_total: int) -> list[Step]:
    """The messages of ``picked`` on ``p`` ranks of ``t`` (switch endpoints numbered from ``ranks_total``,
    the fabric's ranks), bytes grown by the protocol's wire format."""
    wire = max(int(math.ceil(int(nbytes) * WIRE[picked.protocol])), _ELEM)
    a, g, ch = picked.algorithm, t.gpus, max(1, picked.channels)
    if a == "ring":
        return nccl_ring.steps(p, g, wire // _ELEM, _ELEM, channels=ch)
    if a == "tree":
        chunk = max(_ELEM, int(_tree_chunk(t, picked, nbytes) * WIRE[picked.protocol]))
        return nccl_tree.steps(p, g, wire // _ELEM, _ELEM, channels=ch, chunk_bytes=chunk)
    eff = nvls.NVLS_EFFICIENCY.get(t.arch, 1.0)
    if a == "nvls":
        return nvls.nvls_steps(p, g, wire, eff=eff, nvs0=ranks_total)
    if a == "nvls_tree":
        return nvls.nvls_tree_steps(p, g, wire, eff=eff, nvs0=ranks_total)
    heads, sw0 = min(t.nic_count, g), ranks_total + t.hosts  # CollNet: rail n's switch is sw0 + n
    if a == "collnet_chain":
        return collnet.collnet_chain_steps(p, g, wire, heads=heads, channels=ch, sw0=sw0)
    return collnet.collnet_steps(p, g, wire, heads=heads, sw0=sw0)


def _hops(t: MultiGPU, algorithm: str) -> int:
    """Messages in sequence of NCCL's NVLS, NVLSTree and CollNet pipelines, as its latency formula counts
    them (:func:`.nccl_tuning.latency_us`): NVLS 1 (+1 across servers), NVLSTree ``1 + 2 log2 M``,
    CollNet Direct ``2 + 1``, Chain ``2 (G-1) + 1``."""
    logm = int(math.log2(t.hosts)) if t.hosts > 1 else 0
    return {"nvls": 1 + (t.hosts > 1), "nvls_tree": 1 + 2 * logm, "collnet_direct": 3}.get(
        algorithm, 2 * (t.gpus - 1) + 1
    )


def price(model, name: str, protocol: str | None, nbytes: int, p: int) -> tuple[float, list[Step], Picked]:
    """``(seconds, steps, picked)`` of ``name``'s all-reduce of ``nbytes`` on ``p`` ranks of ``model``'s
    fabric (module docstring)."""
    t: MultiGPU = model.fabric.topology
    if t.ranges:  # a calibration's size ranges: this size's values (dpcomm.topology.size_ranges)
        model, t = size_model.at_size(model, nbytes)
    fabric = model.fabric
    picked = pick(t, name, protocol, nbytes, p, fabric.rate_bps)
    st = steps(t, picked, p, nbytes, fabric.servers)
    # a calibration's factor on NCCL's latency of a bandwidth-bound call replaces the start-up per message
    scaled = t.lat_scale is not None and picked.protocol != "LL"
    flow = model.run(st, start=not (model.nccl or scaled)).time_s if p > 1 else 0.0
    lat = 0.0
    sub = ranks_topology(t, p)
    if p > 1 and picked.algorithm == "nvls_tree":  # the pipeline fills and drains (nvls.nvls_tree_rounds)
        nic = (sub.nic_bps if sub.nic_bps is not None else fabric.rate_bps) / 8e9
        rounds, _, _ = nvls.nvls_tree_rounds(
            sub.arch, sub.hosts, sub.gpus, min(sub.nic_count, sub.gpus), nic, nbytes
        )
        flow *= (rounds + _hops(sub, "nvls_tree") - 1) / rounds
    if p > 1 and picked.algorithm == "nvls" and sub.hosts == 1:  # the same in one server (nvls.nvls_rounds)
        rounds, _, _ = nvls.nvls_rounds(sub.arch, sub.gpus, nbytes, sub.nccl)
        flow *= (rounds + nvls.NVLS_STAGES_ONE_SERVER - 1) / rounds
    if p > 1 and not (model.nccl or scaled) and picked.algorithm not in ("ring", "tree"):
        # one streaming step stands for a pipeline as deep as NCCL's latency formula counts its hops
        alpha = model.alpha_inter_s if model.alpha_inter_s is not None and sub.hosts > 1 else model.alpha_s
        lat = alpha * (_hops(sub, picked.algorithm) - 1)
    if p > 1 and (model.nccl or scaled):
        lat = nccl_tuning.latency_us(sub, picked.algorithm, picked.protocol) * 1e-6
        if picked.algorithm == "ring" and picked.protocol == "Simple" and sub.hosts > 1:
            if nbytes / (picked.channels * p) >= 64:
                lat *= 1.9 if sub.arch == "volta" else 1.4  # the ring's plateau (nccl_tuning.predict_us)
        lat *= t.lat_scale if scaled else 1.0
    if p > 1:  # no faster than NCCL's per-channel caps allow (the GPU's copy loops, not any link)
        cap = nccl_tuning.cap_bandwidth(sub, picked.algorithm, picked.protocol, fabric.rate_bps)
        if cap:
            flow = max(flow, nbytes / (cap * 1e9))
    return lat + flow, st, picked
