"""What ``dpcomm testbed up`` builds: the topology, the link rate and the token-bucket (tbf) settings.

Every link is capped by a tbf on both ends (server egress and switch-port egress), so each direction of a
cable carries at most ``rate``. The tbf parameters and why:

- ``burst``: the bucket, the bytes that may leave back-to-back above the rate. It must hold at least one
  full frame (MTU + 14 B Ethernet header); beyond that a small bucket keeps the shaping close to a real wire.
  We take ``max(1 ms of line rate, 64 KiB)``: 64 KiB is one TSO/GSO super-packet of the veth, so tbf never has
  to split one (it would, at a CPU cost, with a smaller bucket), and the error it allows is one bucket per
  transfer: 64 KiB at 100 Mbit/s is 5 ms, 0.3% of a 16 MB transfer (1.3 s).
- ``latency`` (the queue): how long a frame may wait in the bucket's queue before tbf drops it; that is the
  switch-port buffer. ``queue_ms = 20`` ms (250 KB at 100 Mbit/s) lets the 8-to-1 incast of a parameter
  server on ``star:9`` queue instead of dropping most of a window, yet keeps queueing delay well below TCP's
  200 ms minimum retransmission timeout.
- the server side of a link is the server's own NIC queue. A real host never drops there: TCP Small Queues
  and the driver hold packets back until the NIC has room. tbf has no such back-pressure, and TCP may put up
  to ``tcp_limit_output_bytes`` (1 MiB) per socket into it, so a 20 ms queue would drop locally and TCP
  would cut its window for no reason (we saw 1362 drops in one 4-server ring run at 200 Mbit/s). The
  server-side queue is therefore ``host_queue_bytes`` deep (16 MiB) and only the switch ports drop.
- ``mtu``: 1500 by default, like the Ethernet the papers used. TCP then carries 1448 payload bytes per
  1514-byte frame that tbf counts, so application goodput tops out at 95.6% of ``rate``; ``--mtu 9000``
  (jumbo frames) raises that to 99.3%.
- ``congestion_control``: ``reno`` in every namespace. A namespace starts with the host's default, which on
  a cloud VM may be BBR (this one's is). BBR paces at a bandwidth it estimates from delivery samples and
  its min-RTT, which on a veth with a 9 us base RTT and a tbf bucket that lets bursts through is an
  oscillating guess; every few seconds one flow slowed for 100-300 ms, and a synchronous allreduce step
  waits for its slowest flow: ring and BE on ``star:4`` reached 86-93% of the rate at 16-64 MB under BBR and
  93-94% (97-98% of what TCP can carry) under reno, run to run within 0.2%. A cluster's Linux would run
  CUBIC, which at sub-millisecond RTTs grows its window as reno does (its "TCP-friendly region", RFC 8312
  sec. 4.2), but the kernel lets a non-initial namespace pick only a congestion control listed in the host's
  ``net.ipv4.tcp_allowed_congestion_control`` (here ``reno bbr``), and the testbed never changes the host.

- ``slow_start_after_idle``: Linux's default (on) restarts a connection from its initial window after one
  retransmission timeout (>= 200 ms) of silence. A parameter server's connections idle for most of an
  iteration and then carry a burst, so every pull began in slow start, and with a deep switch queue (whose
  delay the slow start waits out, one round trip per doubling) ``star:4`` at 20 Mbit/s pulled ResNet-20's
  parameters in 471 ms median (quartiles 344-707) against the 304 ms its back-to-back probe measured.
  Off (``testbed up --no-slow-start-after-idle``), windows survive the idle time, as on clusters tuned for
  bursty traffic; ``benchmarks/ibatch_testbed.py`` runs that way (``docs/ps.md``).
- ``host_queue``: how a server's NIC queue orders what its connections hand it. ``fifo`` (the default): one
  queue, tbf's own, where each connection's share of the link follows what it manages to put in (its
  window, its packet size), so one connection can keep most of a server's link while another waits.
  ``fair``: one queue per destination address, served round robin one frame's worth at a time (an HTB below
  the tbf, every class far above the link rate, so the tbf alone shapes and HTB only takes turns), as a
  Linux host's default ``fq_codel`` takes turns per connection (this kernel has no ``fq_codel``, ``fq`` or
  ``sfq``; it has HTB and u32 filters). The NIC also gets ``gso_max_segs 1``: a 64 KiB GSO packet is 5 ms
  of a 100 Mbit/s link (52 us at 10 Gbit/s), and TCP Small Queues keeps only a packet or two per
  connection queued, so with GSO the connection that sends the larger packets gets the larger share
  however the queue takes turns. Measured with one connection to each of two servers from a third at
  100 Mbit/s, MTU 9000, the second starting 0.1 s after the first (8 MB and 4 MB;
  ``benchmarks/testbed_host_queue.py``): the second got 37 Mbit/s with ``fifo``, with ``fair`` and GSO,
  and with ``fifo`` and no GSO; with ``fair`` and no GSO it got 49.4 Mbit/s, half the link. It did not
  remove the head start of the first worker a parameter server sends to (``docs/ps.md``, "Why ``ibatch``
  keeps a margin").
- ``gpus`` and ``intra_rate_bps``: ranks per server and the server's intra-server fabric. With ``gpus = G``
  every server runs ``G`` worker processes (``launch`` passes ``--nproc G``; rank ``r`` is process
  ``r mod G`` of server ``r div G``, as torchrun and NCCL number GPUs). They share the server's NIC, and
  talk to each other over the namespace's loopback: gloo binds every rank to its server's ``dpc-l0``
  address, and a connection to an address of the namespace's own goes through ``lo``. With
  ``intra_rate_bps`` a tbf on ``lo`` caps that traffic at the rate, both directions together (one queue:
  a shared bus, the flow model's ``loopback=RATE``, :mod:`dpcomm.topology.multigpu`); its bucket is
  ``max(1 ms of rate, 128 KiB)``, since a loopback frame is up to 64 KiB + 14 B and tbf drops a packet
  larger than its bucket (it cannot split a frame that is not GSO). Measured in a namespace with a 200mbit
  loopback tbf: one TCP flow 199.0 Mbit/s of payload, two opposite flows 198.8 together (100 each).
  :meth:`TestbedConfig.flow_topology` is the flow model's spec of the same cluster.
- ``cpus``: CPU cores per server (``--cpus``), a CFS bandwidth quota on each server's processes, so that
  each computes at the speed of a machine of its own (:mod:`dpcomm.testbed.cpu`). Default: no cap.

:func:`link_network` describes one emulated link to the cost model (``testbed launch`` hands it to every
worker as ``$DPCOMM_NETWORK``, so ``lp``'s default block and ``auto`` fit the emulated network, not 10GbE):
``beta`` = 8 / (rate x TCP ceiling) s/byte, ``alpha`` = the 10gbe preset's 45.26 us (a TCP stack's
message start-up, MG-WFBP sec. V; the testbed adds no latency of its own), ``gamma`` = 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpcomm.costmodel.network import PRESETS, Network
from dpcomm.errors import UserError
from dpcomm.testbed.names import check_name
from dpcomm.topology import DEFAULT_BASE, Topology, parse_topology

__all__ = [
    "EMULATED_KINDS",
    "HOST_QUEUES",
    "TestbedConfig",
    "format_rate",
    "host_queue_lines",
    "link_network",
    "lo_tbf_line",
    "parse_rate",
    "tbf_line",
    "tcp_ceiling",
    "tcp_duplex_ceiling",
]

EMULATED_KINDS = ("star", "bcube")
_RATE = re.compile(r"^\s*([0-9]{1,15}(?:\.[0-9]{1,15})?)\s*(bit|kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
MAX_RATE = 10**13
"""Fastest link rate read, bits/s (10 tbit: far above any NIC; tc and the flow model need a finite one)."""
_UNIT = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_CC = re.compile(r"[a-z0-9_]{1,16}")
HOST_QUEUES = ("fifo", "fair")
LOOPBACK_EFF = 0.998
"""TCP payload per byte a loopback tbf counts: 64 KiB frames with 66 header bytes, an ACK per two
(:data:`dpcomm.topology.multigpu.PRESETS` ``testbed``)."""
_UNLIMITED = "100gbit"
"""HTB class rate of the ``fair`` host queue: far above any link, so only the tbf above it shapes."""


def parse_rate(text: str) -> int:
    """``"500mbit"`` -> 500_000_000 bits/s (tc's bit units; tc's ``bps`` is *bytes*/s: refused), from 8kbit
    to :data:`MAX_RATE`; a negative or malformed rate is a one-line :class:`UserError`."""
    m = _RATE.match(text or "")
    shown = text if len(text or "") <= 60 else f"{text[:57]}..."
    if not m:
        raise UserError(
            f"bad rate '{shown}' (expected e.g. 100mbit, 1.5gbit; units bit, kbit, mbit, gbit, tbit; > 0)"
        )
    bits = int(float(m.group(1)) * _UNIT[m.group(2).lower()])
    if bits < 8_000:
        raise UserError(f"rate '{text}' is too low (at least 8kbit)")
    if bits > MAX_RATE:
        raise UserError(f"rate '{text}' is too high (at most {MAX_RATE // 10**12}tbit)")
    return bits


def format_rate(bits: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale and bits % (scale // 1000 or 1) == 0:
            value = bits / scale
            return f"{value:g}{unit}"
    return f"{bits}bit"


def tcp_ceiling(mtu: int) -> float:
    """TCP payload per byte tbf counts: ``(MTU - 20 IP - 32 TCP with timestamps) / (MTU + 14 Ethernet)``."""
    return (mtu - 52) / (mtu + 14)


def tcp_duplex_ceiling(mtu: int) -> float:
    """:func:`tcp_ceiling` where the link also carries the ACKs of a full-rate flow the other way (66 bytes
    per two segments), as in every all-reduce: 0.936 at MTU 1500 (the flow model's ``transport=tcp``)."""
    return (mtu - 52) / (mtu + 14 + 33)


def link_network(rate_bps: int, mtu: int) -> Network:
    """The cost model's view of one emulated link (see the module docstring)."""
    return Network(
        name=f"testbed {format_rate(rate_bps)} mtu {mtu}",
        alpha=PRESETS["10gbe"].alpha,
        beta=8 / (rate_bps * tcp_ceiling(mtu)),
        gamma=0.0,
        source="dpcomm testbed: beta = 8 / (tbf rate x TCP goodput per frame); alpha = the 10gbe preset's",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TestbedConfig:
    """One emulated cluster."""

    __test__ = False  # not a pytest test class

    name: str = "tb"
    """Short name (1-8 of a-z, 0-9); every namespace it creates is called ``dpc-<name>-...``."""
    topology: str = "star:4"
    """``star:N`` or ``bcube:n,k`` (``fattree:k`` is data only: the BML paper emulated it as one switch)."""
    rate_bps: int = 500_000_000
    """Link rate in bits/s, each direction of each cable."""
    mtu: int = 1500
    """MTU of every NIC and switch port, bytes."""
    queue_ms: float = 20.0
    """tbf ``latency``: the longest a frame waits in a port's queue before it is dropped, ms."""
    host_queue_bytes: int = 16 * 2**20
    """tbf ``limit`` on the server side of each link, bytes (deep: stands in for the host's back-pressure)."""
    burst_bytes: int | None = None
    """tbf bucket; None: ``max(1 ms of rate, 64 KiB)`` (see the module docstring)."""
    congestion_control: str = "reno"
    """TCP congestion control of every namespace (``net.ipv4.tcp_congestion_control``; see the module
    docstring); it must be in the host's ``net.ipv4.tcp_allowed_congestion_control``."""
    slow_start_after_idle: bool = True
    """``net.ipv4.tcp_slow_start_after_idle`` in every server: True is Linux's default (a connection idle
    for one retransmission timeout starts again from the initial window); False keeps the window, as
    clusters tuned for bursty RPC and parameter traffic set it (see the module docstring)."""
    host_queue: str = "fifo"
    """A server NIC's queue: ``fifo`` (one queue) or ``fair`` (one per destination, round robin); see the
    module docstring."""
    cpus: float | None = None
    """CPU cores each server's processes may use together (a CFS quota per server,
    :mod:`dpcomm.testbed.cpu`); None: no cap, the servers share this machine's cores."""
    base: str = DEFAULT_BASE
    """The private network the per-NIC addresses come from (only used inside the namespaces)."""
    gpus: int = 1
    """Ranks (emulated GPUs) per server, sharing its NIC(s); see the module docstring."""
    intra_rate_bps: int | None = None
    """Rate of each server's loopback (its ranks' intra-server fabric), both directions together, bits/s;
    None: loopback is not shaped."""

    def __post_init__(self) -> None:
        check_name(self.name)
        topo = parse_topology(self.topology)
        kind = self.topology.split(":")[0].strip()
        if kind not in EMULATED_KINDS:
            raise UserError(
                f"the testbed builds star:N and bcube:n,k, not '{self.topology}' "
                "(the BML paper emulated its Fat-Tree as one non-blocking switch: use star:N)"
            )
        if topo.servers > 64:
            raise UserError(f"{self.topology} has {topo.servers} servers; the testbed builds at most 64")
        if self.rate_bps < 8_000:
            raise UserError(f"rate {self.rate_bps} bit/s is too low")
        if not 576 <= self.mtu <= 65_000:
            raise UserError(f"mtu {self.mtu} out of range 576..65000")
        if not 0.1 <= self.queue_ms <= 10_000:
            raise UserError(f"queue {self.queue_ms} ms out of range 0.1..10000")
        if self.host_queue_bytes < 64 * 1024:
            raise UserError(f"host queue {self.host_queue_bytes} B is below 64 KiB")
        if self.burst_bytes is not None and self.burst_bytes < self.mtu + 14:
            raise UserError(f"burst {self.burst_bytes} B is smaller than one frame ({self.mtu + 14} B)")
        if self.host_queue not in HOST_QUEUES:
            raise UserError(f"host queue '{self.host_queue}' is not one of {', '.join(HOST_QUEUES)}")
        if self.cpus is not None:
            from dpcomm.testbed.cpu import check_cpus

            check_cpus(self.cpus, topo.servers)
        if not 1 <= self.gpus <= 16 or topo.servers * self.gpus > 64:
            raise UserError(f"--gpus-per-server {self.gpus}: 1..16 ranks per server, at most 64 ranks in all")
        if self.intra_rate_bps is not None and not 8_000 <= self.intra_rate_bps <= MAX_RATE:
            raise UserError(f"intra-server rate {self.intra_rate_bps} bit/s is outside 8kbit..10tbit")
        if not _CC.fullmatch(self.congestion_control):
            raise UserError(f"bad congestion control {self.congestion_control!r} (e.g. reno, bbr)")

    @property
    def topo(self) -> Topology:
        return parse_topology(self.topology)

    @property
    def burst(self) -> int:
        """tbf bucket in bytes."""
        if self.burst_bytes is not None:
            return self.burst_bytes
        return max(self.rate_bps // 8 // 1000, 64 * 1024, self.mtu + 14)

    @property
    def intra_burst(self) -> int:
        """The loopback tbf's bucket, bytes: ``max(1 ms of the intra rate, 128 KiB)`` (module docstring)."""
        return max((self.intra_rate_bps or 0) // 8 // 1000, 128 * 1024)

    def flow_topology(self) -> str:
        """The flow model's spec of this cluster (:mod:`dpcomm.topology.multigpu`): ``star:N`` with one rank
        per server; with ``gpus > 1`` on a star, ``gpus:N,G,loopback=RATE,...`` (an unshaped loopback is
        taken as 100 times the NIC rate). A BCube of multi-rank servers has no flow-model twin (a
        UserError)."""
        topo = self.topo
        if self.gpus == 1:
            return topo.spec
        if not self.topology.strip().startswith("star"):
            raise UserError(f"the flow model has no {self.topology} of {self.gpus}-rank servers (star only)")
        intra = self.intra_rate_bps if self.intra_rate_bps is not None else 100 * self.rate_bps
        # MTU 1500 is transport=tcp's own fraction (1448 / 1547); another MTU gives its own
        eff = "" if self.mtu == 1500 else f",nic_eff={tcp_duplex_ceiling(self.mtu):.6g}"
        return (
            f"gpus:{topo.servers},{self.gpus},loopback={intra / 1e6:g}mbit,intra_eff={LOOPBACK_EFF},nics=1,"
            f"nic={self.rate_bps / 1e6:g}mbit{eff},net=star,transport=tcp,arch=volta"
        )


def lo_tbf_line(cfg: TestbedConfig, verb: str = "replace") -> str:
    """The ``tc`` line of a server's loopback tbf (``cfg.intra_rate_bps``; one deep queue, as a host's)."""
    return (
        f"qdisc {verb} dev lo root handle 1: tbf rate {cfg.intra_rate_bps}bit burst {cfg.intra_burst} "
        f"limit {cfg.host_queue_bytes}"
    )


def tbf_line(dev: str, cfg: TestbedConfig, *, host: bool, verb: str = "replace") -> str:
    """The ``tc`` line of one link end's tbf: switch ports queue ``queue_ms``; server NICs queue
    ``host_queue_bytes``. ``verb``: ``replace`` (build) or ``change`` (a running testbed's rate)."""
    queue = f"limit {cfg.host_queue_bytes}" if host else f"latency {cfg.queue_ms}ms"
    # handle 1: is what the fair host queue's HTB hangs below; a change names no handle, so it also finds
    # the kernel-numbered root of a testbed built before handles were given
    handle = " handle 1:" if verb == "replace" else ""
    return f"qdisc {verb} dev {dev} root{handle} tbf rate {cfg.rate_bps}bit burst {cfg.burst} {queue}"


def host_queue_lines(dev: str, cfg: TestbedConfig, peers: list[str]) -> list[str]:
    """The ``tc`` lines of a server NIC's egress: its tbf, and for ``host_queue="fair"`` below it an HTB with
    one class (a ``host_queue_bytes`` bfifo) per address in ``peers`` and one for the rest (ARP), matched by
    u32 on the destination. The classes take turns ``quantum`` = one frame at a time (deficit round robin)."""
    lines = [tbf_line(dev, cfg, host=True)]
    if cfg.host_queue == "fifo":
        return lines
    frame = cfg.mtu + 14
    lines.append(f"qdisc replace dev {dev} parent 1:1 handle 2: htb default 1")
    for minor, ip in enumerate([None, *peers], start=1):  # class 2:1 (the default) takes the rest
        cls = f"2:{minor:x}"
        lines += [
            f"class add dev {dev} parent 2: classid {cls} htb rate {_UNLIMITED} quantum {frame}",
            f"qdisc add dev {dev} parent {cls} bfifo limit {cfg.host_queue_bytes}",
        ]
        if ip is not None:
            match = f"protocol ip prio 1 u32 match ip dst {ip}/32"
            lines.append(f"filter add dev {dev} parent 2: {match} flowid {cls}")
    return lines
