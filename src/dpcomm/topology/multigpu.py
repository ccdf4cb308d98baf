"""Servers with several accelerators: ``gpus:S,G,...`` and the presets ``dgx-h100:S``, ``dgx-a100:S``.

A cluster of ``S`` servers, each with ``G`` accelerators (GPUs) on an intra-server fabric and ``N`` NICs on
a network above them. Rank ``r`` is GPU ``r mod G`` of server ``r div G`` (NCCL's and torchrun's order:
consecutive ranks fill a server). The parts, as the flow model (:mod:`dpcomm.sim.network.gpufabric`)
lays them out:

* **intra-server fabric** (default ``nvlink=450GB/s``, H100's), one of
  - ``nvlink=RATE``: NVLink through NVSwitch, a non-blocking switch per server with one link per GPU of
    ``RATE`` each way (H100: 18 NVLink4 links x 25 GB/s = 450 GB/s each way, "900 GB/s" bidirectional);
  - ``pcie=RATE``: one shared per-server bus of ``RATE`` that every transfer inside the server crosses
    once (GPU to GPU, and GPU to NIC and back), both directions together (a PCIe server whose GPUs
    talk through the CPU's root complex);
  - ``loopback=RATE``: one shared per-server bus of ``RATE``, both directions together, that only the
    transfers between two GPUs of the server cross; traffic to other servers goes straight to the NIC.
    It is the emulated cluster's multi-GPU server (``dpcomm testbed up --gpus-per-server G --intra-rate
    RATE``: the server's ranks talk over the namespace's loopback, shaped by one tbf, and reach other
    servers through the server's veth, docs/testbed.md);
* **NICs**: ``nics=N`` per server (default ``G``), each of ``nic=RATE`` each way (default: the fabric's
  ``--rate``). ``N`` divides ``G`` (NIC ``n`` serves GPUs ``n G/N .. (n+1) G/N - 1``, which share its PCIe
  switch, as in DGX servers) or is a multiple of ``G`` (GPU ``g`` has NICs ``g N/G .. (g+1) N/G - 1``, as
  16 x 100G RoCE or 32 x 100G EFA on 8 GPUs; NCCL stripes its channels over them, so the flow model joins
  a GPU's NICs into one link of ``N/G`` times the rate). Any other count cannot be wired evenly and is
  refused, as are more than :data:`MAX_NICS`;
* **transport**: ``transport=ib|roce|efa|tcp`` (default ``ib``): what the NICs speak
  (:mod:`dpcomm.topology.transports`: NCCL's achievable fraction of the line rate on each, with sources,
  and each one's own start-up);
* **efficiencies**: ``intra_eff=F`` (default 1) and ``nic_eff=F`` (default: the transport's fraction; a
  number in (0, 1] or a ratio such as ``370/450``): the fraction of the line rate that NCCL's Simple
  protocol moves over the intra-server fabric and over each NIC. The flow model's links carry ``RATE x
  F``; the rates above stay the line (datasheet) rates, so both are visible. Presets set them from the
  published achievable rates;
* **GPU generation**: ``arch=volta|ampere|hopper|blackwell`` (default ``hopper``), which of NCCL's tuning
  tables apply (:mod:`dpcomm.sim.network.nccl_tuning`); NVLink SHARP (NCCL's NVLS) is there on Hopper and
  later with ``nvlink=``; ``sharp=1`` says the network switches reduce too (InfiniBand SHARP: NCCL's
  CollNet), default 0;
* **what a calibration fitted** (``dpcomm calibrate --from-nccl-tests`` writes them; default none):
  ``algo=ring|tree|nvls|nvlstree|collnet|collnet-direct|collnet-chain`` (``collnet`` is Direct), what the
  cluster's NCCL runs (its ``NCCL_ALGO``, or what explained its table), which NCCL's choice (``nccl``) is
  narrowed to; ``channels=C``, NCCL's ring and tree channels where its search makes more than ours;
  ``lat_scale=F`` (>= 0), NCCL's latency of a bandwidth-bound (LL128 or Simple) all-reduce times ``F``,
  replacing the start-up per message there (:mod:`dpcomm.sim.network.nccl`); ``ranges=FROM:key=value...+...``,
  other values of those (and of the fractions) from a message size on (:mod:`dpcomm.topology.size_ranges`);
* **network**: ``net=rail`` (default): rail-optimised, NIC ``n`` of every server on rail switch ``n``
  (non-blocking); a transfer to another server leaves through the NIC on the *destination* GPU's rail,
  reaching it over the intra-server fabric first when that is not the sender's own NIC (NCCL's PXN,
  "PCI x NVLink"); ``net=star``: every NIC on one non-blocking switch, a transfer leaves by the sender's
  own NIC.

Rates are ``<number>GB/s`` (bytes, 1e9) or tc's bit units (``400gbit``). Presets (sources next to each
number) fill these in; keys after a preset override it: ``dgx-h100:16,nics=1``. Every spec is read by
:func:`parse_multigpu`, the one parser; a bad one is a one-line :class:`UserError`.

Attention: a fabric's ``servers`` are its endpoints, so :attr:`MultiGPU.servers` is the number of GPUs
(ranks); the number of physical servers is :attr:`MultiGPU.hosts`.

Kept as one module (about 390 lines): the spec's parser and its defaults are read together; the presets
and their sources are :mod:`dpcomm.topology.gpu_presets`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dpcomm.errors import UserError
from dpcomm.topology.gpu_presets import PRESETS, preset_names
from dpcomm.topology.size_ranges import SizeRange, check, format_ranges, parse_ranges
from dpcomm.topology.transports import TRANSPORTS, Transport

__all__ = [
    "ARCHS",
    "INTRA",
    "MAX_NICS",
    "NCCL_ALGOS",
    "MultiGPU",
    "PRESETS",
    "is_multigpu_spec",
    "parse_multigpu",
]

_GB = 8e9  # bits/s in 1 GB/s
MAX_NICS = 64
"""Most NICs one server may have (8 GPUs x 8 NICs; the largest shipping servers have 32)."""
INTRA = ("nvlink", "pcie", "loopback")
"""Intra-server fabrics (see the module docstring)."""
ARCHS = ("volta", "ampere", "hopper", "blackwell")
NCCL_ALGOS = ("ring", "tree", "nvls", "nvlstree", "collnet", "collnet-direct", "collnet-chain")
NCCL_PROTOS = ("LL", "LL128", "Simple")
"""``proto=`` values: NCCL's protocols as ``NCCL_PROTO`` names them."""
_VERSION = re.compile(r"^\d{1,3}\.\d{1,3}(?:\.\d{1,3})?$")
_PLUGIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,79}$")
"""``algo=`` values: NCCL's all-reduce algorithms as ``NCCL_ALGO`` names them (lower case; dpcomm's
``nccl-ring``, ... without the prefix)."""
"""GPU generations, as NCCL's tuning tables are indexed (compute capability 7.x, 8.x, 9.x, 10.x)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiGPU:
    """``hosts`` servers of ``gpus`` accelerators each (see the module docstring)."""

    hosts: int
    """Physical servers (>= 1)."""
    gpus: int
    """Accelerators per server (>= 1)."""
    intra: str = "nvlink"
    """``"nvlink"`` (a non-blocking NVSwitch, a link per GPU), ``"pcie"`` (one shared bus per server) or
    ``"loopback"`` (one shared bus per server that NIC traffic does not cross)."""
    intra_bps: float = 450 * _GB
    """NVLink: each GPU's rate each way; PCIe: the bus's rate; bits/s."""
    nics: int | None = None
    """NICs per server (divides ``gpus``); None: one per GPU."""
    nic_bps: float | None = None
    """Each NIC's rate each way, bits/s; None: the fabric's rate (``--rate``)."""
    net: str = "rail"
    """``"rail"`` (rail-optimised, PXN routing) or ``"star"`` (one switch, the sender's own NIC)."""
    intra_eff: float = 1.0
    """Fraction of ``intra_bps`` that NCCL moves (its Simple protocol's overhead); the links carry the
    product."""
    nic_eff: float | None = None
    """Fraction of a NIC's line rate that NCCL moves; the links carry the product. None: the transport's
    published fraction (:attr:`nic_fraction`)."""
    transport: str = "ib"
    """``ib``, ``roce``, ``efa`` or ``tcp`` (:data:`dpcomm.topology.transports.TRANSPORTS`)."""
    arch: str = "hopper"
    """GPU generation (:data:`ARCHS`): which of NCCL's tuning tables apply."""
    sharp: bool = False
    """The network switches reduce (InfiniBand SHARP): NCCL's CollNet algorithms are there."""
    algo: str | None = None
    """NCCL's choice narrowed to this algorithm (:data:`NCCL_ALGOS`; the cluster's ``NCCL_ALGO``, or a
    calibration's pick); None: NCCL's own choice among all."""
    channels: int | None = None
    """NCCL's ring and tree channels (a calibration's pick; None: the count this model's simplification of
    NCCL's search gives, :func:`dpcomm.sim.network.nccl_tuning.graph`)."""
    lat_scale: float | None = None
    """A calibration's factor on NCCL's latency of an LL128 or Simple all-reduce (None: no factor; the
    start-up per message or NCCL's latency as they are)."""
    ranges: tuple[SizeRange, ...] = ()
    """A calibration's size ranges: from each one's size on, its own values of the keys above
    (:mod:`dpcomm.topology.size_ranges`); none: the spec's values at every size."""
    row_factors: tuple[tuple[int, float], ...] = ()
    """A calibration's factors per measured size on the modelled time of :attr:`row_algo` (every row of
    its nccl-tests table kept, :mod:`dpcomm.sim.network.fit_rows`); none: the model as it is. Not part of
    :attr:`spec` (a network file carries them)."""
    row_algo: str | None = None
    """The schedule the factors were fitted for (``nccl``, ``nccl-ring``, ``nccl-ring:LL128``)."""
    proto: str | None = None
    """NCCL's protocol narrowed to this one (the cluster's ``NCCL_PROTO``: :data:`NCCL_PROTOS`); None: its
    own choice."""
    nccl: str | None = None
    """The NCCL version the cluster runs (``2.23.4``; read from a log's ``NCCL version`` line); None: not
    stated. What NCCL achieves depends on it (a calibrated file is refused on another)."""
    net_plugin: str | None = None
    """The network plugin and its version (``aws-ofi-nccl-1.13.2-aws``); None: not stated, or NCCL's own."""
    assumed: tuple[str, ...] = field(default=(), compare=False)
    """Defaults a hand-written ``gpus:`` spec took where a preset states its own (``intra_eff=1``,
    ``net=rail``): :meth:`describe` says them, so a header shows what was assumed."""

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.gpus < 1:
            raise ValueError(f"needs at least 1 server of at least 1 GPU, got {self.hosts} x {self.gpus}")
        if self.intra not in INTRA:
            raise ValueError(f"intra-server fabric is nvlink=, pcie= or loopback=RATE, not {self.intra!r}")
        if self.net not in ("rail", "star"):
            raise ValueError(f"net is rail or star, not {self.net!r}")
        n = self.nic_count
        if not 1 <= n <= MAX_NICS or (self.gpus % n and n % self.gpus):
            raise ValueError(
                f"nics={n} must divide the {self.gpus} GPUs of a server or be a multiple of them, at most "
                f"{MAX_NICS} (other counts cannot be wired evenly to the GPUs)"
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport is one of {', '.join(TRANSPORTS)}, not {self.transport!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch is one of {', '.join(ARCHS)}, not {self.arch!r}")
        for what, eff in (("intra_eff", self.intra_eff), ("nic_eff", self.nic_fraction)):
            if not 0 < eff <= 1:
                raise ValueError(f"{what}={eff:g} must be in (0, 1] (a fraction of the line rate)")
        if self.algo is not None and self.algo not in NCCL_ALGOS:
            raise ValueError(f"algo is one of {', '.join(NCCL_ALGOS)}, not {self.algo!r}")
        if self.channels is not None and not 1 <= self.channels <= 64:
            raise ValueError(f"channels={self.channels} must be from 1 to 64 (NCCL's MAXCHANNELS)")
        if self.lat_scale is not None and not 0 <= self.lat_scale <= 1e4:
            raise ValueError(
                f"lat_scale={self.lat_scale:g} must be from 0 to 10000 (a factor on NCCL's latency)"
            )
        check(self.ranges)
        if self.proto is not None and self.proto not in NCCL_PROTOS:
            raise ValueError(f"proto is one of {', '.join(NCCL_PROTOS)}, not {self.proto!r}")
        if self.nccl is not None and not _VERSION.match(self.nccl):
            raise ValueError(f"nccl={self.nccl} is not a version (e.g. 2.23.4)")
        if self.net_plugin is not None and not _PLUGIN.match(self.net_plugin):
            raise ValueError(f"plugin={self.net_plugin} is not a name-version (e.g. aws-ofi-nccl-1.13.2)")
        sizes = [n for n, _ in self.row_factors]
        if (
            any(not (0 < c < 1e6) for _, c in self.row_factors)
            or sizes != sorted(set(sizes))
            or (self.row_factors and self.row_algo is None)
        ):
            raise ValueError("row factors are positive, at increasing sizes, with the algorithm they fit")
        for what, bps in (("intra-server rate", self.intra_bps), ("NIC rate", self.nic_bps)):
            if bps is not None and not 8e3 <= bps <= 1e15:
                raise ValueError(f"{what} {bps:g} bit/s is outside 8kbit..1000tbit")

    @property
    def nic_count(self) -> int:
        return self.gpus if self.nics is None else self.nics

    @property
    def nic_fraction(self) -> float:
        """``nic_eff``, or the transport's fraction for the stated NCCL version when the spec gives none."""
        return self.nic_eff if self.nic_eff is not None else self.link.fraction_for(self.nccl)

    @property
    def link(self) -> Transport:
        """The NICs' transport (:mod:`dpcomm.topology.transports`)."""
        return TRANSPORTS[self.transport]

    @property
    def nvls(self) -> bool:
        """NVLink SHARP is there: NVSwitch (``nvlink=``) on Hopper or later."""
        return self.intra == "nvlink" and ARCHS.index(self.arch) >= ARCHS.index("hopper")

    @property
    def servers(self) -> int:
        """Endpoints of the fabric: GPUs (ranks), ``hosts * gpus``."""
        return self.hosts * self.gpus

    def describe(self, nic_bps: float | None = None) -> str:
        """One line for a header: ``8 servers x 8 GPUs (64 ranks), NVLink 450 GB/s x 82%, 8 x 400gbit
        InfiniBand NICs x 96%`` (``nic_bps``: the NIC rate when the spec gives none)."""
        rate = self.nic_bps if self.nic_bps is not None else nic_bps
        nic = (
            f"{self.nic_count} x {rate / 1e9:g}gbit {self.link.name} NIC" if rate else f"{self.nic_count} NIC"
        )
        intra = {"nvlink": "NVLink", "pcie": "PCIe bus", "loopback": "loopback bus"}[self.intra]
        nics = "s" if self.nic_count > 1 else ""
        plural = "s" if self.hosts != 1 else ""
        assumed = f" (assumed, as no preset does: {', '.join(self.assumed)})" if self.assumed else ""
        return (
            f"{self.hosts} server{plural} x {self.gpus} GPUs ({self.servers} ranks), {intra} "
            f"{_fmt(self.intra_bps).replace('GB/s', ' GB/s')} x {self.intra_eff:.0%}, {nic}{nics} x "
            f"{self.nic_fraction:.0%}, {self.arch}{', SHARP' if self.sharp else ''}, net={self.net}{assumed}"
        )

    @property
    def spec(self) -> str:
        """The canonical ``gpus:`` spec (presets are spelled out)."""
        nic = f",nic={self.nic_bps / 1e9:g}gbit" if self.nic_bps is not None else ""
        ie = f",intra_eff={self.intra_eff!r}" if self.intra_eff != 1 else ""
        ne = f",nic_eff={self.nic_eff!r}" if self.nic_eff is not None else ""
        tr = f",transport={self.transport}" if self.transport != "ib" else ""
        arch = f",arch={self.arch}" if self.arch != "hopper" else ""
        sharp = ",sharp=1" if self.sharp else ""
        fit = (
            (f",algo={self.algo}" if self.algo else "")
            + (f",channels={self.channels}" if self.channels else "")
            + (f",lat_scale={self.lat_scale!r}" if self.lat_scale is not None else "")
            + (f",ranges={format_ranges(self.ranges)}" if self.ranges else "")
            + (f",proto={self.proto}" if self.proto else "")
            + (f",nccl={self.nccl}" if self.nccl else "")
            + (f",plugin={self.net_plugin}" if self.net_plugin else "")
        )
        return (
            f"gpus:{self.hosts},{self.gpus},{self.intra}={_fmt(self.intra_bps)}{ie},"
            f"nics={self.nic_count}{nic}{ne},net={self.net}{tr}{arch}{sharp}{fit}"
        )

    def host_of(self, rank: int) -> int:
        return rank // self.gpus

    def summary(self) -> dict[str, object]:
        return {
            "topology": self.spec,
            "servers": self.hosts,
            "gpus_per_server": self.gpus,
            "ranks": self.servers,
            "nics_per_server": self.nic_count,
            "transport": self.transport,
        }


def _fmt(bps: float) -> str:
    """``450GB/s`` when a whole number of GB/s, else ``400gbit``-style bits."""
    if bps % _GB == 0:
        return f"{bps / _GB:g}GB/s"
    return f"{bps / 1e9:g}gbit" if bps >= 1e9 else f"{bps / 1e6:g}mbit"


_HEAD = re.compile(r"^\s*([a-z0-9-]+)\s*:\s*(.*)$")
_INT = re.compile(r"^\s*(\d{1,9})\s*$")
_RATE = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,9})?)\s*(GB/s|tbit|gbit|mbit|kbit)\s*$")
_BITS = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
_EFF = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,17})?)\s*(?:/\s*(\d{1,9}(?:\.\d{1,17})?)\s*)?$")
_KEYS = (
    "keys: nvlink, pcie, loopback, intra_eff, nics, nic, nic_eff, net, transport, arch, sharp, algo, "
    "channels, lat_scale, ranges, proto, nccl, plugin"
)
_FORM = (
    "gpus:S,G[,nvlink=RATE|pcie=RATE|loopback=RATE][,intra_eff=F][,nics=N][,nic=RATE][,nic_eff=F][,net=rail|star]"
    "[,transport=ib|roce|efa|tcp][,arch=A][,sharp=0|1] or a preset"
)


def is_multigpu_spec(spec: str) -> bool:
    """Whether ``spec`` names a multi-accelerator topology (``gpus:`` or a preset)."""
    m = _HEAD.match(spec or "")
    return bool(m) and (m.group(1) == "gpus" or m.group(1) in PRESETS)


def _rate(key: str, text: str, shown: str) -> float:
    m = _RATE.match(text)
    if not m:
        raise UserError(f"bad topology '{shown}': {key}={text} is not a rate (e.g. 450GB/s or 400gbit)")
    value = float(m.group(1))
    return value * _GB if m.group(2) == "GB/s" else value * _BITS[m.group(2)]


def _eff(key: str, text: str, shown: str) -> float:
    m = _EFF.match(text)
    den = float(m.group(2)) if m and m.group(2) else 1.0
    if not m or den == 0:
        raise UserError(f"bad topology '{shown}': {key}={text} is not a fraction (e.g. 0.8 or 370/450)")
    return float(m.group(1)) / den


def parse_multigpu(spec: str) -> MultiGPU:
    """Read ``gpus:S,G[,key=value...]`` or ``PRESET:S[,key=value...]`` (see the module docstring); anything
    else is a one-line :class:`UserError`."""
    shown = spec if len(spec or "") <= 80 else f"{spec[:77]}..."
    m = _HEAD.match(spec or "")
    if not m or not (m.group(1) == "gpus" or m.group(1) in PRESETS):
        raise UserError(f"bad topology '{shown}' (expected {_FORM}: {preset_names()})")
    kind, parts = m.group(1), [x.strip() for x in m.group(2).split(",")]
    counts = 2 if kind == "gpus" else 1
    if len(parts) < counts or any(not _INT.match(x) for x in parts[:counts]):
        want = "gpus:S,G (servers, GPUs per server)" if kind == "gpus" else f"{kind}:S (servers)"
        raise UserError(f"bad topology '{shown}' (expected {want}, numbers of at most 9 digits)")
    fields: dict[str, object] = {} if kind == "gpus" else dict(PRESETS[kind])
    fields["hosts"] = int(parts[0])
    if kind == "gpus":
        fields["gpus"] = int(parts[1])
    seen: set[str] = set()
    for item in parts[counts:]:
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not value:
            raise UserError(f"bad topology '{shown}': '{item}' is not key=value ({_KEYS})")
        if key in seen or (key in INTRA and seen & set(INTRA)):
            raise UserError(f"bad topology '{shown}': {key} given twice (or two of nvlink, pcie, loopback)")
        seen.add(key)
        if key in INTRA:
            fields["intra"], fields["intra_bps"] = key, _rate(key, value, shown)
        elif key == "nic":
            fields["nic_bps"] = _rate(key, value, shown)
        elif key in ("intra_eff", "nic_eff"):
            fields[key] = _eff(key, value, shown)
        elif key in ("nics", "channels"):
            if not _INT.match(value):
                raise UserError(f"bad topology '{shown}': {key}={value} is not a whole number")
            fields[key] = int(value)
        elif key in ("net", "transport", "arch", "algo", "proto", "nccl"):
            fields[key] = value
        elif key == "plugin":
            fields["net_plugin"] = value
        elif key == "lat_scale":
            fields[key] = _eff(key, value, shown)
        elif key == "ranges":
            fields[key] = parse_ranges(value, shown)
        elif key == "sharp":
            if value not in ("0", "1"):
                raise UserError(f"bad topology '{shown}': sharp={value} is 0 or 1")
            fields["sharp"] = value == "1"
        else:
            raise UserError(f"bad topology '{shown}': unknown key '{key}' ({_KEYS})")
    if kind == "gpus":  # what a preset would have stated, taken by default: said in the header
        fields["assumed"] = tuple(
            text
            for key, text in (
                ("intra_eff", "intra_eff=1, the line rate (presets: NCCL's achievable NVLink fraction)"),
                ("net", "net=rail (presets: star)"),
            )
            if key not in seen
        )
    from dpcomm.topology import check_servers  # the package imports this module

    check_servers(int(fields["hosts"]) * int(fields.get("gpus", 1)), shown.strip())
    try:
        return MultiGPU(**fields)
    except ValueError as exc:
        raise UserError(f"bad topology '{shown}': {exc}") from None
