"""Build and tear down the emulated cluster: namespaces, bridges, veth pairs, addresses, routes, tbf.

``up(config)`` makes, for a ``star:N`` or ``bcube:n,k`` topology (names in :mod:`dpcomm.testbed.names`):

1. one namespace per server and one switch namespace; loopback up; IPv6 off (no router solicitations or
   DAD packets to pollute the byte counters); reverse-path filtering off; TCP congestion control
   ``cfg.congestion_control`` in the servers (reno, not the host's default: see :mod:`dpcomm.testbed.config`)
   and ``cfg.slow_start_after_idle``;
2. one Linux bridge per switch (STP off, so ports forward at once) in the switch namespace;
3. one veth pair per server NIC: ``dpc-l<l>`` in the server, ``dpc-s<i>l<l>`` on the bridge of its switch;
4. one address per NIC from the plan of :func:`dpcomm.topology.plan_addresses` (``10.77.<l>.<i+1>/24``);
5. a tbf on both ends of every cable (see :mod:`dpcomm.testbed.config` for burst and queues), and with
   ``host_queue="fair"`` one queue per destination below each server NIC's tbf;
6. for BCube, IP forwarding in each server and one host route per non-adjacent address following
   :meth:`dpcomm.topology.BCube.route` (BCube is server-centric: servers relay, switches never meet), so any
   server reaches any address of any other, as a full-mesh gloo group and the rendezvous need;
7. with ``intra_rate_bps``, a tbf on each server's loopback, which its ``gpus`` ranks talk over;
8. with ``cpus``, one cgroup per server capped at that many cores (:mod:`dpcomm.testbed.cpu`), which
   ``launch`` and ``exec`` put the server's processes in.

``down(name)`` kills what still runs in the namespaces (processes the testbed launched), deletes every
namespace whose name starts with ``dpc-<name>-`` (``name=None``: ``dpc-``) and the state file. Deleting a
namespace deletes its bridges and veths, so this also clears the leftovers of a crashed ``up`` or ``launch``.
It removes the testbed's cgroups too.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from typing import Any

from dpcomm.testbed import names
from dpcomm.testbed.config import TestbedConfig, format_rate, host_queue_lines, lo_tbf_line, tbf_line
from dpcomm.testbed.cpu import check_controller, make_cgroups, remove_cgroups
from dpcomm.testbed.shell import TestbedError, batch, netns_list, require, run
from dpcomm.testbed.state import remove_state, save_state, saved_names, state_path
from dpcomm.topology import BCube, plan_addresses

__all__ = ["up", "down", "leftovers"]

_SYSCTL_ALL = [
    "net.ipv6.conf.all.disable_ipv6=1",
    "net.ipv6.conf.default.disable_ipv6=1",
    "net.ipv4.conf.all.rp_filter=0",
    "net.ipv4.conf.default.rp_filter=0",
]


def leftovers(name: str | None = None) -> list[str]:
    """Namespaces of the testbed ``name`` (``None``: of any testbed) that exist now."""
    pre = names.prefix(name) if name else names.PREFIX
    return sorted(ns for ns in netns_list() if ns.startswith(pre))


def _sysctl(ns: str, settings: list[str]) -> None:
    run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings])


def _set_congestion_control(ns: str, cc: str) -> None:
    """Make ``cc`` the namespace's TCP congestion control; a one-line error names what the host allows."""
    try:
        _sysctl(ns, [f"net.ipv4.tcp_congestion_control={cc}"])
    except TestbedError:
        with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as fh:
            allowed = fh.read().split()
        raise TestbedError(
            f"TCP congestion control '{cc}' cannot be set inside a namespace: the host allows "
            f"{' '.join(allowed) or 'none'} (net.ipv4.tcp_allowed_congestion_control)"
        ) from None


def up(cfg: TestbedConfig) -> dict[str, Any]:
    """Build the cluster of ``cfg`` and record it; returns the state (also saved as JSON)."""
    require()
    if leftovers(cfg.name) or state_path(cfg.name).exists():
        raise TestbedError(
            f"testbed '{cfg.name}' already exists; run `dpcomm testbed down --name {cfg.name}` first"
        )
    if cfg.cpus is not None:
        check_controller()  # before anything is built
    topo = cfg.topo
    plan = plan_addresses(topo, cfg.base)
    relay = isinstance(topo, BCube) and topo.k > 1
    sw_ns = names.switch_ns(cfg.name)
    hosts = [names.host_ns(cfg.name, s) for s in range(topo.servers)]
    try:
        for ns in [sw_ns, *hosts]:
            run(["ip", "netns", "add", ns])
            _sysctl(ns, _SYSCTL_ALL + (["net.ipv4.ip_forward=1"] if relay and ns != sw_ns else []))
            if ns != sw_ns:
                _set_congestion_control(ns, cfg.congestion_control)
                _sysctl(ns, [f"net.ipv4.tcp_slow_start_after_idle={int(cfg.slow_start_after_idle)}"])
        sw_lines = ["link set lo up"]
        for sw in topo.switches():
            br = names.bridge(sw.index)
            sw_lines += [f"link add {br} type bridge stp_state 0 mcast_snooping 0", f"link set {br} up"]
        batch("ip", sw_ns, sw_lines)
        # veth pairs, created straight into their namespaces (nothing ever appears in the host's namespace)
        batch(
            "ip",
            None,
            [
                f"link add {names.nic(l.nic)} netns {hosts[l.server]} mtu {cfg.mtu} type veth "
                f"peer name {names.port(l.server, l.nic)} netns {sw_ns} mtu {cfg.mtu}"
                for l in topo.server_links()
            ],
        )
        sw_lines, sw_tc = [], []
        for l in topo.server_links():
            p = names.port(l.server, l.nic)
            sw_lines += [f"link set {p} master {names.bridge(l.switch)}", f"link set {p} up"]
            sw_tc.append(tbf_line(p, cfg, host=False))
        batch("ip", sw_ns, sw_lines)
        batch("tc", sw_ns, sw_tc)
        # a fair host queue has one class per address of every other server
        every = [
            (d, str(plan.address(d, m).ip)) for d in range(topo.servers) for m in range(topo.nics_per_server)
        ]
        peers = [[ip for d, ip in every if d != s] for s in range(topo.servers)]
        for s, ns in enumerate(hosts):
            lines, tcs = ["link set lo up"], []
            for l in range(topo.nics_per_server):
                dev = names.nic(l)
                lines += [f"addr add {plan.address(s, l)} dev {dev}", f"link set {dev} up"]
                if cfg.host_queue == "fair":  # one frame per packet: turns of one frame (see config)
                    lines.append(f"link set dev {dev} gso_max_segs 1")
                tcs += host_queue_lines(dev, cfg, peers[s])
            if relay:
                lines += _routes(topo, plan, s)
            if cfg.intra_rate_bps is not None:  # the server's ranks talk over its loopback (config)
                tcs.append(lo_tbf_line(cfg))
            batch("ip", ns, lines)
            batch("tc", ns, tcs)
        cgroups = make_cgroups(cfg.name, topo.servers, cfg.cpus) if cfg.cpus is not None else None
    except BaseException:
        down(cfg.name)
        raise
    state = _state(cfg, plan, sw_ns, hosts, relay)
    if cgroups is not None:
        for srv, path in zip(state["servers"], cgroups, strict=True):
            srv["cgroup"] = path
    save_state(state)
    return state


def _routes(topo: BCube, plan: Any, s: int) -> list[str]:
    """Host routes of server ``s`` to every address that is not on one of its own links."""
    out = []
    for d in range(topo.servers):
        if d == s:
            continue
        first = topo.route(s, d)[0]
        for m in range(topo.nics_per_server):
            if first.next_server == d and first.nic == m:
                continue  # on-link: the level-m subnet route covers it
            via = plan.address(first.next_server, first.nic).ip
            out.append(f"route add {plan.address(d, m).ip}/32 via {via} dev {names.nic(first.nic)}")
    return out


def _state(cfg: TestbedConfig, plan: Any, sw_ns: str, hosts: list[str], relay: bool) -> dict[str, Any]:
    topo = cfg.topo
    servers = []
    for s, ns in enumerate(hosts):
        nics = [
            {
                "nic": l,
                "ifname": names.nic(l),
                "address": str(plan.address(s, l)),
                "switch": topo.switch_of(s, l),
                "bridge": names.bridge(topo.switch_of(s, l)),
                "port": names.port(s, l),
            }
            for l in range(topo.nics_per_server)
        ]
        servers.append({"server": s, "netns": ns, "nics": nics})
    return {
        "name": cfg.name,
        "topology": topo.spec,
        "rate_bps": cfg.rate_bps,
        "rate": format_rate(cfg.rate_bps),
        "mtu": cfg.mtu,
        "burst_bytes": cfg.burst,
        "queue_ms": cfg.queue_ms,
        "host_queue_bytes": cfg.host_queue_bytes,
        "host_queue": cfg.host_queue,
        "cpus": cfg.cpus,
        "gpus": cfg.gpus,
        "intra_rate_bps": cfg.intra_rate_bps,
        "flow_topology": cfg.flow_topology() if cfg.topology.strip().startswith("star") else None,
        "congestion_control": cfg.congestion_control,
        "slow_start_after_idle": cfg.slow_start_after_idle,
        "base": cfg.base,
        "relay": relay,
        "switch_netns": sw_ns,
        "master_addr": str(plan.address(0, 0).ip),
        "nic_names": [names.nic(l) for l in range(topo.nics_per_server)],
        "servers": servers,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _kill_inside(ns: str) -> int:
    """Stop processes still running in ``ns`` (workers a crashed launch left); returns how many."""
    pids = [int(p) for p in run(["ip", "netns", "pids", ns], check=False).split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            break
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(p) for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if _alive(p)]
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours still answers kill(0); it holds no namespace
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def down(name: str | None = None) -> list[str]:
    """Remove the testbed ``name`` (``None``: every testbed); returns what was removed. Idempotent.
    An empty or malformed name is an error, never "every testbed"."""
    if name is not None:
        names.check_name(name)
    require()
    removed = []
    for ns in leftovers(name):
        _kill_inside(ns)
        run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    # links with our prefix in the host's namespace should never exist; remove them if a crash left any
    pre = names.prefix(name) if name else names.PREFIX
    for line in run(["ip", "-o", "link", "show"]).splitlines():
        dev = line.split(":")[1].strip().split("@")[0]
        if dev.startswith(pre) or (name is None and dev.startswith(names.PREFIX)):
            run(["ip", "link", "del", dev], check=False)
            removed.append(dev)
    removed += remove_cgroups(name)  # after _kill_inside: a cgroup with processes cannot go
    for n in [name] if name else saved_names():
        if remove_state(n):
            removed.append(str(state_path(n)))
    return removed
