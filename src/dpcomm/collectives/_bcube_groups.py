"""The process groups of :mod:`dpcomm.collectives.bcube`: one per BCube switch domain, each optionally
bound to its own NIC (BML paper sec. 3.1: a server has one NIC per level,
and each level's traffic stays on it).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from dpcomm.errors import UserError
from dpcomm.topology.bcube import BCube
from dpcomm.utils.groups import group_timeout

__all__ = ["IFACES_ENV", "LevelGroups", "make_level_groups", "parse_interfaces"]

IFACES_ENV = "DPCOMM_BCUBE_IFACES"
"""Environment variable naming one NIC per level (``eth0,eth1``) when no ``interfaces`` are given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelGroups:
    """This rank's ``k`` switch-domain process groups; group-local rank of a member = its digit ``l``."""

    cube: BCube
    rank: int
    """This process's rank in the cube (its rank in the parent group)."""
    groups: tuple[Any, ...]
    """``groups[l]``: the process group of this rank's level-``l`` domain (``send``/``recv`` go to it)."""
    interfaces: tuple[str, ...] | None = None
    """NIC per level when the groups were bound to interfaces, else None."""

    def __post_init__(self) -> None:
        if len(self.groups) != self.cube.k:
            raise ValueError(f"need one group per level ({self.cube.k}), got {len(self.groups)}")


_BUILD_COUNT: dict[tuple, int] = {}


def parse_interfaces(interfaces: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    if interfaces is None:
        interfaces = os.environ.get(IFACES_ENV) or None
    if interfaces is None:
        return None
    if isinstance(interfaces, str):
        interfaces = interfaces.split(",")
    out = tuple(s.strip() for s in interfaces)
    if not out or not all(out):
        raise UserError(f"bcube interfaces must be non-empty names, one per level, got {interfaces!r}")
    return out


def make_level_groups(
    n: int,
    k: int,
    interfaces: list[str] | tuple[str, ...] | str | None = None,
    *,
    group: Any = None,
    timeout_s: float | None = None,
) -> LevelGroups:
    """Build the ``k`` level groups of this rank in BCube(n, k) over ``group`` (None: the default group).

    Collective over ``group``: every member calls it with the same arguments. With ``interfaces`` (one NIC
    name per level, e.g. ``["eth0", "eth1"]``) each level is a ``ProcessGroupGloo`` bound to its own
    interface (``new_group(pg_options=...)`` ignores gloo options, so the group is constructed directly on a
    prefix of the default store); otherwise the groups come from ``torch.distributed.new_group`` with the
    default backend (gloo on CPU, NCCL on GPU).
    """
    if n < 2 or k < 1:
        raise UserError(f"BCube(n,k) needs n >= 2 and k >= 1, got n={n}, k={k}")
    cube = BCube(n=n, k=k)
    ifaces = parse_interfaces(interfaces)
    if ifaces is not None and len(ifaces) != k:
        raise UserError(f"BCube({n},{k}) needs {k} interfaces (one per level), got {len(ifaces)}: {ifaces}")
    size = dist.get_world_size(group)
    if cube.size != size:
        raise UserError(f"BCube({n},{k}) has {cube.size} ranks but the group has {size}")
    me = dist.get_rank(group)
    granks = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(size))
    timeout = _timedelta(timeout_s) if timeout_s is not None else group_timeout(group)
    key = (granks, n, k, ifaces)
    build = _BUILD_COUNT[key] = _BUILD_COUNT.get(key, -1) + 1  # same count on every member: unique prefixes
    groups: list[Any] = []
    if ifaces is None and len(granks) == dist.get_world_size():
        # Every process of the job is here: create every domain in one global order (plain new_group, any
        # backend). Non-members get a placeholder back.
        for level in range(k):
            for dom in cube.level_groups(level):
                pg = dist.new_group([granks[r] for r in dom], timeout=timeout)
                if me in dom:
                    groups.append(pg)
    elif dist.get_backend(group) == "gloo":
        # Only the parent group's members are here (or each level needs its own NIC): build this rank's k
        # gloo groups directly on prefixes of the default store, as new_group does inside. (new_group's
        # use_local_synchronization names a group by a hash that counts the process's existing groups, which
        # differs between ranks that were not members of the same earlier groups, and hangs.)
        from torch.distributed import PrefixStore, ProcessGroupGloo
        from torch.distributed.distributed_c10d import _get_default_store

        for level in range(k):
            members = [granks[r] for r in cube.domain(me, level)]
            # the parent group's ranks too: two parent groups (ranks 0-7 and 1-8) can share a level domain
            # (ranks 1 and 3), and the same prefix for both read the first one's addresses (a hang)
            prefix = f"dpcomm-bcube/{list(granks)}/{build}/{n},{k}/L{level}/{members}/"
            store = PrefixStore(prefix, _get_default_store())
            opts = ProcessGroupGloo._Options()
            if timeout is not None:
                opts._timeout = timeout
            if ifaces is not None:
                opts._devices = [ProcessGroupGloo.create_device(interface=ifaces[level])]
            else:
                opts._devices = [ProcessGroupGloo.create_default_device()]
            groups.append(ProcessGroupGloo(store, cube.digit(me, level), n, opts))
    else:
        if ifaces is not None:
            raise UserError("bcube interfaces need the gloo backend")
        # Another backend on a sub-group: torch's local synchronisation (see the caveat above: only safe
        # when every member has created the same number of process groups so far).
        for level in range(k):
            members = [granks[r] for r in cube.domain(me, level)]
            groups.append(dist.new_group(members, timeout=timeout, use_local_synchronization=True))
    return LevelGroups(cube=cube, rank=me, groups=tuple(groups), interfaces=ifaces)


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)
