"""Measure this machine's allreduce with P local workers, fit T_ar(M) = a + b*M, and write a network file;
or fit a cluster's own nccl-tests table to its topology.

Example: ``dpcomm calibrate --nproc 4 -o net.json`` (then ``dpcomm plan --network net.json ...``).
Sizes take K/M/G suffixes (powers of 1024): ``--sizes 4K 64K 1M``.

``dpcomm calibrate --from-nccl-tests all_reduce.log --topology dgx-h100:2 -o mycluster.json`` reads an
``all_reduce_perf`` output and fits that cluster's start-up (from its rows of 8 B to 64 KiB), and its
achievable NIC and intra-server fractions, the latency of its bandwidth-bound calls and, where the log
forced none, the algorithm that explains it best (from its rows of 64 MiB and up) on the topology
(:mod:`dpcomm.sim.network.fit`), in up to 3 size ranges where one set of values leaves a row more than 5%
off (:mod:`dpcomm.sim.network.fit_ranges`); the file then serves ``plan --network``, and ``simulate``/``netsim
--network mycluster.json --topology dgx-h100:S`` on any server count of that cluster.
"""

from __future__ import annotations

import argparse
import re

from dpcomm.errors import UserError

COMMAND = "calibrate"
ROW_FLOOR = 4096
"""Rows of at least this many bytes are held to 10% on the log they were fitted on (64 MiB and up to 5%)."""
HELP = "time allreduce on P local workers, or read a cluster's nccl-tests log; fit it; write a network file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Numbers are read as text and checked in run(), so a bad value is one line and exit status 2.
    parser.add_argument("--nproc", metavar="P", help="local worker processes (>= 2)")
    parser.add_argument(
        "--from-nccl-tests",
        metavar="LOG",
        help="fit an all_reduce_perf output instead of timing local workers (needs --topology)",
    )
    parser.add_argument(
        "--topology",
        metavar="T",
        help="with --from-nccl-tests: the cluster it ran on (dgx-h100:S, gpus:S,G,...)",
    )
    parser.add_argument(
        "--algo",
        metavar="A",
        help="with --from-nccl-tests: the algorithm that ran (default: the one the log forced, else nccl)",
    )
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
    if args.from_nccl_tests is not None:
        if args.nproc is not None:
            raise UserError("--nproc times local workers, --from-nccl-tests reads a log: give one")
        return _from_nccl_tests(args)
    if args.nproc is None:
        raise UserError("give --nproc P (time local workers) or --from-nccl-tests LOG --topology T")
    for flag in ("topology", "algo"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag} goes with --from-nccl-tests")
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


def _from_nccl_tests(args: argparse.Namespace) -> int:
    """``--from-nccl-tests LOG --topology T``: fit, print the rows, write the network file."""
    from rich.console import Console
    from rich.table import Table

    from dpcomm.costmodel.calibrate import ring_alpha_beta
    from dpcomm.costmodel.fit import fit_line
    from dpcomm.costmodel.network import Network, save_network
    from dpcomm.sim.network.algorithms import parse_algorithm
    from dpcomm.sim.network.fit import LARGE, fit_nccl_tests
    from dpcomm.sim.network.nccl_tests import read_log
    from dpcomm.utils.io import check_output_path

    check_output_path(args.output, make_folders=False)
    if args.topology is None:
        raise UserError(
            "--from-nccl-tests needs --topology (the cluster the log ran on: dgx-h100:S, gpus:S,G,...)"
        )
    if args.algo is not None:
        parse_algorithm(args.algo)
    log = read_log(args.from_nccl_tests)
    fit = fit_nccl_tests(log, args.topology, args.algo)
    p = fit.topology.servers
    line = fit_line([(n, t) for n, t in log.rows], weighting="relative") if len(log.rows) >= 2 else None
    alpha_ring, beta = ring_alpha_beta(*line.coef, p) if line is not None and p > 1 else (0.0, 0.0)
    alpha = fit.alpha_s if fit.alpha_s is not None else alpha_ring
    net = Network(
        name=args.name or f"{args.topology} (nccl-tests)",
        alpha=alpha,
        beta=max(beta, 0.0),
        source=f"dpcomm calibrate --from-nccl-tests {args.from_nccl_tests} --topology {args.topology}",
        allreduce_tables={p: tuple((float(n), t) for n, t in log.rows)} if len(log.rows) >= 2 else {},
        fabric=fit.to_dict(),
    )
    path = save_network(net, args.output)
    console = Console()
    stack = ", ".join(
        x
        for x in (
            f"NCCL {log.nccl_version}" if log.nccl_version else "NCCL version not in the log",
            log.net_plugin,
            f"network {log.network}" if log.network else None,
            f"forced {'/'.join(x for x in fit.forced if x)}" if fit.forced else None,
        )
        if x
    )
    table = Table(
        title=f"all_reduce on {args.topology} ({p} GPUs; {stack}), {fit.algorithm}: measured and fitted"
    )
    for col in ("bytes", "measured us", "model us", "fitted us", "residual", "where it misses"):
        table.add_column(col, justify="left" if col == "where it misses" else "right")
    misses = []
    for i, ((n, t, g), g0) in enumerate(zip(fit.rows, fit.model_rows, strict=True)):
        err = g / t - 1
        bound = 0.05 if n >= LARGE else 0.10 if n >= ROW_FLOOR else None
        note = ""
        if bound is not None and abs(err) > bound:
            note = (
                f"beyond {bound:.0%}: the log's time falls as size grows here"
                if any(tm > t for (_, tm, _) in fit.rows[:i])
                or any(tm < t for (_, tm, _) in fit.rows[i + 1 :])
                else f"beyond {bound:.0%}"
            )
            misses.append(n)
        elif bound is None and abs(err) > 0.10:  # not held to a bound, but said
            note = f"under {ROW_FLOOR >> 10} KiB, not held: the log's time falls as size grows here"
        table.add_row(f"{n:,}", f"{t * 1e6:,.1f}", f"{g0 * 1e6:,.1f}", f"{g * 1e6:,.1f}", f"{err:+.1%}", note)
    console.print(table)
    rest = [abs(g / t - 1) for n, t, g in fit.rows if n >= ROW_FLOOR]
    big = [abs(g / t - 1) for n, t, g in fit.rows if n >= LARGE]
    console.print(
        f"rows of {ROW_FLOOR >> 10} KiB and up: {len(rest)}, worst {max(rest, default=0):.1%} (goal 10%); "
        f"of {LARGE >> 20} MiB and up: {len(big)}, worst {max(big, default=0):.1%} (goal 5%); "
        + (f"{len(misses)} miss: {', '.join(f'{n:,} B' for n in misses)}" if misses else "none misses"),
        highlight=False,
    )
    smallest = min(n for n, _ in log.rows)
    start = (
        f"start-up {fit.startup_s * 1e6:.1f} us at {smallest:,} B = {fit.alpha_s * 1e6:.3f} us per message"
        if fit.alpha_s is not None
        else "no rows of 64 KiB or less: NCCL's latency model kept"
    )
    t = fit.topology
    scale = f"{t.lat_scale:.3g} x NCCL's" if t.lat_scale is not None else "NCCL's (or the start-up's)"
    console.print(
        f"fitted: nic_eff {t.nic_fraction:.4f}, intra_eff {t.intra_eff:.4f}; {start}; "
        f"latency of LL128/Simple calls {scale}; per-size factors on every row (model us -> fitted us)",
        highlight=False,
    )
    if t.ranges:  # one set of values left a large row more than 5% off (dpcomm.sim.network.fit_ranges)
        console.print(
            f"size ranges (as NCCL's tuner takes them; fitted, not validated): the values above below "
            f"{t.ranges[0].from_bytes:,} B, then " + "; ".join(f"from {r.text}" for r in t.ranges),
            highlight=False,
        )
    if len(fit.tried) > 1:
        rms = ", ".join(f"{k} {v:.1%}" for k, v in fit.tried.items())
        console.print(f"algorithm: {fit.algorithm}, the best fit of: {rms} (rms log error)", highlight=False)
    from dpcomm.sim.network.fit_apply import carries

    console.print(f"wrote {path} (fabric: {fit.topology.spec}); {carries(net.fabric)}", highlight=False)
    return 0
