"""Time allreduce algorithms across the emulated servers (one worker per server, started by ``launch``).

``python -m dpcomm.testbed.measure --algorithms ring,native --sizes 1MB,16MB`` is what
``benchmarks/testbed_allreduce.py`` launches on every server (the launcher adds the rendezvous flags). Per
algorithm and size: one warm-up call (which also builds any process groups the algorithm needs), a check
that rank-valued inputs sum exactly, then ``repeat`` timed calls, each started after a barrier and timed as
the slowest rank's wall time. Rank 0 prints one JSON line per (algorithm, size) with every repeat's time.

Bandwidths (NCCL-tests' definitions): ``algbw = S / t``; ``busbw = algbw * 2 (P-1) / P``, the bytes each rank
must send per second in a bandwidth-optimal allreduce, so busbw is directly comparable with the link rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dpcomm.launch import add_launch_arguments, launch_options_from_args
from dpcomm.utils.sizes import parse_sizes

__all__ = ["main"]


def _worker(algorithms: list[str], sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from dpcomm.collectives import get
    from dpcomm.launch import init_worker
    from dpcomm.timing import slowest, time_calls

    rank, world = init_worker(timeout_s=600)
    rows = []
    for name in algorithms:
        algo_name, options = _algorithm(name)
        algo = get(algo_name, **options)
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            t = torch.full((numel,), float(rank + 1))
            _call(algo, t)  # warm-up: connections, groups, allocations
            exact = bool(torch.equal(t, torch.full_like(t, world * (world + 1) / 2)))
            # each repeat after a barrier, timed as the slowest rank's wall time (dpcomm.timing)
            times = slowest(time_calls(lambda a=algo, x=t: _call(a, x), repeat, barrier="each"))
            rows.append(
                {"algorithm": name, "bytes": numel * 4, "world": world, "exact": exact, "seconds": times}
            )
    dist.destroy_process_group()
    return rows if rank == 0 else []


def _algorithm(spec: str) -> tuple[str, dict[str, Any]]:
    """``"lp:block_bytes=65536"`` -> ``("lp", {"block_bytes": 65536})``: options for the registry."""
    name, *opts = spec.split(":")
    options: dict[str, Any] = {}
    for opt in opts:
        key, _, value = opt.partition("=")
        options[key] = int(value) if value.isdigit() else value
    return name, options


def _call(algo: Any, t: Any) -> None:
    algo.allreduce(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpcomm.testbed.measure", description=__doc__.splitlines()[0])
    add_launch_arguments(p, required=True)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument(
        "--algorithms",
        default="native",
        help="comma list of registered collectives, e.g. ring,lp:block_bytes=65536",
    )
    p.add_argument("--sizes", default="1MB,16MB", help="comma list of sizes (e.g. 12.5MB; MB = 2**20 bytes)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)

    from dpcomm.launch import launch

    opts = launch_options_from_args(args)
    sizes = list(parse_sizes(args.sizes))
    for rows in launch(_worker, opts, args.algorithms.split(","), sizes, args.repeat):
        for row in rows:
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
