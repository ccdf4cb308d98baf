"""Cluster topologies as pure data: ``star:N``, ``fattree:k`` and ``bcube:n,k`` (BML paper, sections 2-3).

``parse_topology("bcube:3,2")`` gives a :class:`Topology` that reports servers, switches, cables, NICs per
server, BML's neighbour sets ``N_l(a)`` and routes; :func:`plan_addresses` gives every NIC its address.
The testbed (``dpcomm.testbed``) builds star and BCube topologies out of network namespaces.
"""

from __future__ import annotations

import re

from dpcomm.errors import UserError
from dpcomm.topology.addresses import DEFAULT_BASE, AddressPlan, plan_addresses
from dpcomm.topology.base import Hop, ServerLink, Switch, Topology
from dpcomm.topology.bcube import BCube, bcube_shape, server_digits, server_index
from dpcomm.topology.fattree import FatTree
from dpcomm.topology.star import Star

__all__ = [
    "AddressPlan",
    "BCube",
    "DEFAULT_BASE",
    "FatTree",
    "Hop",
    "KINDS",
    "ServerLink",
    "Star",
    "Switch",
    "Topology",
    "bcube_shape",
    "parse_topology",
    "plan_addresses",
    "server_digits",
    "server_index",
]

KINDS = {"star": "star:N", "fattree": "fattree:k", "bcube": "bcube:n,k"}
_SPEC = re.compile(r"^\s*([a-z]+)\s*:\s*([0-9]+(?:\s*,\s*[0-9]+)*)\s*$")


def parse_topology(spec: str) -> Topology:
    """Read ``star:N``, ``fattree:k`` or ``bcube:n,k``; anything else is a one-line :class:`UserError`."""
    m = _SPEC.match(spec or "")
    forms = ", ".join(KINDS.values())
    if not m:
        raise UserError(f"bad topology '{spec}' (expected one of {forms})")
    kind, nums = m.group(1), [int(x) for x in m.group(2).split(",")]
    arity = {"star": 1, "fattree": 1, "bcube": 2}
    if kind not in arity:
        raise UserError(f"unknown topology kind '{kind}' in '{spec}' (expected one of {forms})")
    if len(nums) != arity[kind]:
        raise UserError(f"bad topology '{spec}' (expected {KINDS[kind]})")
    try:
        if kind == "star":
            return Star(n=nums[0])
        if kind == "fattree":
            return FatTree(k=nums[0])
        return BCube(n=nums[0], k=nums[1])
    except ValueError as exc:
        raise UserError(f"bad topology '{spec}': {exc}") from None
