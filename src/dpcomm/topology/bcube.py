"""``bcube:n,k``: the BCube(n,k) of the BML paper (section 3.1, Fig. 3).

n^k servers with k NICs each; k levels of n^(k-1) switches with n ports each (k*n^(k-1) switches in all,
i.e. k*N/n against 5*N/n for a Fat-Tree of n-port switches). A server's ID is k base-n digits
``[v_{k-1}, ..., v_1, v_0]`` and its index is ``sum(v_i * n**i)``. The level-``l`` switch of a server connects
the n servers whose IDs differ from it only in digit ``l``; those are BML's 1-hop neighbours ``N_l(a)``.
BCube switches never connect to each other: multi-hop paths are relayed by servers, correcting one digit
per hop (BCubeRouting of Guo et al., SIGCOMM 2009, from the highest digit down).

Note the BML paper's k counts levels (BCube(3,2) has 2 levels), one less than the original BCube_k notation.

Shape (:func:`bcube_shape`, used by the BML algorithm and its cost model alike): a given ``n`` and/or ``k``
is checked against ``N``; otherwise dpcomm takes the *most levels*, i.e. the least ``n >= 2`` with
``N = n^k`` and ``k >= 2`` (64 = BCube(2,6), 32 = BCube(2,5), 256 = BCube(2,8)). Why: BML's cost
``2k(n-1) alpha + 2(N-1)/(kN) beta M + (N-1)/(kN) gamma M`` is smallest there in every term (for
``N = m^(ab)``, ``(m^a - 1)/a >= m - 1`` and ``1/k`` falls with ``k``), so it is the shape the formula
prefers and the one the algorithm runs where the levels share a host (loopback). The paper's "k is
typically 2~4" is a hardware budget (NICs per server): on such a cluster give ``n,k`` explicitly. A ``N``
that is not ``n^k`` with ``k >= 2`` is refused (one level is a single switch, where BML is the P2P
parameter server ``ps``: ask for ``k = 1``); ``N = 1`` is no BCube (a one-rank collective does nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcomm.errors import UserError
from dpcomm.topology.base import Hop, Switch, Topology

__all__ = ["BCube", "bcube_shape", "server_digits", "server_index"]


def _int_root(nodes: int, k: int) -> int | None:
    """The integer ``n`` with ``n**k == nodes``, if there is one."""
    n = round(nodes ** (1.0 / k))
    for cand in (n - 1, n, n + 1):
        if cand >= 2 and cand**k == nodes:
            return cand
    return None


def bcube_shape(nodes: int, n: int | None = None, k: int | None = None) -> tuple[int, int]:
    """``(n, k)`` with ``n**k == nodes``: the given ``n`` and/or ``k`` checked, else the most levels (the
    least ``n >= 2`` with ``k >= 2``; see the module docstring for why).
    Anything else is a :class:`UserError`."""
    if (k is not None and k < 1) or (n is not None and n < 2):
        raise UserError(f"BCube(n,k) needs n >= 2 and k >= 1, got n={n}, k={k}")
    if nodes < 2:
        raise UserError(f"BCube needs at least 2 servers, got {nodes}")
    if k is not None:
        root = _int_root(nodes, k)
        if root is not None and (n is None or n == root):
            return root, k
    elif n is not None:
        levels, size = 1, n
        while size < nodes:
            levels, size = levels + 1, size * n
        if size == nodes:
            return n, levels
    else:
        for levels in range(nodes.bit_length() - 1, 1, -1):  # most levels first: k <= log2(nodes)
            root = _int_root(nodes, levels)
            if root is not None:
                return root, levels
    if n is not None and k is not None:
        want = f"{n}^{k} = {n**k}"
    else:
        want = f"n^{k}" if k is not None else f"{n}^k" if n is not None else "n^k with n >= 2, k >= 2"
    raise UserError(f"bcube needs a world size of {want}, got {nodes} (or give the shape n,k explicitly)")


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

    @property
    def size(self) -> int:
        """``N = n^k`` servers (BML's ranks)."""
        return self.n**self.k

    def digits(self, server: int) -> tuple[int, ...]:
        self._check_server(server)
        return server_digits(server, self.n, self.k)

    def digit(self, server: int, level: int) -> int:
        """Digit ``v_level`` of ``server``'s ID: its port on its level-``level`` switch."""
        return (server // self.n**level) % self.n

    def with_digit(self, server: int, level: int, value: int) -> int:
        """``server`` with digit ``level`` set to ``value``: the neighbour on that port."""
        return server + (value - self.digit(server, level)) * self.n**level

    def domain(self, server: int, level: int) -> tuple[int, ...]:
        """The ``n`` servers under ``server``'s level-``level`` switch, by digit (so also by index)."""
        return tuple(self.with_digit(server, level, v) for v in range(self.n))

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
