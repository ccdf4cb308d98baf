"""One emulated server's program: ``make demo``, ``dpcomm validate`` and the paper reproductions on the
testbed all launch this module once per server (:func:`dpcomm.testbed.launch_workers` appends ``--nnodes N
--node-rank i --master-addr A --master-port P --nproc G``), and node 0 writes the results as JSON.

``python -m dpcomm.testbed.node train ...`` trains every schedule side by side
(:func:`dpcomm.train.compare_schedules`: one replica per schedule, interleaved iteration by iteration on the
same batches, so every schedule meets the same machine load) and writes every
:class:`~dpcomm.train.TrainResult`. The model is ``emulated:TRACE`` (:mod:`dpcomm.trace.emulated`: the
trace's layers and parameter sizes, forward and backward sleeping its times, so the gradients are real
tensors on real TCP and the cores are left to the network), the trace named by ``$DPCOMM_DEMO_TRACE``;
``--model NAME`` trains a zoo model instead (real compute: what ``--compile BACKEND`` compiles).
Besides ``dpcomm train``'s schedules it takes ``bsp:MODE:COLLECTIVE:PLANNER`` (e.g.
``bsp:lp-alg2:mst:single``): dpcomm's runtime replica with its own mode and collective, so the LP paper's
BSP algorithms under every collective run in one launch (``dpcomm train`` gives one ``--mode`` and
``--collective`` to every schedule of a run).

``python -m dpcomm.testbed.node allreduce --algorithms nccl-ring:1,hierarchical --sizes 4MB ...`` times
the multi-GPU all-reduces of :mod:`dpcomm.testbed.gpu_allreduce` on the ``G`` ranks per server (``--nproc``),
each size and algorithm ``--iters`` times after a warm-up, a barrier before every call, the slowest rank's
seconds per call (:func:`dpcomm.timing.time_calls`), and checks every result exactly.

The emulated model and the ``bsp`` kind are registered when this module is the program's main module: the
training workers are spawned processes, which import their parent's main module (this one, run with
``python -m``) before they run, so they know them too; importing it elsewhere registers nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

__all__ = ["BSP_KIND", "ENV_TRACE", "check_bsp", "main", "parse_bsp", "register_bsp", "register_emulated"]

ENV_TRACE = "DPCOMM_DEMO_TRACE"
"""Names the shipped trace (or trace file) whose emulated model the ``train`` action trains."""
BSP_KIND = "bsp"


def register_emulated(spec: str) -> str:
    """Add ``emulated:SPEC`` to the model zoo (idempotent); returns the model name."""
    from dpcomm.models import MODELS, ModelSpec
    from dpcomm.trace.emulated import PREFIX, emulated_model
    from dpcomm.trace.format import load_trace
    from dpcomm.trace.shipped import find_trace

    spec = spec.removeprefix(PREFIX)
    name = PREFIX + spec
    if name not in MODELS:
        trace = load_trace(spec) if os.path.isfile(spec) else find_trace(spec)
        MODELS[name] = ModelSpec(
            name=name,
            build=lambda classes: emulated_model(trace, classes),
            input_shape=(1,),  # the emulated model reads only the batch size
            num_classes=10,
            params=max(1, sum(max(1, layer.params) for layer in trace.layers)),
            description=f"{trace.model}'s trace {spec}: its layers and sizes, compute that sleeps its times",
        )
    return name


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


def register_bsp() -> str:
    """Register the ``bsp`` replica kind (idempotent); returns its name."""
    from dpcomm.train.replica import ReplicaKind, register_kind

    register_kind(
        ReplicaKind(name=BSP_KIND, build=_build_bsp, check=check_bsp, summary="runtime with its own mode")
    )
    return BSP_KIND


def _register() -> None:
    """What the training workers need before they run (module docstring)."""
    register_bsp()
    if os.environ.get(ENV_TRACE):
        register_emulated(os.environ[ENV_TRACE])


if __name__ in ("__main__", "__mp_main__"):  # the launched program and its spawned workers
    _register()


def _parser() -> argparse.ArgumentParser:
    from dpcomm.launch import add_launch_arguments

    ap = argparse.ArgumentParser(prog="python -m dpcomm.testbed.node", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    t = sub.add_parser("train", help="train schedules side by side (compute emulated from a trace)")
    t.add_argument("--schedules", required=True, help="comma-separated, e.g. wfbp,single,bsp:lp-alg1:lp:wfbp")
    t.add_argument("--iters", type=int, required=True, help="iterations per schedule")
    t.add_argument("--collective", default="native", help="collective of the runtime schedules")
    t.add_argument("--mode", default="overlap", help="the runtime's mode (overlap, lp-alg3, ...)")
    t.add_argument("--batch-size", type=int, default=32, help="samples per worker")
    t.add_argument("--verify-iters", type=int, default=3, help="mgwfbp/optimal timed trial iterations")
    t.add_argument("--chrome-trace", default=None, help="rank 0's Chrome traces: PATH -> PATH.<schedule>")
    t.add_argument("--model", default=None, help="a zoo model (real compute) instead of the emulated trace")
    t.add_argument("--compile", default=None, metavar="BACKEND", help="ddp: torch.compile the model")
    a = sub.add_parser("allreduce", help="time multi-GPU all-reduces (dpcomm.testbed.gpu_allreduce)")
    a.add_argument("--algorithms", required=True, help="comma-separated: nccl-ring:C, hierarchical")
    a.add_argument("--sizes", required=True, help="comma-separated byte sizes, e.g. 1MB,8MB")
    a.add_argument("--iters", type=int, default=3, help="timed calls per size and algorithm")
    a.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    for p in (t, a):
        p.add_argument("--results", required=True, help="JSON file node 0 writes the results to")
        p.add_argument("--timeout", type=float, default=120.0, help="gloo timeout, s")
        p.add_argument("--nproc", type=int, default=1, help="ranks on this server")
        add_launch_arguments(p, required=True)
    return ap


def _train(args: argparse.Namespace, prog: str) -> list[dict[str, Any]] | None:
    from dpcomm.train import TrainConfig, compare_schedules

    if not os.environ.get(ENV_TRACE) and args.model is None:
        print(f"{prog}: error: ${ENV_TRACE} names no trace (and no --model is given)", file=sys.stderr)
        return None
    _register()
    cfg = TrainConfig(
        model=args.model or register_emulated(os.environ[ENV_TRACE]),
        compile=args.compile,
        data="synthetic",
        iters=args.iters,
        batch_size=args.batch_size,
        collective=args.collective,
        mode=args.mode,
        verify_iters=args.verify_iters,
        nproc=args.nproc,
        nnodes=int(args.nnodes),
        node_rank=int(args.node_rank),
        master_addr=args.master_addr,
        master_port=int(args.master_port),
        threads=1,
        timeout_s=args.timeout,
        progress=False,
        chrome_trace=args.chrome_trace,
    )
    results = compare_schedules(cfg, [s for s in args.schedules.split(",") if s])
    return [dataclasses.asdict(r) for r in results] if cfg.node_rank == 0 else []


def _allreduce_worker(algorithms: list[str], sizes: list[int], iters: int, warmup: int, gpus: int,
                      timeout_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """One rank: every (size, algorithm) timed; rank 0's list of rows (the others': empty)."""
    import statistics

    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker
    from dpcomm.testbed.gpu_allreduce import allreduce, check_sum, rank_valued
    from dpcomm.timing import slowest, time_calls

    torch.set_num_threads(1)
    rank, p = init_worker("gloo", timeout_s=timeout_s)
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        for algo in algorithms:
            x = rank_valued(n, rank)
            ok = True

            def call(algo: str = algo, x: torch.Tensor = x) -> None:
                allreduce(x, algo, gpus)

            for _ in range(warmup):
                x.copy_(rank_valued(n, rank))
                allreduce(x, algo, gpus)
                ok &= check_sum(x, p)
            times = []
            for _ in range(iters):  # refilled outside the clock: each call sums fresh inputs
                x.copy_(rank_valued(n, rank))
                times += time_calls(call, 1, barrier="each")
                ok &= check_sum(x, p)
            times = slowest(times)
            exact = torch.tensor([int(ok)])
            dist.all_reduce(exact, op=dist.ReduceOp.MIN)
            rows.append({"algorithm": algo, "bytes": nbytes, "ranks": p, "gpus_per_server": gpus,
                         "times_s": times, "time_s": statistics.median(times),
                         "exact": bool(exact.item())})  # fmt: skip
    dist.destroy_process_group()
    return rows if rank == 0 else []


def _allreduce(args: argparse.Namespace) -> list[dict[str, Any]]:
    from dpcomm.launch import launch, launch_options_from_args
    from dpcomm.testbed.gpu_allreduce import parse
    from dpcomm.utils.sizes import parse_sizes

    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for a in algorithms:
        parse(a)
    sizes = parse_sizes(args.sizes)
    opts = launch_options_from_args(args)
    out = launch(_allreduce_worker, opts, algorithms, sizes, args.iters, args.warmup, opts.nproc,
                 args.timeout)  # fmt: skip
    return out[0] if opts.node_rank == 0 else []


def main(argv: list[str] | None = None) -> int:
    from dpcomm.utils.io import atomic_write_json

    ap = _parser()
    args = ap.parse_args(argv)
    rows = _train(args, ap.prog) if args.action == "train" else _allreduce(args)
    if rows is None:
        return 2
    if int(args.node_rank) == 0:
        atomic_write_json(args.results, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
