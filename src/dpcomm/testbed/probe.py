"""A self-check that runs on the emulated cluster: allreduce correctness and per-level NIC binding.

Started once per server by ``dpcomm testbed launch -- python -m dpcomm.testbed.probe`` (the launcher
appends ``--nnodes/--node-rank/--master-addr/--master-port/--nproc``). Every worker prints one JSON line:

- ``allreduce``: for each algorithm asked for (``native`` is ``torch.distributed.all_reduce``, any other name
  comes from the collective registry), whether the sum of rank-valued tensors came out exact;
- ``levels`` (BCube only, ``--level-bytes B``): for each level ``l``, the bytes each of this server's NICs
  sent while the level-``l`` process groups (bound to NIC ``l`` by ``DPCOMM_BCUBE_IFACES``) allreduced ``B``
  bytes, read from this namespace's tbf counters. The tests check that level-``l`` traffic leaves by
  NIC ``l`` only;
- ``lp_block_16MB``: the block ``lp`` picks by default for a 16 MB (2**24 bytes) allreduce on this group,
  i.e. on the network the launcher described in ``$DPCOMM_NETWORK``
  (:func:`dpcomm.testbed.config.link_network`);
- ``torch_threads``: torch's intra-op threads in this worker (``$OMP_NUM_THREADS`` from the launcher);
- ``tcp``: the established connections (local, remote address) once the level groups exist. The relay routes
  would carry a level-``l`` neighbour's traffic over NIC ``l`` whichever address a group used, so the
  binding itself shows here: a group bound to NIC ``l`` connects from and to level-``l`` addresses.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from dpcomm.launch import add_launch_arguments, launch_options_from_args
from dpcomm.utils.sizes import parse_size

__all__ = ["main", "level_groups"]


def _tx_bytes() -> dict[str, int]:
    """tbf byte counters of this namespace's devices (the worker runs inside its server's namespace)."""
    out = subprocess.run(
        ["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True, check=True
    ).stdout
    return {q["dev"]: int(q["bytes"]) for q in json.loads(out) if q.get("kind") == "tbf"}


def level_groups(topology: Any, interfaces: list[str]) -> dict[int, Any]:
    """``{level: this rank's level-l group}``, each a gloo group bound to ``interfaces[level]``.

    Uses :func:`dpcomm.collectives.bcube.make_level_groups` (BML's own groups) when it is there; otherwise
    builds the same groups the same way: a ``ProcessGroupGloo`` per switch domain, constructed directly
    on a prefix of the default store with a device on the level's NIC.
    """
    n, k = topology.n, topology.k
    try:
        from dpcomm.collectives.bcube import make_level_groups
    except ImportError:
        make_level_groups = None
    if make_level_groups is not None:
        return dict(enumerate(make_level_groups(n, k, interfaces).groups))
    import torch.distributed as dist
    from torch.distributed import PrefixStore, ProcessGroupGloo
    from torch.distributed.distributed_c10d import _get_default_store

    rank = dist.get_rank()
    mine = {}
    for level in range(k):
        members = [m for m in topology.level_groups(level) if rank in m][0]
        opts = ProcessGroupGloo._Options()
        opts._devices = [ProcessGroupGloo.create_device(interface=interfaces[level])]
        store = PrefixStore(f"dpcomm-probe/L{level}/{list(members)}/", _get_default_store())
        mine[level] = ProcessGroupGloo(store, members.index(rank), len(members), opts)
    return mine


def _tcp_peers() -> list[tuple[str, str]]:
    """``(local address, remote address)`` of the established TCP connections in this namespace."""

    def addr(hexport: str) -> str:
        h = hexport.split(":")[0]
        return ".".join(str(int(h[i : i + 2], 16)) for i in (6, 4, 2, 0))  # little-endian IPv4

    out = []
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if f[3] == "01":  # ESTABLISHED
                out.append((addr(f[1]), addr(f[2])))
    return sorted(set(out))


def _worker(algorithms: list[str], count: int, level_bytes: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker
    from dpcomm.topology import parse_topology

    t0 = time.perf_counter()
    rank, world = init_worker(timeout_s=60)
    result: dict[str, Any] = {"rank": rank, "world": world, "allreduce": {}, "seconds": {}}
    result["seconds"]["init"] = time.perf_counter() - t0
    expected = world * (world + 1) / 2  # ranks contribute 1..world: exact in float32 for small worlds
    for name in algorithms:
        t = torch.full((count,), float(rank + 1))
        if name == "native":
            dist.all_reduce(t)
        else:
            from dpcomm.collectives import get

            get(name).allreduce(t)
        result["allreduce"][name] = bool(torch.equal(t, torch.full_like(t, expected)))
    from dpcomm.collectives import get as get_algorithm

    result["lp_block_16MB"] = get_algorithm("lp").block_size(parse_size("16MB"), world, "allreduce")
    result["torch_threads"] = torch.get_num_threads()
    topo_spec = os.environ.get("DPCOMM_TOPOLOGY", "")
    if level_bytes and topo_spec.startswith("bcube"):
        topo = parse_topology(topo_spec)
        ifaces = os.environ["DPCOMM_BCUBE_IFACES"].split(",")
        t0 = time.perf_counter()
        groups = level_groups(topo, ifaces)
        result["seconds"]["level_groups"] = time.perf_counter() - t0
        result["tcp"] = _tcp_peers()
        result["levels"] = {}
        for level in range(topo.nics_per_server):
            t = torch.ones(level_bytes // 4)
            dist.all_reduce(torch.zeros(1), group=groups[level])  # connect first: setup isn't counted
            dist.barrier()
            before = _tx_bytes()
            t0 = time.perf_counter()
            dist.all_reduce(t, group=groups[level])
            after = _tx_bytes()
            result["seconds"][f"level{level}"] = time.perf_counter() - t0
            dist.barrier()
            ok = bool(torch.equal(t, torch.full_like(t, float(topo.n))))  # n members, each adds ones
            result["levels"][str(level)] = {
                "ok": ok,
                "tx": {dev: after[dev] - before.get(dev, 0) for dev in sorted(after)},
            }
    dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpcomm.testbed.probe", description=__doc__.splitlines()[0])
    add_launch_arguments(p, required=True)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--algorithms", default="native", help="comma list; native = torch.distributed")
    p.add_argument("--count", type=int, default=1000, help="elements per allreduce check")
    p.add_argument("--level-bytes", type=int, default=0, help="bytes per level-binding transfer (BCube)")
    args = p.parse_args(argv)

    from dpcomm.launch import launch

    opts = launch_options_from_args(args)
    for res in launch(_worker, opts, args.algorithms.split(","), args.count, args.level_bytes):
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
