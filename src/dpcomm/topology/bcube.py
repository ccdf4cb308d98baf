"""``bcube:n,k``: the BCube(n,k) of the BML paper (section 3.1, Fig. 3).

n^k servers with k NICs each; k levels of n^(k-1) switches with n ports each (k*n^(k-1) switches in all,
i.e. k*N/n against 5*N/n for a Fat-Tree of n-port switches). A server's ID is k base-n digits
``[v_{k-1}, ..., v_1, v_0]`` and its index is ``sum(v_i * n**i)``. The level-``l`` switch of a server connects
the n servers whose IDs differ from it only in digit ``l``; those are BML's 1-hop neighbours ``N_l(a)``.
BCube switches never connect to each other: multi-hop paths are relayed by servers, correcting one digit
per hop (BCubeRouting of Guo et al., SIGCOMM 2009, from the highest digit down).

Note the BML paper's k counts levels (BCube(3,2) has 2 levels), one less than the original BCube_k notation.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcomm.topology.base import Hop, Switch, Topology

__all__ = ["BCube", "server_digits", "server_index"]


def server_digits(server: int, n: int, k: int) -> tuple[int, ...]:
    """The ID ``[v_{k-1}, ..., v_0]`` of ``server`` (most significant digit first, as the paper writes it)."""
    return tuple((server // n**i) % n for i in reversed(range(k)))


def server_index(digits: tuple[int, ...] | list[int], n: int) -> int:
    """Inverse of :func:`server_digits`."""
    out = 0
    for d in digits:
        if not 0 <= d < n:
            raise ValueError(f"digit {d} out of range 0..{n - 1}")
        out = out * n + d
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class BCube(Topology):
    n: int
    """Ports per switch (>= 2)."""
    k: int
    """Levels, i.e. NICs per server (>= 1; the paper's typical value is 2..4)."""

    def __post_init__(self) -> None:
        if self.n < 2 or self.k < 1:
            raise ValueError(f"bcube needs n >= 2 and k >= 1, got n={self.n}, k={self.k}")

    @property
    def spec(self) -> str:
        return f"bcube:{self.n},{self.k}"

    @property
    def servers(self) -> int:
        return self.n**self.k

    @property
    def nics_per_server(self) -> int:
        return self.k

    @property
    def switch_count(self) -> int:
        return self.k * self.n ** (self.k - 1)

    @property
    def switch_link_count(self) -> int:
        return 0

    def digits(self, server: int) -> tuple[int, ...]:
        self._check_server(server)
        return server_digits(server, self.n, self.k)

    def switches(self) -> tuple[Switch, ...]:
        return tuple(
            Switch(index=i, level=i // self.n ** (self.k - 1), ports=self.n) for i in range(self.switch_count)
        )

    def switch_of(self, server: int, nic: int) -> int:
        self._check_server(server)
        self._check_nic(nic)
        # Drop digit `nic` from the ID: the remaining k-1 digits number the switch within its level.
        low = server % self.n**nic
        high = server // self.n ** (nic + 1)
        return nic * self.n ** (self.k - 1) + high * self.n**nic + low

    def members(self, switch: int) -> tuple[int, ...]:
        if not 0 <= switch < self.switch_count:
            raise ValueError(f"switch {switch} out of range 0..{self.switch_count - 1} in {self.spec}")
        level, within = divmod(switch, self.n ** (self.k - 1))
        low = within % self.n**level
        high = within // self.n**level
        return tuple(high * self.n ** (level + 1) + v * self.n**level + low for v in range(self.n))

    def switch_links(self) -> tuple[tuple[int, int], ...]:
        return ()

    def route(self, src: int, dst: int) -> tuple[Hop, ...]:
        """Correct the differing digits from the highest level down; each hop uses that level's NIC."""
        self._check_server(src)
        self._check_server(dst)
        hops: list[Hop] = []
        cur = src
        for level in reversed(range(self.k)):
            place = self.n**level
            want = (dst // place) % self.n
            have = (cur // place) % self.n
            if want != have:
                nxt = cur + (want - have) * place
                hops.append(Hop(server=cur, nic=level, next_server=nxt))
                cur = nxt
        return tuple(hops)
