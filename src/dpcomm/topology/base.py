"""What every topology reports: servers, switches, cables, NICs per server, BML's neighbour sets, routes.

A topology is pure data (no processes, no root). Servers are numbered ``0..servers-1``; a server's NICs are
numbered ``0..nics_per_server-1`` and, in BCube, NIC ``l`` is the server's level-``l`` port (BML paper,
section 3.1: "each server uses one interface to connect a switch from one level"). Switches are numbered
``0..switch_count-1``. The counts are formulas (so ``bcube:16,4`` with 65,536 servers answers at once); the
lists of switches and cables are built on demand and tests check they agree with the formulas.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

__all__ = ["Switch", "ServerLink", "Hop", "Topology"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch:
    """One switch: its global index, its level (BCube level, or Fat-Tree layer 0 edge / 1 aggregation /
    2 core) and its port count."""

    index: int
    level: int
    ports: int

    @property
    def name(self) -> str:
        return f"l{self.level}s{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLink:
    """One cable from NIC ``nic`` of ``server`` to ``switch``."""

    server: int
    nic: int
    switch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Hop:
    """One hop of a route: ``server`` sends out of its NIC ``nic`` to ``next_server`` (same switch)."""

    server: int
    nic: int
    next_server: int


class Topology(ABC):
    """The interface of :class:`~dpcomm.topology.star.Star`, ``FatTree`` and ``BCube``."""

    __slots__ = ()

    @property
    @abstractmethod
    def spec(self) -> str:
        """The spec string that :func:`dpcomm.topology.parse_topology` reads back, e.g. ``"bcube:3,2"``."""

    @property
    @abstractmethod
    def servers(self) -> int: ...

    @property
    @abstractmethod
    def nics_per_server(self) -> int: ...

    @property
    @abstractmethod
    def switch_count(self) -> int: ...

    @property
    @abstractmethod
    def switch_link_count(self) -> int:
        """Switch-to-switch cables (0 for star and BCube: BCube switches never connect to each other)."""

    @property
    def link_count(self) -> int:
        """All cables: one per server NIC plus the switch-to-switch ones."""
        return self.servers * self.nics_per_server + self.switch_link_count

    @abstractmethod
    def switches(self) -> tuple[Switch, ...]: ...

    @abstractmethod
    def switch_of(self, server: int, nic: int) -> int:
        """The switch that NIC ``nic`` of ``server`` is cabled to."""

    @abstractmethod
    def members(self, switch: int) -> tuple[int, ...]:
        """Servers cabled to ``switch``, ascending."""

    @abstractmethod
    def switch_links(self) -> tuple[tuple[int, int], ...]:
        """Switch-to-switch cables as ``(lower switch index, upper switch index)``."""

    @abstractmethod
    def route(self, src: int, dst: int) -> tuple[Hop, ...]:
        """The hops a packet from server ``src`` to server ``dst`` takes (empty when ``src == dst``)."""

    def server_links(self) -> tuple[ServerLink, ...]:
        return tuple(
            ServerLink(server=s, nic=l, switch=self.switch_of(s, l))
            for s in range(self.servers)
            for l in range(self.nics_per_server)
        )

    def neighbours(self, server: int, level: int) -> tuple[int, ...]:
        """BML's ``N_l(a)``: the other servers under the same level-``level`` switch as ``server``."""
        self._check_server(server)
        self._check_nic(level)
        return tuple(s for s in self.members(self.switch_of(server, level)) if s != server)

    def level_groups(self, level: int) -> tuple[tuple[int, ...], ...]:
        """Servers grouped by their level-``level`` switch: one tuple of ranks per switch, in switch order.

        These are the process groups of one BML level (each group's traffic stays on level-``level`` links).
        """
        self._check_nic(level)
        seen: dict[int, tuple[int, ...]] = {}
        for s in range(self.servers):
            sw = self.switch_of(s, level)
            if sw not in seen:
                seen[sw] = self.members(sw)
        return tuple(seen[sw] for sw in sorted(seen))

    def summary(self) -> dict[str, object]:
        """The counts, as a dict for tables and JSON."""
        return {
            "topology": self.spec,
            "servers": self.servers,
            "nics_per_server": self.nics_per_server,
            "switches": self.switch_count,
            "links": self.link_count,
        }

    def _check_server(self, server: int) -> None:
        if not 0 <= server < self.servers:
            raise ValueError(f"server {server} out of range 0..{self.servers - 1} in {self.spec}")

    def _check_nic(self, nic: int) -> None:
        if not 0 <= nic < self.nics_per_server:
            raise ValueError(f"NIC {nic} out of range 0..{self.nics_per_server - 1} in {self.spec}")
