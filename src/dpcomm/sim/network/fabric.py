"""Directed links, their capacities and every server pair's route, for the flow model.

A :class:`Fabric` is the network the flow model sees: ``L`` directed links (cable ``c`` gives link ``2c``
towards the core/switch and ``2c + 1`` back, so ``link ^ 1`` is the reverse direction), a capacity per link
in wire bytes per second, and a vectorised ``routes(src, dst)`` that gives each flow's links as a row of an
``(F, H)`` array padded with -1. Topologies (specs as ``dpcomm.topology`` reads them, plus one more):

* ``star:N``: one non-blocking switch; a route is the sender's uplink and the receiver's downlink.
* ``fattree:k``: the 3-layer k-ary Fat-Tree with its real edge, aggregation and core links (Al-Fares et
  al. 2008, numbering of :class:`dpcomm.topology.FatTree`), routed by destination ("D-mod-k", the
  deterministic routing of InfiniBand fat-trees): the aggregation switch is ``dst mod k/2``, the core switch
  within its group ``(dst div k/2) mod k/2``, so distinct destinations of a pod spread over every core.
* ``bcube:n,k``: BCube with server relays; a route follows :meth:`dpcomm.topology.BCube.route` (one digit
  corrected per hop, highest level first), each hop the relay's NIC uplink and the next server's downlink.
* ``leafspine:L,H,R``: a two-tier Clos (leaf-spine) of ``L`` leaves with ``H`` servers each and ``H``
  spines, every leaf cabled once to every spine at ``rate / R``: ``R`` is the oversubscription ratio (1:
  non-blocking). Routed by destination (spine ``dst mod H``).

Every topology has at most :data:`dpcomm.topology.MAX_SERVERS` (16,384) servers, checked from the spec's
numbers before any link is built.

Overhead (:class:`Goodput`): a flow of ``x`` payload bytes/s puts ``x * fwd`` wire bytes/s on its links and
``x * ack`` on the reverse links (TCP ACKs). With MTU 1500 and an ACK per two segments (RFC 5681 sec. 4.2)
that is ``1514/1448`` and ``66/2896``: a lone flow reaches 95.6% of the rate, a flow that shares its links
with a full-rate flow the other way 93.6%: the testbed's measured ceilings (docs/testbed.md sec. 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from dpcomm.errors import UserError
from dpcomm.sim.network.gpufabric import build_multigpu
from dpcomm.topology import BCube, FatTree, MultiGPU, Star, Topology, check_servers, parse_topology
from dpcomm.topology.multigpu import is_multigpu_spec, parse_multigpu

__all__ = ["Fabric", "Goodput", "LeafSpine", "make_fabric", "parse_fabric_topology"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """Wire bytes per payload byte on a flow's own links (``fwd``) and on the reverse links (``ack``)."""

    mtu: int = 1500
    """Ethernet MTU in bytes; 0 means an ideal network (no headers, no ACKs: ``fwd = 1``, ``ack = 0``)."""
    ack_every: int = 2
    """Data segments per ACK (delayed ACKs: 2)."""

    def __post_init__(self) -> None:
        if self.mtu and self.mtu < 576 or self.ack_every < 1:
            raise UserError(f"goodput needs an MTU >= 576 (or 0: ideal) and ack_every >= 1, got {self.mtu}")

    @property
    def fwd(self) -> float:
        # 1448 payload bytes (MTU - 20 IP - 32 TCP with timestamps) per MTU + 14 Ethernet bytes on the wire
        return 1.0 if not self.mtu else (self.mtu + 14) / (self.mtu - 52)

    @property
    def ack(self) -> float:
        # one 66-byte ACK frame (14 Ethernet + 20 IP + 32 TCP) per ack_every segments
        return 0.0 if not self.mtu else 66 / (self.ack_every * (self.mtu - 52))

    @property
    def one_way(self) -> float:
        """Payload fraction of the rate one flow gets alone (0.956 at MTU 1500)."""
        return 1 / self.fwd

    @property
    def duplex(self) -> float:
        """Payload fraction when a full-rate flow runs the other way too (0.936 at MTU 1500)."""
        return 1 / (self.fwd + self.ack)


IDEAL = Goodput(mtu=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafSpine:
    """``leafspine:L,H,R``: ``L`` leaves of ``H`` servers, ``H`` spines, uplinks at ``rate / R``."""

    leaves: int
    per_leaf: int
    ratio: float
    """Oversubscription: a leaf's server bandwidth over its uplink bandwidth."""

    def __post_init__(self) -> None:
        if self.leaves < 1 or self.per_leaf < 1 or not self.ratio > 0:
            raise ValueError(
                f"leafspine needs L >= 1, H >= 1, R > 0, got {self.leaves},{self.per_leaf},{self.ratio}"
            )

    @property
    def spec(self) -> str:
        return f"leafspine:{self.leaves},{self.per_leaf},{self.ratio:g}"

    @property
    def servers(self) -> int:
        return self.leaves * self.per_leaf

    @property
    def switch_count(self) -> int:
        return self.leaves + self.per_leaf


_LEAFSPINE = re.compile(
    r"^\s*leafspine\s*:\s*(\d{1,9})\s*,\s*(\d{1,9})\s*(?:,\s*(\d{1,9}(?:\.\d{1,9})?)\s*)?$"
)


def parse_fabric_topology(spec: str) -> Topology | LeafSpine | MultiGPU:
    """``star:N``, ``fattree:k``, ``bcube:n,k`` (:func:`dpcomm.topology.parse_topology`),
    ``leafspine:L,H[,R]`` or a multi-GPU spec (``gpus:S,G,...``, ``dgx-h100:S``:
    :func:`dpcomm.topology.parse_multigpu`); anything else is a one-line :class:`UserError`."""
    if is_multigpu_spec(spec):
        return parse_multigpu(spec)
    m = _LEAFSPINE.match(spec or "")
    if m:
        check_servers(int(m.group(1)) * int(m.group(2)), spec.strip())
        try:
            return LeafSpine(leaves=int(m.group(1)), per_leaf=int(m.group(2)), ratio=float(m.group(3) or 1))
        except ValueError as exc:
            raise UserError(f"bad topology '{spec}': {exc}") from None
    if (spec or "").strip().startswith("leafspine"):
        shown = spec if len(spec) <= 60 else f"{spec[:57]}..."
        raise UserError(f"bad topology '{shown}' (expected leafspine:L,H[,R], numbers of at most 9 digits)")
    try:
        return parse_topology(spec)
    except UserError as exc:
        from dpcomm.topology.gpu_presets import preset_names

        raise UserError(f"{exc}, or leafspine:L,H[,R], gpus:S,G,... or a preset: {preset_names()}") from None


@dataclass(slots=True, kw_only=True)
class Fabric:
    """Directed links with capacities and a vectorised router (see the module docstring)."""

    topology: Topology | LeafSpine
    rate_bps: float
    """Line rate of a server link, bits/s per direction."""
    goodput: Goodput
    capacity: np.ndarray
    """Wire bytes/s of each directed link."""
    names: list[str]
    """A short name per directed link, e.g. ``s3>sw`` (server 3's uplink) or ``e0>a1``."""
    hops: int
    """Most links on any route (width of :meth:`routes`' array)."""
    _route: object = field(repr=False, default=None)

    extra: int = 0
    """Endpoints beyond the servers (ranks): a multi-GPU fabric's switches that reduce (NVLink SHARP, one
    per server; InfiniBand SHARP, one per rail), numbered from :attr:`servers` on."""

    @property
    def servers(self) -> int:
        return self.topology.servers

    @property
    def endpoints(self) -> int:
        """Ranks and switch endpoints: the range of a flow's ``src`` and ``dst``."""
        return self.topology.servers + self.extra

    @property
    def links(self) -> int:
        return len(self.capacity)

    def routes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """``(F, hops)`` link ids of each flow's path, padded with -1 (an empty row when ``src == dst``)."""
        out = self._route(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
        out[np.asarray(src) == np.asarray(dst)] = -1
        return out


def _pad(cols: list[np.ndarray], width: int, n: int) -> np.ndarray:
    out = np.full((n, width), -1, dtype=np.int64)
    for i, c in enumerate(cols):
        out[:, i] = c
    return out


def _star(t: Star, c: float) -> tuple:
    n = t.servers
    names = [x for s in range(n) for x in (f"s{s}>sw", f"sw>s{s}")]

    def route(src, dst):
        return _pad([2 * src, 2 * dst + 1], 2, len(src))

    return np.full(2 * n, c), names, 2, route


def _fattree(t: FatTree, c: float) -> tuple:
    k, h, n = t.k, t.k // 2, t.servers
    edges = k * k // 2
    ea0 = n  # cable ids: server-edge 0..n-1, edge-agg n + e*h + j, agg-core n + edges*h + (agg)*h + core
    ac0 = n + edges * h
    names = [x for s in range(n) for x in (f"s{s}>e{s // h}", f"e{s // h}>s{s}")]
    names += [
        x
        for e in range(edges)
        for j in range(h)
        for x in (f"e{e}>a{(e // h) * h + j}", f"a{(e // h) * h + j}>e{e}")
    ]
    names += [
        x
        for a in range(edges)
        for cc in range(h)
        for x in (f"a{a}>c{(a % h) * h + cc}", f"c{(a % h) * h + cc}>a{a}")
    ]

    def route(src, dst):
        es, ed = src // h, dst // h
        ps, pd = es // h, ed // h
        j = dst % h  # aggregation switch (within the pod) by destination
        core = (dst // h) % h  # core switch within aggregation group j
        up1, down1 = 2 * src, 2 * dst + 1
        up2, down2 = 2 * (ea0 + es * h + j), 2 * (ea0 + ed * h + j) + 1
        up3, down3 = 2 * (ac0 + (ps * h + j) * h + core), 2 * (ac0 + (pd * h + j) * h + core) + 1
        same_edge, same_pod = es == ed, ps == pd
        cols = [
            up1,
            np.where(same_edge, down1, up2),
            np.where(same_edge, -1, np.where(same_pod, down2, up3)),
            np.where(same_edge, -1, np.where(same_pod, down1, down3)),
            np.where(same_pod, -1, down2),
            np.where(same_pod, -1, down1),
        ]
        return _pad(cols, 6, len(src))

    return np.full(2 * (ac0 + edges * h), c), names, 6, route


def _bcube(t: BCube, c: float) -> tuple:
    n, k, servers = t.n, t.k, t.servers
    names = [x for s in range(servers) for lv in range(k) for x in (f"s{s}>L{lv}", f"L{lv}>s{s}")]

    def route(src, dst):
        cols, cur = [], src.copy()
        for level in reversed(range(k)):  # BCubeRouting: correct the highest differing digit first
            place = n**level
            want, have = (dst // place) % n, (cur // place) % n
            moves = want != have
            nxt = cur + (want - have) * place
            cols += [
                np.where(moves, 2 * (cur * k + level), -1),
                np.where(moves, 2 * (nxt * k + level) + 1, -1),
            ]
            cur = nxt
        return _pad(cols, 2 * k, len(src))

    return np.full(2 * servers * k, c), names, 2 * k, route


def _leafspine(t: LeafSpine, c: float) -> tuple:
    n, h = t.servers, t.per_leaf
    up0 = n  # cables: server-leaf 0..n-1, leaf-spine n + leaf*h + spine
    names = [x for s in range(n) for x in (f"s{s}>l{s // h}", f"l{s // h}>s{s}")]
    names += [x for lf in range(t.leaves) for sp in range(h) for x in (f"l{lf}>p{sp}", f"p{sp}>l{lf}")]
    cap = np.full(2 * (n + t.leaves * h), c)
    cap[2 * n :] = c / t.ratio

    def route(src, dst):
        ls, ld, sp = src // h, dst // h, dst % h
        same = ls == ld
        cols = [
            2 * src,
            np.where(same, 2 * dst + 1, 2 * (up0 + ls * h + sp)),
            np.where(same, -1, 2 * (up0 + ld * h + sp) + 1),
            np.where(same, -1, 2 * dst + 1),
        ]
        return _pad(cols, 4, len(src))

    return cap, names, 4, route


def make_fabric(
    spec: str | Topology | LeafSpine | MultiGPU, rate_bps: float, goodput: Goodput | None = None
) -> Fabric:
    """The :class:`Fabric` of a topology (spec or object) with server links of ``rate_bps`` bits/s (a
    multi-GPU spec's own ``nic=`` wins, and its fabric carries no TCP: ``goodput`` is ideal)."""
    topo = parse_fabric_topology(spec) if isinstance(spec, str) else spec
    check_servers(topo.servers, topo.spec)  # before any link is built (also for a topology object)
    if not rate_bps > 0:
        raise UserError(f"the link rate must be > 0 bit/s, got {rate_bps}")
    c = rate_bps / 8  # wire bytes/s
    if isinstance(topo, MultiGPU):  # InfiniBand and NVLink: no TCP/IP headers or ACKs
        goodput, rate_bps = IDEAL, topo.nic_bps if topo.nic_bps is not None else rate_bps
    build = {Star: _star, FatTree: _fattree, BCube: _bcube, LeafSpine: _leafspine}.get(type(topo))
    build = build_multigpu if isinstance(topo, MultiGPU) else build
    if build is None:
        raise UserError(f"no flow model for topology {topo.spec}")
    cap, names, hops, route, *extra = build(topo, c)
    return Fabric(
        extra=extra[0] if extra else 0,
        topology=topo,
        rate_bps=float(rate_bps),
        goodput=goodput if goodput is not None else Goodput(),
        capacity=cap,
        names=names,
        hops=hops,
        _route=route,
    )
