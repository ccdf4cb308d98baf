"""One emulated server's process for the paper reproductions on the testbed: every schedule side by side.

``benchmarks/reproduce_mgwfbp_testbed.py`` and ``benchmarks/reproduce_lp_table2.py`` start this script once
per server through :func:`dpcomm.testbed.launch_workers` (which appends ``--nnodes N --node-rank i
--master-addr A --master-port P``). It trains the model emulated from the trace file ``$DPCOMM_DEMO_TRACE``
(:func:`dpcomm.demo_node.register_emulated`: the trace's layers and sizes, compute that sleeps its times) with
:func:`dpcomm.train.compare_schedules`: one replica per schedule, interleaved iteration by iteration on the
same batches, so every schedule meets the same machine load. Node 0 writes every
:class:`~dpcomm.train.TrainResult` to ``--results`` as JSON, atomically.

Besides the planner names (``wfbp``, ``single``, ``mgwfbp``, ``optimal``) and ``ddp``, it takes
``bsp:MODE:COLLECTIVE:PLANNER`` (e.g. ``bsp:lp-alg2:mst:single``): dpcomm's runtime replica with its own mode
and collective, so the LP paper's BSP algorithms under every collective run in one launch (``dpcomm train``
gives one ``--mode`` and ``--collective`` to every schedule of a run). The kind is registered at import, so
the spawned training workers, which import this script as their main module, know it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from dpcomm.demo_node import ENV_TRACE, register_emulated
from dpcomm.train.replica import ReplicaKind, register_kind

__all__ = ["BSP_KIND", "check_bsp", "main", "parse_bsp"]

BSP_KIND = "bsp"


def parse_bsp(schedule: str) -> tuple[str, str, str]:
    """``bsp:MODE:COLLECTIVE:PLANNER`` -> ``(mode, collective, planner)`` (a UserError when malformed)."""
    from dpcomm.errors import UserError

    parts = schedule.split(":")
    if len(parts) != 4 or parts[0] != BSP_KIND:
        raise UserError(f"expected bsp:MODE:COLLECTIVE:PLANNER, got {schedule!r}")
    return parts[1], parts[2], parts[3]


def check_bsp(cfg: Any, schedule: str) -> tuple[str, str, Any]:
    """The kind's check (in the parent): a known mode, collective and planner name."""
    from dpcomm.collectives import resolve
    from dpcomm.errors import UserError
    from dpcomm.planner.schedule import PlannerSchedule
    from dpcomm.runtime.bsp import MODES

    mode, collective, planner = parse_bsp(schedule)
    if mode not in MODES:
        raise UserError(f"{schedule}: unknown mode {mode!r}; choose one of: {', '.join(MODES)}")
    return mode, resolve(collective, what=schedule), PlannerSchedule.parse(planner)


def _build_bsp(ctx: Any) -> Any:
    from dpcomm.train.dp_replica import RuntimeReplica

    mode, collective, parsed = ctx.parsed
    cfg = dataclasses.replace(ctx.cfg, mode=mode, collective=collective)
    return RuntimeReplica(dataclasses.replace(ctx, cfg=cfg, parsed=parsed))


register_kind(
    ReplicaKind(name=BSP_KIND, build=_build_bsp, check=check_bsp, summary="runtime with its own mode")
)
if os.environ.get(ENV_TRACE):  # also in the spawned training workers
    register_emulated(os.environ[ENV_TRACE])


def main(argv: list[str] | None = None) -> int:
    from dpcomm.launch import add_launch_arguments
    from dpcomm.train import TrainConfig, compare_schedules
    from dpcomm.utils.io import atomic_write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", required=True, help="comma-separated: wfbp,single,bsp:lp-alg1:lp:wfbp")
    ap.add_argument("--iters", type=int, required=True, help="iterations per schedule")
    ap.add_argument("--collective", default="native", help="collective of the plain schedules")
    ap.add_argument("--verify-iters", type=int, default=3, help="mgwfbp/optimal timed trial iterations")
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
        batch_size=1,  # the emulated model reads the batch size only
        collective=args.collective,
        verify_iters=args.verify_iters,
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
