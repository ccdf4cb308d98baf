"""Names of everything the testbed creates. All of them start with ``dpc-`` so ``down`` finds leftovers.

- ``dpc-<name>-sw``: the switch namespace, holding one Linux bridge per switch and the switch-side veth ends;
- ``dpc-<name>-h<i>``: the namespace of server ``i``;
- ``dpc-l<l>``: NIC level ``l`` inside every server namespace (the same name on every server, so one
  ``GLOO_SOCKET_IFNAME`` / ``DPCOMM_BCUBE_IFACES`` fits all of them);
- ``dpc-b<j>``: the bridge of switch ``j``; ``dpc-s<i>l<l>``: its port facing NIC ``l`` of server ``i``.

Nothing is created in the host's own namespace: the host's interfaces and routes are never touched.

A testbed name is 1-8 of ``a-z0-9``, checked by :func:`check_name` (a full match: no path separators, no
trailing newline) wherever a name comes in, so no subcommand can reach outside ``dpc-<name>-`` or the state
folder.
"""

from __future__ import annotations

import re

from dpcomm.errors import UserError

__all__ = ["PREFIX", "check_name", "prefix", "switch_ns", "host_ns", "nic", "bridge", "port"]

PREFIX = "dpc-"
_NAME = re.compile(r"[a-z0-9]{1,8}")


def check_name(name: str) -> str:
    """``name`` if it is a testbed name (1-8 of a-z, 0-9), else a one-line :class:`UserError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UserError(f"bad testbed name {name!r} (1-8 characters of a-z and 0-9)")
    return name


def prefix(name: str) -> str:
    return f"{PREFIX}{check_name(name)}-"


def switch_ns(name: str) -> str:
    return f"{prefix(name)}sw"


def host_ns(name: str, server: int) -> str:
    return f"{prefix(name)}h{server}"


def nic(level: int) -> str:
    return f"{PREFIX}l{level}"


def bridge(switch: int) -> str:
    return f"{PREFIX}b{switch}"


def port(server: int, level: int) -> str:
    return f"{PREFIX}s{server}l{level}"
