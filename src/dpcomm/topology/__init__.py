"""Cluster topologies as pure data: ``star:N``, ``fattree:k`` and ``bcube:n,k`` (BML paper, sections 2-3).

``parse_topology("bcube:3,2")`` gives a :class:`Topology` that reports servers, switches, cables, NICs per
server, BML's neighbour sets ``N_l(a)`` and routes; :func:`plan_addresses` gives every NIC its address.
The testbed (``dpcomm.testbed``) builds star and BCube topologies out of network namespaces.

A spec read from the user names at most :data:`MAX_SERVERS` servers (16,384: BML's largest study, 4,096
servers, four times over; ``fattree:40`` has 16,000, ``fattree:48`` 27,648 is refused). The limit is
checked from the numbers alone, before anything is built; the classes themselves stay formulas (a
``BCube(n=16, k=4)`` object still answers its counts).
"""

from __future__ import annotations

import re

from dpcomm.errors import UserError
from dpcomm.topology.addresses import DEFAULT_BASE, AddressPlan, plan_addresses
from dpcomm.topology.base import Hop, ServerLink, Switch, Topology
from dpcomm.topology.bcube import BCube, bcube_shape, server_digits, server_index
from dpcomm.topology.fattree import FatTree
from dpcomm.topology.multigpu import MultiGPU, is_multigpu_spec, parse_multigpu
from dpcomm.topology.star import Star

__all__ = [
    "AddressPlan",
    "BCube",
    "DEFAULT_BASE",
    "FatTree",
    "Hop",
    "KINDS",
    "MAX_SERVERS",
    "MultiGPU",
    "ServerLink",
    "Star",
    "Switch",
    "Topology",
    "bcube_shape",
    "check_servers",
    "is_multigpu_spec",
    "parse_multigpu",
    "parse_topology",
    "plan_addresses",
    "server_digits",
    "server_index",
]

KINDS = {"star": "star:N", "fattree": "fattree:k", "bcube": "bcube:n,k"}
MAX_SERVERS = 16_384
"""Most servers a topology spec may name (``dpcomm netsim``, ``simulate --topology``, the testbed)."""
_SPEC = re.compile(r"^\s*([a-z]+)\s*:\s*([0-9]+(?:\s*,\s*[0-9]+)*)\s*$")
_DIGITS = 9  # a number in a spec: at most 9 digits (int() of thousands of digits is itself slow)


def check_servers(servers: int | None, spec: str) -> None:
    """A one-line :class:`UserError` if ``spec``'s ``servers`` (None: too many to count) exceed
    :data:`MAX_SERVERS`."""
    if servers is None or servers > MAX_SERVERS:
        many = "more" if servers is None else f"{servers:,}"
        raise UserError(f"topology '{spec}' has {many} servers, more than the {MAX_SERVERS:,} dpcomm handles")


def _servers(kind: str, nums: list[int]) -> int | None:
    """Servers of a spec from its numbers alone (a BCube's ``n^k`` only once ``k`` is known to be small)."""
    if kind == "star":
        return nums[0]
    if kind == "fattree":
        return nums[0] ** 3 // 4
    n, k = nums
    if n >= 2 and k > MAX_SERVERS.bit_length():  # n^k > 2^k > MAX_SERVERS: do not compute the power
        return None
    return n**k


def parse_topology(spec: str) -> Topology:
    """Read ``star:N``, ``fattree:k`` or ``bcube:n,k`` of at most :data:`MAX_SERVERS` servers; anything else
    is a one-line :class:`UserError`."""
    m = _SPEC.match(spec or "")
    spec = spec if len(spec or "") <= 60 else f"{spec[:57]}..."  # quoted in one line, not a page
    forms = ", ".join(KINDS.values())
    if not m:
        raise UserError(f"bad topology '{spec}' (expected one of {forms})")
    parts = [x.strip() for x in m.group(2).split(",")]
    if any(len(x.lstrip("0")) > _DIGITS for x in parts):
        raise UserError(f"bad topology '{spec}': a number has more than {_DIGITS} digits")
    kind, nums = m.group(1), [int(x) for x in parts]
    arity = {"star": 1, "fattree": 1, "bcube": 2}
    if kind not in arity:
        raise UserError(f"unknown topology kind '{kind}' in '{spec}' (expected one of {forms})")
    if len(nums) != arity[kind]:
        raise UserError(f"bad topology '{spec}' (expected {KINDS[kind]})")
    check_servers(_servers(kind, nums), spec.strip())
    try:
        if kind == "star":
            return Star(n=nums[0])
        if kind == "fattree":
            return FatTree(k=nums[0])
        return BCube(n=nums[0], k=nums[1])
    except ValueError as exc:
        raise UserError(f"bad topology '{spec}': {exc}") from None
