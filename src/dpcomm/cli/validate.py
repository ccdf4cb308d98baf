"""Measure schedules on the emulated cluster and check dpcomm's two simulators against them.

Example: ``dpcomm validate --cases r20-s4,gpt2-s4 --json val.json --plot val.png`` (root: network
namespaces). Each case (``--list`` shows them; :mod:`dpcomm.validate.cases`) is one launch on a testbed of
its own, every schedule side by side with compute emulated from a shipped trace; each schedule's
iteration is then predicted from the run's own profile by the closed form with fitted costs and by the
flow model on the testbed's topology and rate. Finished cases are kept in ``--out`` (one JSON each) and a
rerun resumes from them (``--fresh``: measure again); ``--no-run`` only reports what ``--out`` holds.
See docs/validate.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from dpcomm.errors import UserError

COMMAND = "validate"
HELP = "measure schedules on the emulated cluster and compare the closed form and the flow model with them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", metavar="C,C,..", help="cases to run, by name (default: all; see --list)")
    parser.add_argument("--quick", action="store_true", help="only the quick case(s)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument(
        "--out", default="out/validate", help="one JSON per finished case (default out/validate)"
    )
    parser.add_argument("--fresh", action="store_true", help="measure every case again, ignoring --out")
    parser.add_argument("--no-run", action="store_true", help="report the cases --out holds, run nothing")
    parser.add_argument("--json", metavar="FILE", help="write the report (rows, summary, machine) as JSON")
    parser.add_argument("--plot", metavar="PNG", help="predicted against measured, y = x and +-10%% bands")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case launch (default 900)")


def _list(console) -> int:
    from rich.table import Table

    from dpcomm.validate.cases import CASES

    t = Table(title="dpcomm validate cases")
    for col in ("name", "topology", "rate", "trace", "collective/mode", "schedules", "quick"):
        t.add_column(col)
    for c in CASES:
        if c.kind == "allreduce":  # a multi-GPU case: ranks per server and loopback; algorithms and sizes
            t.add_row(c.name, f"{c.topology} x{c.gpus} ranks", f"{c.rate}, lo {c.intra_rate or 'unshaped'}",
                      "-", "all-reduce", f"{' '.join(c.algorithms)} at {' '.join(c.sizes)}", "")  # fmt: skip
            continue
        t.add_row(c.name, c.topology, c.rate, c.trace, f"{c.collective}/{c.mode}", " ".join(c.schedules),
                  "yes" if c.quick else "")  # fmt: skip
    console.print(t)
    return 0


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dpcomm.utils.io import check_figure_path, check_output_path
    from dpcomm.validate.cases import select
    from dpcomm.validate.run import cluster_unavailable, load_record, loadavg

    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.list:
        return _list(console)
    cases = select(args.cases, quick=args.quick)
    if args.fresh and args.no_run:
        raise UserError("--fresh measures again and --no-run measures nothing: give one")
    if not args.timeout > 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    if args.json:
        check_output_path(args.json)
    if args.plot:
        check_figure_path(args.plot)  # a format matplotlib cannot write fails now, not after the cases
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is not a folder")
    records, todo, failed = [], [], []
    for c in cases:
        rec = None if args.fresh else load_record(out, c)
        if rec:
            records.append(rec)
        elif not args.no_run:
            todo.append(c)
    if args.no_run:
        if not records:
            raise UserError(f"--no-run: {out} holds none of the cases asked for")
        missing = [c.name for c in cases if not any(r["case"]["name"] == c.name for r in records)]
        if missing:
            console.print(f"Not measured in {out} (left out): {', '.join(missing)}", highlight=False)
    elif todo:
        why = cluster_unavailable()
        if why is not None:
            print(f"dpcomm validate: the emulated cluster is not available here: {why}", file=sys.stderr)
            return 2
        records += _measure(console, todo, out, args.timeout, failed)
    order = {c.name: i for i, c in enumerate(cases)}
    records.sort(key=lambda r: order.get(r["case"]["name"], len(order)))
    if not records:
        raise UserError(f"no case finished ({', '.join(failed)} failed)")
    code = _report(console, records, args, loadavg())
    if failed:
        print(f"dpcomm validate: {len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return code


def _measure(console, todo, out: Path, timeout: float, failed: list[str]) -> list:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dpcomm.validate.run import loadavg, run_case

    done: list = []
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=Console(stderr=True), disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("cases", total=len(todo))
        for c in todo:
            what = (f"{c.gpus} ranks per server, loopback {c.intra_rate}, all-reduce "
                    f"{', '.join(c.algorithms)} at {', '.join(c.sizes)}" if c.kind == "allreduce"
                    else f"{_model(c)}, {', '.join(c.schedules)}")  # fmt: skip
            bar.update(task, description=f"{c.name} ({c.topology} {c.rate})")
            console.print(f"case {c.name}: {c.topology} at {c.rate}, {what}; load average {loadavg()}",
                          highlight=False)  # fmt: skip
            try:
                done.append(run_case(c, out, timeout_s=timeout, log=lambda s: console.print(f"  {s}")))
            except UserError as exc:  # the other cases still run; the exit status says one failed
                print(f"dpcomm validate: {exc}", file=sys.stderr)
                failed.append(c.name)
            bar.advance(task)
    return done


def _report(console, records: list, args: argparse.Namespace, load: str) -> int:
    from dpcomm.utils.io import atomic_write_json
    from dpcomm.validate.report import build_report, plot, summary_lines, table

    command = (
        "dpcomm validate " + shlex.join(sys.argv[2:]) if sys.argv[1:2] == ["validate"] else "dpcomm validate"
    )
    report = build_report(records, command)
    m = report["machine"]
    console.print(table(report))
    for line in summary_lines(report):
        console.print(line, highlight=False)
    loads = ", ".join(f"{c['name']} {c['loadavg_before']}" for c in report["cases"])
    console.print(f"Machine: {m.get('cores')} cores, torch {m.get('torch')}; load average before each case: "
                  f"{loads}; now {load}.", highlight=False)  # fmt: skip
    if args.json:
        atomic_write_json(args.json, report)
        console.print(f"JSON: {args.json}", highlight=False)
    if args.plot:
        console.print(f"Plot: {plot(report, args.plot)}", highlight=False)
    return 0


def _model(case) -> str:
    """What a training case trains: the emulated trace, or a zoo model (compiled with a backend)."""
    if case.model is None:
        return f"emulated {case.trace}"
    return case.model + (f" compiled with {case.compile}" if case.compile else "")
