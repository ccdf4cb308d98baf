"""Read the output of nccl-tests' ``all_reduce_perf`` (github.com/NVIDIA/nccl-tests): the measured rows,
the ranks and servers it ran on, and the algorithm and protocol if the run forced them.

A data row is ``size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong`` (the
out-of-place columns, then the in-place ones; ``root`` since nccl-tests 2.13, ``error`` instead of
``#wrong`` before it); sizes in bytes, times in microseconds, bandwidths in GB/s. Rows may carry a prefix
(``[0]``, a host name and a colon) as ``mpirun --tag-output`` writes them. The header's ``#  Rank  0 Group
0 Pid 123 on host-a device 0 [...]`` lines (``Group`` since nccl-tests 2.10) give the ranks and servers
(distinct host names);
``NCCL_ALGO set by environment to Ring`` / ``NCCL_PROTO ...`` (``NCCL_DEBUG=INFO``) or ``-x NCCL_ALGO=Ring``
on the command line echoed in the log give a forced choice; ``NCCL version 2.8.3+cuda11.2`` (printed by
rank 0 at init) gives NCCL's version, ``NET/OFI Initializing aws-ofi-nccl 1.13.2-aws`` the AWS network
plugin's, and ``Using network AWS Libfabric`` (or ``IB``, ``Socket``) the network NCCL chose. The
out-of-place time is the measurement (nccl-tests' own busbw is computed from it).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from dpcomm.errors import UserError

__all__ = ["NcclTestsLog", "parse_nccl_tests", "read_log"]

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ROW = re.compile(
    rf"^(?:\S*[:\]]\s*)?\s*(\d+)\s+(\d+)\s+([a-z0-9_]+)\s+([a-z]+)\s+(?:(-?\d+)\s+)?({_NUM})\s+({_NUM})\s+({_NUM})\s+"
    rf"(\S+)\s+({_NUM})\s+({_NUM})\s+({_NUM})\s+(\S+)\s*$"
)
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_PLUGIN = re.compile(r"NET/OFI Initializing (aws-ofi-nccl) v?([A-Za-z0-9._+-]+)")
_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")
_ENV = re.compile(r"NCCL_(ALGO|PROTO)(?:\s+set by environment to\s+|=)([A-Za-z0-9_,^]+)")
_MAX_LINES = 200_000  # a log longer than this is not one run's output
_MAX_BYTES = 64 << 20  # nor one larger than this
# NCCL_ALGO's names (any case: NCCL's ncclAlgoStr, src/init.cc: CollNetDirect, CollNetChain) -> dpcomm's
_ALGOS = {"ring": "nccl-ring", "tree": "nccl-tree", "nvls": "nccl-nvls", "nvlstree": "nccl-nvlstree",
          "collnetdirect": "nccl-collnet-direct", "collnet": "nccl-collnet",
          "collnetchain": "nccl-collnet-chain"}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsLog:
    """One ``all_reduce_perf`` run."""

    rows: tuple[tuple[int, float], ...]
    """``(bytes, seconds)`` of each size, out of place, in the order measured (one per size)."""
    ranks: int | None = None
    """Ranks the header lists (None: it lists none)."""
    hosts: int | None = None
    """Distinct host names among them."""
    algorithm: str | None = None
    """dpcomm's name of the algorithm the run forced (``nccl-ring``), None if it forced none or several."""
    protocol: str | None = None
    """The protocol the run forced (``LL``, ``LL128``, ``Simple``), None if none or several."""
    nccl_version: str | None = None
    """NCCL's version where the log prints it (``2.8.3``), else None."""
    net_plugin: str | None = None
    """The network plugin and its version where the log prints them (``aws-ofi-nccl-1.13.2-aws``)."""
    network: str | None = None
    """The network NCCL used where the log says (``AWS Libfabric``, ``IB``, ``Socket``)."""


def _single(value: str, table: dict[str, str]) -> str | None:
    """A forced choice of exactly one known element (``Ring``), else None (``Ring,Tree``, ``^LL``)."""
    if "," in value or "^" in value or ";" in value:
        return None
    return table.get(value.strip().lower())


def parse_nccl_tests(text: str, source: str = "log") -> NcclTestsLog:
    """The rows, ranks and forced choices of an ``all_reduce_perf`` output (module docstring). A text with
    no data row, a size measured twice with different times, or a time that is not a positive number is a
    one-line :class:`UserError` naming ``source`` and the line."""
    lines = text.splitlines()
    if len(lines) > _MAX_LINES:
        raise UserError(
            f"{source}: {len(lines):,} lines is not one all_reduce_perf run (at most {_MAX_LINES:,})"
        )
    rows: dict[int, float] = {}
    hosts: dict[int, str] = {}
    env: dict[str, str] = {}
    found: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        for what, pattern in (("nccl", _VERSION), ("plugin", _PLUGIN), ("network", _NETWORK)):
            if what not in found and (m := pattern.search(line)):
                found[what] = "-".join(m.groups())
        if m := _RANK.search(line):
            hosts[int(m.group(1))] = m.group(2)
            continue
        for key, value in _ENV.findall(line):
            env.setdefault(key, value)
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line.strip())
        if not m:
            continue
        size, t_us = int(m.group(1)), float(m.group(6))
        if not math.isfinite(t_us) or t_us <= 0:
            raise UserError(f"{source}, line {number}: time {m.group(6)} us is not a positive number")
        if size in rows and not math.isclose(rows[size], t_us * 1e-6, rel_tol=0.5):
            raise UserError(
                f"{source}, line {number}: {size:,} bytes measured twice ({rows[size] * 1e6:g} us)"
            )
        rows.setdefault(size, t_us * 1e-6)
    if not rows:
        raise UserError(
            f"{source}: no all_reduce_perf rows (size count type redop [root] time algbw busbw ...) in it"
        )
    algo = _single(env["ALGO"], _ALGOS) if "ALGO" in env else None
    proto = (
        _single(env["PROTO"], {"ll": "LL", "ll128": "LL128", "simple": "Simple"}) if "PROTO" in env else None
    )
    return NcclTestsLog(
        rows=tuple(sorted(rows.items())),
        ranks=len(hosts) or None,
        hosts=len(set(hosts.values())) or None,
        algorithm=algo,
        protocol=proto,
        nccl_version=found.get("nccl"),
        net_plugin=found.get("plugin"),
        network=found.get("network"),
    )


def read_log(path: str | os.PathLike) -> NcclTestsLog:
    """:func:`parse_nccl_tests` of the file at ``path`` (at most 64 MiB; a missing or unreadable file, or one
    that is not text, is a one-line :class:`UserError` naming it)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > _MAX_BYTES:
        raise UserError(f"{path}: more than {_MAX_BYTES >> 20} MiB, not one all_reduce_perf run")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (an all_reduce_perf output is text)") from None
    return parse_nccl_tests(text, source=str(path))
