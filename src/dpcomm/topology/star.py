"""``star:N``: N servers, one NIC each, on one non-blocking N-port switch.

This is the BML paper's Fat-Tree baseline as built on its testbed (section 4.2: "we simply use a single 40GE
switch to connect all the 9 servers ... It fully emulates the Fat-Tree network, as the network bandwidth is
non-blocking"). Every pair of servers is one switch hop apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcomm.topology.base import Hop, Switch, Topology

__all__ = ["Star"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Star(Topology):
    n: int
    """Number of servers (>= 1)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"star needs at least 1 server, got {self.n}")

    @property
    def spec(self) -> str:
        return f"star:{self.n}"

    @property
    def servers(self) -> int:
        return self.n

    @property
    def nics_per_server(self) -> int:
        return 1

    @property
    def switch_count(self) -> int:
        return 1

    @property
    def switch_link_count(self) -> int:
        return 0

    def switches(self) -> tuple[Switch, ...]:
        return (Switch(index=0, level=0, ports=self.n),)

    def switch_of(self, server: int, nic: int) -> int:
        self._check_server(server)
        self._check_nic(nic)
        return 0

    def members(self, switch: int) -> tuple[int, ...]:
        if switch != 0:
            raise ValueError(f"switch {switch} out of range 0..0 in {self.spec}")
        return tuple(range(self.n))

    def switch_links(self) -> tuple[tuple[int, int], ...]:
        return ()

    def route(self, src: int, dst: int) -> tuple[Hop, ...]:
        self._check_server(src)
        self._check_server(dst)
        return () if src == dst else (Hop(server=src, nic=0, next_server=dst),)
