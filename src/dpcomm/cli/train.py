"""Train a zoo model on P workers with a communication plan (or PyTorch DDP) and report what it cost.

Examples::

    dpcomm train --nproc 4 --model lenet5 --data digits --epochs 8 --schedule mgwfbp
    dpcomm train --nproc 2 --model resnet20 --schedule ddp --iters 30 --json
    dpcomm train --nproc 2 --model gpt2-tiny --schedule ddp:optimal --compile inductor --compiled-autograd
    dpcomm train --nproc 2 --schedule wfbp --checkpoint ckpt --checkpoint-every 10 --iters 100 [--resume]
    dpcomm train --nproc 8 --device cuda --autocast bf16 --model gpt2 --schedule ddp:optimal  # 8 GPUs
    # on each of two machines (as torchrun):
    dpcomm train --nproc 4 --nnodes 2 --node-rank R --master-addr HOST0 --master-port 29500 ...

The library behind it is :mod:`dpcomm.train` (``train(TrainConfig(...))``); the flags are the fields of
:class:`dpcomm.train.config.TrainConfig`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

COMMAND = "train"
HELP = "train on P local (or multi-node) workers with a schedule; DDP baseline; checkpoints; --json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=1, help="workers on this machine (default 1)")
    p.add_argument("--model", default="lenet5", help="zoo model (dpcomm models; default lenet5)")
    p.add_argument(
        "--schedule",
        default="mgwfbp",
        help="wfbp, single, bucket:SIZE, mgwfbp, optimal, ddp (PyTorch DDP), ddp:PLANNER, ps:METHOD, "
        "fsdp:PLANNER (FSDP2 units: per-block, whole, per-layer, size:BYTES, optimal) or hsdp:PLANNER[:G] "
        "(HSDP, shard groups of G ranks); default mgwfbp",
    )
    p.add_argument("--collective", default="native", help="all-reduce algorithm (default native)")
    p.add_argument(
        "--mode", default="overlap", help="overlap (MG-WFBP), lp-alg1, lp-alg2, lp-alg3 (default overlap)"
    )
    n = p.add_mutually_exclusive_group()
    n.add_argument("--iters", type=int, default=None, help="total iterations (default 20)")
    n.add_argument("--epochs", type=int, default=None, help="total epochs (digits only)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per iteration (default 32)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05, momentum 0.9)")
    p.add_argument(
        "--data",
        default="synthetic",
        help="synthetic (default), digits (scikit-learn) or text (the stdlib's source as bytes; decoders)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for model, data and dropout (default 0)")
    p.add_argument("--checkpoint", metavar="DIR", default=None, help="write DIR/checkpoint.pt (rank 0)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="every K iterations")
    p.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt")
    p.add_argument("--overwrite", action="store_true", help="start afresh over an existing DIR/checkpoint.pt")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--chrome-trace", metavar="PATH", default=None, help="Chrome trace of the last iterations")
    p.add_argument(
        "--records-json",
        metavar="PATH",
        default=None,
        help="rank 0's log, records, plan, profile, all-reduce cost (JSON)",
    )
    p.add_argument("--profile-iters", type=int, default=3, help="iterations profiled before planning")
    p.add_argument(
        "--verify-iters",
        type=int,
        default=3,
        help="mgwfbp/optimal: iterations each timing the plan against single and DDP's buckets (0: off)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default) or bfloat16/bf16: parameters, gradients and activations (not with --ps)",
    )
    p.add_argument(
        "--memory",
        default=None,
        metavar="BYTES",
        help="fsdp:PLANNER: budget of unsharded parameter bytes the plan must fit (e.g. 64MB)",
    )
    p.add_argument(
        "--param-dtype",
        default=None,
        metavar="DTYPE",
        help="fsdp:/hsdp: FSDP2's MixedPrecisionPolicy param_dtype (bf16, fp16, fp32): units gathered and "
        "computed in it, priced so (default: none)",
    )
    p.add_argument(
        "--reduce-dtype",
        default=None,
        metavar="DTYPE",
        help="fsdp:/hsdp: the policy's reduce_dtype, gradients reduced in it (default: --param-dtype)",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="ddp, fsdp: schedules: torch.compile the model (BACKEND: inductor, the default, or aot_eager)",
    )
    p.add_argument(
        "--compiled-autograd",
        action="store_true",
        help="ddp, ddp:PLANNER with --compile inductor: compiled autograd (optimize_ddp=python_reducer), the "
        "all-reduces fused in the compiled backward (ddp: inductor's 25 MB buckets; ddp:PLANNER: the plan's)",
    )
    p.add_argument(
        "--probe-overlap",
        action="store_true",
        help="ddp:PLANNER: measure backward's slowdown beside all-reduces and use it in predicted_t_iter_s",
    )
    p.add_argument(
        "--replan-every",
        type=int,
        default=0,
        metavar="K",
        help="re-measure and re-plan every K steady iterations, switch on a predicted gain (0: off)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (default cores/nproc)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default; gloo) or cuda: one process per GPU, NCCL (ddp, ddp:PLANNER, fsdp:PLANNER)",
    )
    p.add_argument(
        "--autocast", default=None, metavar="DTYPE", help="bf16 or fp16: mixed precision (torch.autocast)"
    )
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        metavar="TIMEOUT",
        type=float,
        default=60.0,
        help="seconds a collective waits for a peer",
    )
    from dpcomm.launch import add_launch_arguments

    add_launch_arguments(p)
    ps = p.add_argument_group("parameter server (iBatch): shorthands for --schedule ps:METHOD[,...]")
    ps.add_argument("--ps", action="store_true", help="train with a BSP parameter server")
    ps.add_argument("--pull", default=None, help="all (default), layer, ibatch or optimal: how workers pull")
    ps.add_argument("--ps-servers", type=int, default=None, metavar="S", help="S dedicated server processes")
    ps.add_argument("--sparsify", default=None, metavar="topk:R", help="push the top R of each gradient")
    ps.add_argument(
        "--pull-mode",
        default=None,
        metavar="send|request",
        help="servers send every batch after the update (default), or each on the worker's request",
    )


PS_FLAGS = ("ps", "pull", "ps_servers", "sparsify", "pull_mode")
"""Flags that are not :class:`TrainConfig` fields: they spell the ``ps:...`` schedule (``dpcomm.ps.spec``)."""


def _ps_spec(args: argparse.Namespace):
    """The parameter-server spec the ``--ps`` flags ask for, or None without ``--ps``."""
    from dpcomm.errors import UserError

    if not args.ps:
        if any(getattr(args, f) is not None for f in PS_FLAGS[1:]):
            raise UserError("--pull, --ps-servers, --sparsify and --pull-mode need --ps")
        return None
    if args.schedule != "mgwfbp":
        raise UserError("--ps chooses the schedule: give --pull, not --schedule")
    from dpcomm.ps.spec import PsSpec, parse_sparsify

    if args.ps_servers is not None and args.ps_servers < 1:
        raise UserError(f"--ps-servers must be >= 1, got {args.ps_servers}")
    for flag, value in (
        ("--pull", args.pull),
        ("--pull-mode", args.pull_mode),
        ("--sparsify", args.sparsify),
    ):
        if value is not None and not value.strip():  # --pull= is not the default, it is a mistake
            raise UserError(f"{flag} needs a value")
    return PsSpec(
        pull=(args.pull or "all").strip().lower(),
        servers=args.ps_servers or 0,
        sparsify=parse_sparsify(args.sparsify),
        pulls=(args.pull_mode or "send").strip().lower(),
    )


def _config(args: argparse.Namespace):
    """The flags as a :class:`TrainConfig`: every field whose name is a flag's ``dest`` (``--timeout`` is
    ``timeout_s``); fields without a flag keep their defaults. The config checks its values itself."""
    from dpcomm.launch import launch_options_from_args
    from dpcomm.train.config import TrainConfig

    launch = launch_options_from_args(args)  # the multi-node flags, read and checked as bench reads them
    given = vars(args) | {f.name: getattr(launch, f.name) for f in dataclasses.fields(launch)}
    spec = _ps_spec(args)
    if spec is not None:
        given["schedule"] = spec.label()
    return TrainConfig(**{f.name: given[f.name] for f in dataclasses.fields(TrainConfig) if f.name in given})


def run(args: argparse.Namespace) -> int:
    from dpcomm.launch import WorkerFailure
    from dpcomm.train import summary_table, train

    cfg = _config(args)
    try:
        result = train(cfg)
    except WorkerFailure as exc:  # a worker died or lost a peer: not a usage error, so status 1
        print(f"dpcomm: error: training failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out = result.to_json()
        from dpcomm.train.report import predict

        sim = predict(result)  # a plan made on a profile: the simulator's t_iter on it and the fitted cost
        if sim is not None:
            out["predicted_t_iter_s"] = sim.t_iter_s
        print(json.dumps(out))
        return 0
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped output: room for the whole table
    for line in result.log:
        console.print(line, highlight=False, markup=False)
    console.print(summary_table([result], title=f"dpcomm train: {cfg.model} on {cfg.data}"))
    if result.chrome_trace:
        console.print(f"Chrome trace: {result.chrome_trace}", highlight=False)
    if cfg.checkpoint:
        console.print(f"checkpoint: {cfg.checkpoint}/checkpoint.pt (iteration {result.iterations})")
    return 0
