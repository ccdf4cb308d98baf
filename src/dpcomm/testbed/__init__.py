"""An emulated cluster on one Linux machine: real TCP over rate-capped links, in network namespaces.

The BML paper (section 4.2) compares a BCube(3,2) testbed of 9 dual-NIC servers against a Fat-Tree built
as one non-blocking switch. Here each server is a network namespace, each switch a Linux bridge (all bridges
in one switch namespace), each cable a veth pair with a token-bucket filter (tbf) on both ends, so both
directions of every link carry at most the chosen rate. Nothing touches the host's own interfaces; the
addresses (``10.77.<level>.<server+1>``) exist only inside the namespaces.

- :mod:`~dpcomm.testbed.config`: :class:`TestbedConfig` (topology, rate, MTU, tbf burst and queue, ranks per
  server and their loopback's rate);
- :mod:`~dpcomm.testbed.build`: :func:`up`, :func:`down` (idempotent, removes leftovers by name prefix);
- :mod:`~dpcomm.testbed.run`: :func:`exec_in`, :func:`launch_workers` (one worker per server, ``--nproc G``);
- :mod:`~dpcomm.testbed.node`: the one per-server program (``train`` schedules side by side, or time
  ``allreduce``) that ``make demo``, ``dpcomm validate`` and the benchmarks launch;
- :mod:`~dpcomm.testbed.gpu_allreduce`: NCCL's ring with channels and the hierarchical all-reduce on
  servers of several ranks, the flow model's schedules run on gloo;
- :mod:`~dpcomm.testbed.counters`: per-link tbf byte counters; :mod:`~dpcomm.testbed.status`: the table;
- :mod:`~dpcomm.testbed.probe`: a worker that checks allreduce and per-level NIC binding;
- :mod:`~dpcomm.testbed.flows`: plain TCP connections from one server to others, timed (link sharing).

CLI: ``dpcomm testbed up|status|exec|launch|down`` (root and iproute2 needed).
"""

from __future__ import annotations

from dpcomm.testbed.build import down, leftovers, up
from dpcomm.testbed.config import TestbedConfig, format_rate, parse_rate
from dpcomm.testbed.counters import link_counters, qdiscs
from dpcomm.testbed.run import LaunchResult, exec_in, launch_workers, worker_env
from dpcomm.testbed.shell import TestbedError
from dpcomm.testbed.state import load_state

__all__ = [
    "LaunchResult",
    "TestbedConfig",
    "TestbedError",
    "down",
    "exec_in",
    "format_rate",
    "launch_workers",
    "leftovers",
    "link_counters",
    "load_state",
    "parse_rate",
    "qdiscs",
    "up",
    "worker_env",
]
