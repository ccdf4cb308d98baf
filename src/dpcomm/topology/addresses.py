"""The per-NIC address plan: which private IPv4 address each server NIC gets on the emulated cluster.

Each NIC level gets its own subnet of the base network, large enough for every server; server ``s`` is host
``s + 1`` in it. With the default base ``10.77.0.0/16`` and up to 253 servers the subnets are /24 and the
plan reads at a glance: level ``l`` of server ``s`` is ``10.77.l.(s+1)/24`` (``star:4``: 10.77.0.1..4;
``bcube:3,2``: 10.77.0.1..9 on level 0, 10.77.1.1..9 on level 1). These addresses only ever exist inside
the network namespaces the testbed creates.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from dpcomm.errors import UserError
from dpcomm.topology.base import Topology

__all__ = ["DEFAULT_BASE", "AddressPlan", "plan_addresses"]

DEFAULT_BASE = "10.77.0.0/16"


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressPlan:
    """Addresses of one topology in one base network."""

    topology: Topology
    base: ipaddress.IPv4Network
    prefixlen: int
    """Prefix length of each level's subnet (24 when servers <= 253 under a /16 or shorter base)."""
    _step: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_step", 2 ** (32 - self.prefixlen))

    def subnet(self, nic: int) -> ipaddress.IPv4Network:
        """The subnet of NIC level ``nic``."""
        self.topology._check_nic(nic)
        start = int(self.base.network_address) + nic * self._step
        return ipaddress.IPv4Network((start, self.prefixlen))

    def address(self, server: int, nic: int) -> ipaddress.IPv4Interface:
        """Address (with prefix) of NIC ``nic`` of ``server``."""
        self.topology._check_server(server)
        net = self.subnet(nic)
        return ipaddress.IPv4Interface((int(net.network_address) + server + 1, self.prefixlen))

    def owner(self, addr: str | ipaddress.IPv4Address) -> tuple[int, int]:
        """``(server, nic)`` of an address of the plan; a foreign address is a ``ValueError``."""
        a = int(ipaddress.IPv4Address(str(addr).split("/")[0]))
        nic, host = divmod(a - int(self.base.network_address), self._step)
        if not (0 <= nic < self.topology.nics_per_server and 1 <= host <= self.topology.servers):
            raise ValueError(f"{addr} is not an address of {self.topology.spec} in {self.base}")
        return host - 1, nic

    def table(self) -> list[tuple[int, int, str]]:
        """``(server, nic, "a.b.c.d/len")`` for every NIC, server-major."""
        return [
            (s, l, str(self.address(s, l)))
            for s in range(self.topology.servers)
            for l in range(self.topology.nics_per_server)
        ]


def plan_addresses(topology: Topology, base: str = DEFAULT_BASE) -> AddressPlan:
    """The address plan of ``topology`` in ``base``; a base too small for it is a :class:`UserError`."""
    try:
        net = ipaddress.IPv4Network(base)
    except ValueError as exc:
        raise UserError(f"bad base network '{base}': {exc}") from None
    # Host bits: room for servers + network + broadcast addresses, at least 8 (readable /24s).
    host_bits = max(8, (topology.servers + 1).bit_length())
    prefixlen = 32 - host_bits
    levels = topology.nics_per_server
    if prefixlen < net.prefixlen or levels * 2**host_bits > net.num_addresses:
        raise UserError(f"{topology.spec} needs {levels} subnets of /{prefixlen}, more than {base} holds")
    return AddressPlan(topology=topology, base=net, prefixlen=prefixlen)
