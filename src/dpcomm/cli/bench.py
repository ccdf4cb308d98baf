"""Time the collective algorithms on P local workers, nccl-tests style: time, algbw, busbw, check.

Example: ``dpcomm bench --nproc 4 --algos ring,lp,native --ops allreduce --sizes 64K,1M,16M --check``;
on 8 GPUs (one process each, NCCL): ``dpcomm bench --nproc 8 --device cuda --algos native,ring --check``.
Across machines as ``torchrun`` does (and as ``dpcomm testbed launch -- dpcomm bench ...`` runs it):
``--nnodes N --node-rank R --master-addr HOST0 --master-port PORT``; every machine prints the same table.
Sizes take K/M/G suffixes (powers of 1024). ``--fit net.json`` also fits alpha, beta, gamma to the rows and
writes a network file. bcube needs P = n^k (k >= 2): otherwise it is left out with a note, or an error when
it is the only algorithm asked for or ``--bcube n,k`` does not multiply out to P. Exit status 1 if any check
fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from dpcomm.errors import UserError
from dpcomm.launch import add_launch_arguments, launch_options_from_args

COMMAND = "bench"
HELP = (
    "time ring/lp/mst/be/bcube/ps/native on P local workers: time, algbw, busbw (nccl-tests), --check, --fit"
)

_DEFAULT_ALGOS = "ring,lp,mst,be,bcube,ps,native"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Numbers are read as text and checked in run(), so a bad value is one line and exit status 2.
    parser.add_argument("--nproc", required=True, metavar="P", help="local worker processes (>= 1)")
    parser.add_argument("--algos", default=_DEFAULT_ALGOS, help=f"comma-separated (default {_DEFAULT_ALGOS})")
    parser.add_argument(
        "--ops", default="allreduce,broadcast,reduce", help="comma-separated ops (default all)"
    )
    parser.add_argument(
        "--sizes",
        default=None,
        help="bytes, K/M/G = 2**10/2**20/2**30 (default one element,1K,64K,1M,16M)",
    )
    parser.add_argument("--dtype", default="float32", help="element type (default float32)")
    parser.add_argument(
        "--iters", default="5", metavar="N", help="timed calls per case, mean kept (default 5)"
    )
    parser.add_argument("--warmup", default="1", metavar="W", help="untimed calls per case first (default 1)")
    parser.add_argument(
        "--repeat", default="1", metavar="R", help="sweeps in one launch, best kept per case (default 1)"
    )
    parser.add_argument("--check", action="store_true", help="compare every result with torch.distributed's")
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument(
        "--fit", metavar="FILE", help="fit alpha, beta, gamma to the rows; write a network file"
    )
    parser.add_argument("--bcube", metavar="N,K", help="BCube(n,k) shape for bcube (default: from P)")
    parser.add_argument(
        "--block-bytes", metavar="B", help="LP block size in bytes (default: the model's optimum)"
    )
    parser.add_argument(
        "--timeout", default="120", metavar="S", help="seconds before a stuck peer fails the run"
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu (default; gloo) or cuda: one process per GPU, NCCL"
    )
    add_launch_arguments(parser)


def _int(flag: str, text: str) -> int:
    if not re.fullmatch(r"\s*-?\d+\s*", str(text)):
        raise UserError(f"{flag} must be an integer, got {text!r}")
    return int(text)


def _list(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))


def _default_sizes(dtype: str) -> str:
    """One element (4 B for float32, 8 B for float64: the smallest message of that type), then 1K..16M."""
    from dpcomm.collectives.benchmark import element_size

    return f"{element_size(dtype)},1K,64K,1M,16M"


def config_from_args(args: argparse.Namespace):
    from dpcomm.collectives.benchmark import BenchConfig
    from dpcomm.utils.sizes import parse_sizes

    bcube = None
    if args.bcube is not None:
        m = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", args.bcube)
        if not m:
            raise UserError(f"--bcube must be n,k (e.g. 3,2), got {args.bcube!r}")
        bcube = (int(m.group(1)), int(m.group(2)))
        if bcube[0] < 2 or bcube[1] < 1:
            raise UserError(f"--bcube needs n >= 2 and k >= 1, got {args.bcube!r}")
    where = launch_options_from_args(args)
    return BenchConfig(
        nproc=where.nproc,
        algos=_list(args.algos),
        ops=_list(args.ops),
        sizes=parse_sizes(args.sizes if args.sizes is not None else _default_sizes(args.dtype)),
        dtype=args.dtype,
        iters=_int("--iters", args.iters),
        warmup=_int("--warmup", args.warmup),
        repeat=_int("--repeat", args.repeat),
        check=args.check,
        bcube=bcube,
        block_bytes=None if args.block_bytes is None else _int("--block-bytes", args.block_bytes),
        timeout_s=_int("--timeout", args.timeout),
        nnodes=where.nnodes,
        node_rank=where.node_rank,
        master_addr=where.master_addr,
        master_port=where.master_port,
        progress=not args.json and sys.stderr.isatty(),
        device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dpcomm.collectives.bench_fit import fit_network
    from dpcomm.collectives.benchmark import run_bench
    from dpcomm.costmodel.network import save_network

    if args.fit:
        from dpcomm.utils.io import check_output_path

        # a folder, a missing folder or an unwritable place: one line before any worker starts
        check_output_path(args.fit, make_folders=False)
    cfg = config_from_args(args).resolved()
    if args.fit:
        from dpcomm.costmodel.collective import ALGORITHMS

        cases = len(cfg.ops) * sum(s > 0 for s in cfg.sizes) * sum(a in ALGORITHMS for a in cfg.algos)
        if cfg.world < 2 or cases < 2:
            raise UserError(
                "--fit needs --nproc >= 2 and two or more (op, size > 0, algo with a formula) cases"
            )
    width = None if sys.stdout.isatty() else 120  # a pipe or file: do not squeeze the table into 80 columns
    out, err = Console(soft_wrap=True, width=width), Console(stderr=True, soft_wrap=True)
    for note in cfg.notes:
        err.print(f"note: {note}", highlight=False)
    if not args.json:
        backend = "nccl" if cfg.device == "cuda" else "gloo"
        err.print(
            f"{cfg.world} workers ({backend}, {cfg.master_addr}), {cfg.dtype}, {len(cfg.ops)} ops x "
            f"{len(cfg.sizes)} sizes x {len(cfg.algos)} algos, {cfg.warmup} warm-up + {cfg.iters} timed "
            "calls each",
            highlight=False,
        )
    result = run_bench(cfg)
    if args.json:
        print(json.dumps([r.to_dict() for r in result.rows]))
    else:
        table = Table(title=f"dpcomm bench, P = {cfg.world}")
        for col in ("op", "algo", "bytes", "time", "algbw GB/s", "busbw GB/s", "check"):
            table.add_column(col, justify="right" if col not in ("op", "algo", "check") else "left")
        for r in result.rows:
            style = "red" if r.check == "FAIL" else None
            table.add_row(
                r.op,
                r.algo,
                f"{r.bytes:,}",
                _time(r.time_s),
                f"{r.algbw_GBps:.3f}",
                f"{r.busbw_GBps:.3f}",
                r.check,
                style=style,
            )
        out.print(table)
    if args.fit:
        name = Path(args.fit).stem or "bench-fit"
        net, reports = fit_network(result.rows, name=name, block_bytes=cfg.block_bytes)
        save_network(net, args.fit)
        con = err if args.json else out
        gbps = 1 / net.beta / 1e9 if net.beta else float("inf")
        con.print(
            f"fitted network -> {args.fit}: alpha = {net.alpha * 1e6:.2f} us, "
            f"beta = {net.beta * 1e9:.4f} ns/B ({gbps:.2f} GB/s), gamma = {net.gamma * 1e9:.4f} ns/B",
            highlight=False,
        )
        fit = Table(title="each formula against its own measurements (|predicted - measured| / measured)")
        for col in ("algo", "rows", "sets the fit", "median err", "max err", "own-fit median err"):
            fit.add_column(col)
        for rep in reports:
            fit.add_row(
                rep.algo,
                str(rep.rows),
                "yes" if rep.in_fit else "no",
                f"{rep.median_rel_err:.0%}",
                f"{rep.max_rel_err:.0%}",
                f"{rep.own_median_rel_err:.0%}",
            )
        con.print(fit)
    if result.failed:
        bad = [f"{r.op}/{r.algo}/{r.bytes}" for r in result.rows if r.check == "FAIL"]
        err.print(f"dpcomm bench: {len(bad)} check(s) FAILED: {', '.join(bad[:8])}", highlight=False)
        return 1
    return 0


def _time(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.3f} s"
