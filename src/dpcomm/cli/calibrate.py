"""Measure this machine's allreduce with P local workers, fit T_ar(M) = a + b*M, and write a network file.

Example: ``dpcomm calibrate --nproc 4 -o net.json`` (then ``dpcomm plan --network net.json ...``).
Sizes take K/M/G suffixes (powers of 1024): ``--sizes 4K 64K 1M``.
"""

from __future__ import annotations

import argparse
import re

from dpcomm.errors import UserError

COMMAND = "calibrate"
HELP = "time real allreduce on P local workers, fit a + b*M (R^2), write a network file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Numbers are read as text and checked in run(), so a bad value is one line and exit status 2.
    parser.add_argument("--nproc", required=True, metavar="P", help="local worker processes (>= 2)")
    parser.add_argument(
        "--sizes",
        nargs="+",
        metavar="S",
        help="message sizes in bytes, K/M/G suffixes = 2**10/2**20/2**30 (default 4K .. 64M, x4)",
    )
    parser.add_argument(
        "--iters", default="10", metavar="N", help="timed calls per size (median kept; default 10)"
    )
    parser.add_argument("--warmup", default="2", metavar="W", help="untimed calls per size first (default 2)")
    parser.add_argument(
        "--fit", default="relative", help="relative (least squares on relative residuals; default) or ols"
    )
    parser.add_argument("--name", default="", help="network name written into the file")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="network JSON file to write")


def _int(flag: str, text: str) -> int:
    if not re.fullmatch(r"\s*-?\d+\s*", str(text)):
        raise UserError(f"{flag} must be an integer, got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dpcomm.costmodel.calibrate import DEFAULT_SIZES, CalibrateOptions, calibrate
    from dpcomm.costmodel.network import save_network
    from dpcomm.launch import WorkerFailure
    from dpcomm.utils.io import check_output_path
    from dpcomm.utils.sizes import parse_sizes

    check_output_path(args.output, make_folders=False)
    sizes = parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES
    opts = CalibrateOptions(
        nproc=_int("--nproc", args.nproc),
        sizes=tuple(sizes),
        iters=_int("--iters", args.iters),
        warmup=_int("--warmup", args.warmup),
        fit=args.fit,
        name=args.name,
    )
    console = Console()
    console.print(
        f"timing all_reduce (gloo, 127.0.0.1): {opts.nproc} workers, "
        f"{len(set(opts.sizes))} sizes x {opts.iters} calls",
        highlight=False,
    )
    try:
        cal = calibrate(opts)
    except WorkerFailure as exc:
        console.print(f"dpcomm: calibration failed: {exc}", style="red", highlight=False)
        return 1
    path = save_network(cal.network, args.output)

    table = Table(title=f"all_reduce on {cal.nproc} workers, {cal.fit} fit")
    for col in ("bytes", "measured us", "fit us", "residual"):
        table.add_column(col, justify="right")
    for m, t in cal.points:
        fit = cal.a + cal.b * m
        table.add_row(f"{int(m):,}", f"{t * 1e6:,.1f}", f"{fit * 1e6:,.1f}", f"{(t - fit) / t:+.1%}")
    console.print(table)
    net = cal.network
    rate = f" ({1 / cal.b / 1e9:.2f} GB/s)" if cal.b > 0 else ""
    console.print(
        f"a = {cal.a * 1e6:.2f} us, b = {cal.b * 1e9:.4f} ns/byte{rate}, R^2 = {cal.r2:.4f}", highlight=False
    )
    clamped = " (fitted a < 0: clamped to 0)" if cal.a < 0 else ""
    console.print(f"ring: alpha = a/(2(N-1)) = {net.alpha * 1e6:.2f} us{clamped}", highlight=False)
    console.print(f"ring: beta = b*N/(2(N-1)) = {net.beta * 1e9:.4f} ns/byte", highlight=False)
    console.print(f'wrote {path} (measured table under allreduce_tables["{cal.nproc}"])', highlight=False)
    return 0
