"""Run commands inside the emulated servers: ``exec`` one, or ``launch`` one worker per server.

``launch_workers(state, argv)`` starts ``argv`` once per server, inside that server's namespace, as a
multi-node job: server ``i`` is node ``i`` of ``N``, the rendezvous is server 0's level-0 address. The
rendezvous reaches the command two ways:

- appended flags ``--nnodes N --node-rank i --master-addr A --master-port P --nproc G`` (``G``: the
  testbed's ranks per server, ``--gpus-per-server``, default 1; what
  ``dpcomm train``/``bench`` take), unless ``argv`` contains a placeholder (``{node_rank}``, ``{nnodes}``,
  ``{master_addr}``, ``{master_port}``), in which case the placeholders are filled in instead;
- environment: ``DPCOMM_NNODES``, ``DPCOMM_NODE_RANK``, ``DPCOMM_MASTER_ADDR``, ``DPCOMM_MASTER_PORT``,
  ``DPCOMM_TOPOLOGY`` and the NIC bindings ``GLOO_SOCKET_IFNAME=dpc-l0`` (the default group) and
  ``DPCOMM_BCUBE_IFACES=dpc-l0,..,dpc-l<k-1>`` (BML's level-``l`` group on NIC ``l``,
  :func:`dpcomm.collectives.bcube.make_level_groups`);
- ``DPCOMM_NETWORK``: a network file in the output folder describing one emulated link
  (:func:`dpcomm.testbed.config.link_network`), which ``lp`` and ``auto`` take as their default network;
  an existing ``DPCOMM_NETWORK`` (the caller's environment or ``env``) wins;
- ``OMP_NUM_THREADS``: this machine's cores / ranks, at least 1 (the servers share the cores; torch and
  ``dpcomm train`` take it as their thread count), or the whole cores of a server's ``--cpus`` quota;
  an existing ``OMP_NUM_THREADS`` wins.

A testbed built with ``--cpus`` runs each worker (and what ``exec`` runs) in its server's cgroup.

Each worker's stdout and stderr go to ``<out_dir>/rank<i>.out|.err``. When a worker fails, the others get
``grace_s`` to finish before they are stopped (a lost peer would otherwise leave them waiting). Workers die
with the launcher: SIGTERM or Ctrl-C stops them on the way out, and each has ``PR_SET_PDEATHSIG`` (SIGKILL)
for a launcher that is killed outright.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpcomm.costmodel.network import save_network
from dpcomm.lifecycle import die_with_parent_preexec
from dpcomm.testbed.config import link_network
from dpcomm.testbed.cpu import join_preexec
from dpcomm.testbed.shell import TestbedError, require

__all__ = ["PLACEHOLDERS", "LaunchResult", "exec_in", "launch_workers", "host_netns", "worker_env"]

PLACEHOLDERS = ("{node_rank}", "{nnodes}", "{master_addr}", "{master_port}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    """What came back from one launch."""

    returncodes: list[int]
    """Exit status per server (124: stopped at the timeout; -N: killed by signal N)."""
    out_dir: Path
    """Holds ``rank<i>.out`` and ``rank<i>.err``."""
    seconds: float
    """Wall time of the whole launch."""

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)

    def stdout(self, rank: int = 0) -> str:
        return (self.out_dir / f"rank{rank}.out").read_text()

    def stderr(self, rank: int = 0) -> str:
        return (self.out_dir / f"rank{rank}.err").read_text()


def host_netns(state: dict[str, Any], host: str | int) -> str:
    """Namespace of a server given as its index (``3``), ``h3`` or the namespace name itself."""
    return _server(state, host)["netns"]


def _server(state: dict[str, Any], host: str | int) -> dict[str, Any]:
    text = str(host)
    for srv in state["servers"]:
        if text in (str(srv["server"]), f"h{srv['server']}", srv["netns"]):
            return srv
    raise TestbedError(
        f"no server '{host}' in testbed '{state['name']}' (servers 0..{len(state['servers']) - 1})"
    )


def _resolve(argv: list[str]) -> list[str]:
    """``dpcomm`` runs as this interpreter's ``-m dpcomm`` unless a ``dpcomm`` is on PATH."""
    if argv and argv[0] == "dpcomm" and shutil.which("dpcomm") is None:
        return [sys.executable, "-m", "dpcomm", *argv[1:]]
    if argv and argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


def exec_in(state: dict[str, Any], host: str | int, argv: list[str]) -> int:
    """Run ``argv`` in one server's namespace with the caller's stdin/stdout; returns its exit status."""
    require()
    if not argv:
        raise TestbedError("nothing to run: give a command after --")
    srv = _server(state, host)
    cmd = ["ip", "netns", "exec", srv["netns"], *_resolve(argv)]
    return subprocess.call(cmd, preexec_fn=join_preexec(srv.get("cgroup")))


def _threads_per_server(state: dict[str, Any]) -> int:
    """Torch/OpenMP threads per worker: this machine's cores shared by the servers (at least 1), or the
    whole cores of the testbed's ``--cpus`` quota (at least 1). Every server is a node of its own, so a
    worker would otherwise take all the cores: 8 threads on 2 cores for ``star:4`` made ResNet-20's
    iterations 6-8x slower (docs/testbed.md, section 4)."""
    g = int(state.get("gpus") or 1)
    if state.get("cpus") is not None:
        return max(1, int(state["cpus"]) // g)
    return max(1, (os.cpu_count() or 1) // (len(state["servers"]) * g))


def worker_env(state: dict[str, Any], node_rank: int, master_port: int) -> dict[str, str]:
    """The environment variables a worker on server ``node_rank`` gets (see the module docstring)."""
    return {
        "DPCOMM_NNODES": str(len(state["servers"])),
        "DPCOMM_NODE_RANK": str(node_rank),
        "DPCOMM_MASTER_ADDR": state["master_addr"],
        "DPCOMM_MASTER_PORT": str(master_port),
        "DPCOMM_TOPOLOGY": state["topology"],
        "DPCOMM_TESTBED": state["name"],
        "GLOO_SOCKET_IFNAME": state["nic_names"][0],
        "DPCOMM_BCUBE_IFACES": ",".join(state["nic_names"]),
    }


def _argv_for(argv: list[str], state: dict[str, Any], rank: int, port: int) -> list[str]:
    values = {
        "{node_rank}": str(rank),
        "{nnodes}": str(len(state["servers"])),
        "{master_addr}": state["master_addr"],
        "{master_port}": str(port),
    }
    if any(ph in a for a in argv for ph in PLACEHOLDERS):
        out = []
        for a in argv:
            for ph, v in values.items():
                a = a.replace(ph, v)
            out.append(a)
        return out
    return [
        *argv,
        *("--nnodes", values["{nnodes}"], "--node-rank", str(rank)),
        *("--master-addr", state["master_addr"], "--master-port", str(port)),
        *("--nproc", str(int(state.get("gpus") or 1))),
    ]


def launch_workers(
    state: dict[str, Any],
    argv: list[str],
    *,
    master_port: int = 29400,
    timeout_s: float = 600.0,
    grace_s: float = 15.0,
    out_dir: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Start ``argv`` on every server (see the module docstring) and wait for all of them."""
    require()
    if not argv:
        raise TestbedError("nothing to launch: give a command after --")
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix=f"dpcomm-testbed-{state['name']}-"))
    out.mkdir(parents=True, exist_ok=True)
    network = save_network(link_network(state["rate_bps"], state["mtu"]), out / "network.json")
    procs: list[subprocess.Popen] = []
    files = []
    die_with_us = die_with_parent_preexec()  # even a kill -9 of this launcher stops every worker
    t0 = time.monotonic()
    try:
        for srv in state["servers"]:
            rank = srv["server"]
            wenv = {
                "DPCOMM_NETWORK": str(network),
                "OMP_NUM_THREADS": str(_threads_per_server(state)),
                **os.environ,
                **(env or {}),
                **worker_env(state, rank, master_port),
            }
            fo, fe = open(out / f"rank{rank}.out", "w"), open(out / f"rank{rank}.err", "w")
            files += [fo, fe]
            cmd = ["ip", "netns", "exec", srv["netns"], *_resolve(_argv_for(argv, state, rank, master_port))]
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=fo,
                    stderr=fe,
                    env=wenv,
                    start_new_session=True,
                    preexec_fn=join_preexec(srv.get("cgroup"), die_with_us),
                )
            )
        codes = _wait(procs, t0 + timeout_s, grace_s)
    finally:
        for p in procs:
            _stop(p)
        for f in files:
            f.close()
    return LaunchResult(returncodes=codes, out_dir=out, seconds=time.monotonic() - t0)


def _wait(procs: list[subprocess.Popen], deadline: float, grace_s: float) -> list[int]:
    codes: list[int | None] = [None] * len(procs)
    while True:
        for i, p in enumerate(procs):
            if codes[i] is None:
                codes[i] = p.poll()
        if all(c is not None for c in codes):
            return [int(c) for c in codes]  # type: ignore[arg-type]
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline, time.monotonic() + grace_s)
        if time.monotonic() > deadline:
            return [124 if c is None else int(c) for c in codes]
        time.sleep(0.05)


def _stop(p: subprocess.Popen) -> None:
    """Stop one worker we started, with its children (its own session, so its process group)."""
    if p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
