"""``fattree:k``: the classic 3-layer k-ary Fat-Tree (Al-Fares et al., SIGCOMM 2008; BML paper Fig. 2).

k pods, each with k/2 edge and k/2 aggregation switches of k ports; (k/2)^2 core switches. Each edge switch
serves k/2 servers, so there are k^3/4 servers and 5k^2/4 switches (= 5*N/n with n = k ports), and
3k^3/4 cables (server-edge, edge-aggregation, aggregation-core, k^3/4 each). It is reported as data and
used for counts; the testbed emulates it the way the BML paper did, as one non-blocking switch (``star:N``).

Switch numbering: edge switches ``0..k^2/2-1`` (pod p holds ``p*k/2 ..``), then aggregation switches
``k^2/2..k^2-1`` (same order), then core switches ``k^2..5k^2/4-1``. Server ``s`` sits under edge switch
``s // (k/2)``. Aggregation switch ``j`` of a pod connects to core switches ``j*k/2 .. j*k/2 + k/2 - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcomm.topology.base import Hop, Switch, Topology

__all__ = ["FatTree"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FatTree(Topology):
    k: int
    """Switch port count and number of pods (even, >= 2)."""

    def __post_init__(self) -> None:
        if self.k < 2 or self.k % 2:
            raise ValueError(f"fattree needs an even k >= 2, got {self.k}")

    @property
    def spec(self) -> str:
        return f"fattree:{self.k}"

    @property
    def _half(self) -> int:
        return self.k // 2

    @property
    def servers(self) -> int:
        return self.k**3 // 4

    @property
    def nics_per_server(self) -> int:
        return 1

    @property
    def switch_count(self) -> int:
        return 5 * self.k**2 // 4

    @property
    def switch_link_count(self) -> int:
        return self.k**3 // 2

    def switches(self) -> tuple[Switch, ...]:
        edge_agg = self.k**2 // 2
        return tuple(
            Switch(index=i, level=0 if i < edge_agg else 1 if i < 2 * edge_agg else 2, ports=self.k)
            for i in range(self.switch_count)
        )

    def switch_of(self, server: int, nic: int) -> int:
        self._check_server(server)
        self._check_nic(nic)
        return server // self._half

    def members(self, switch: int) -> tuple[int, ...]:
        if not 0 <= switch < self.switch_count:
            raise ValueError(f"switch {switch} out of range 0..{self.switch_count - 1} in {self.spec}")
        if switch >= self.k**2 // 2:
            return ()  # aggregation and core switches have no servers
        return tuple(range(switch * self._half, (switch + 1) * self._half))

    def switch_links(self) -> tuple[tuple[int, int], ...]:
        h, edges = self._half, self.k**2 // 2
        out: list[tuple[int, int]] = []
        for pod in range(self.k):
            for e in range(h):
                for a in range(h):
                    out.append((pod * h + e, edges + pod * h + a))
        for pod in range(self.k):
            for a in range(h):
                for c in range(h):
                    out.append((edges + pod * h + a, self.k**2 + a * h + c))
        return tuple(out)

    def route(self, src: int, dst: int) -> tuple[Hop, ...]:
        """Servers do not relay in a Fat-Tree: every other server is one (multi-switch) hop away."""
        self._check_server(src)
        self._check_server(dst)
        return () if src == dst else (Hop(server=src, nic=0, next_server=dst),)
