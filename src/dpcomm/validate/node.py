"""One emulated server's process in ``dpcomm validate``: join the job, train every schedule of a case side
by side (:func:`dpcomm.train.compare_schedules`), node 0 writes the results as JSON.

:func:`dpcomm.validate.run.run_case` starts it once per server through
:func:`dpcomm.testbed.launch_workers`. The model is ``emulated:TRACE`` (``$DPCOMM_DEMO_TRACE``), registered
in the zoo at import by :mod:`dpcomm.demo_node`, which this module imports for that reason (the spawned
training workers import this ``__main__`` module, and so that one, before they run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpcomm.demo_node import ENV_TRACE, register_emulated

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from dpcomm.launch import add_launch_arguments
    from dpcomm.train import TrainConfig, compare_schedules
    from dpcomm.utils.io import atomic_write_json

    ap = argparse.ArgumentParser(prog="python -m dpcomm.validate.node", description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", required=True, help="comma-separated dpcomm train schedules")
    ap.add_argument("--collective", default="native")
    ap.add_argument("--mode", default="overlap")
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--results", required=True, help="JSON file node 0 writes the results to")
    ap.add_argument("--timeout", type=float, default=120.0, help="gloo timeout, s")
    ap.add_argument("--nproc", type=int, default=1)
    add_launch_arguments(ap, required=True)
    args = ap.parse_args(argv)
    if not os.environ.get(ENV_TRACE):
        print(f"{ap.prog}: error: ${ENV_TRACE} names no trace", file=sys.stderr)
        return 2
    cfg = TrainConfig(
        model=register_emulated(os.environ[ENV_TRACE]),
        data="synthetic",
        iters=args.iters,
        batch_size=args.batch_size,
        collective=args.collective,
        mode=args.mode,
        nproc=args.nproc,
        nnodes=int(args.nnodes),
        node_rank=int(args.node_rank),
        master_addr=args.master_addr,
        master_port=int(args.master_port),
        threads=1,
        timeout_s=args.timeout,
        progress=False,
    )
    results = compare_schedules(cfg, [s for s in args.schedules.split(",") if s])
    if cfg.node_rank == 0:
        atomic_write_json(args.results, [dataclasses.asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
