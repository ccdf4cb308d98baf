"""``dpcomm plan --export FRAMEWORK``: the plan in a framework's own configuration form
(:mod:`dpcomm.integrations.export`). The fragment alone goes to standard output, ready to redirect into
the framework's config file; what its form cannot say, and the modelled times, go to standard error."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dpcomm.errors import UserError
from dpcomm.integrations.export import FRAMEWORKS, Export, check_export


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--export",
        metavar="FRAMEWORK",
        help=f"print the plan as a framework's config fragment: {', '.join(FRAMEWORKS)} (DDP plans: the "
        "best single bucket size, bucket:auto; --fsdp plans: deepspeed ZeRO-3 or torchtitan)",
    )
    parser.add_argument(
        "--zero-stage", type=int, metavar="S", help="with --export deepspeed: ZeRO stage 1 or 2 (DDP plans; "
        "default 2) or 3 (--fsdp plans)",
    )  # fmt: skip


def check_export_arguments(args: argparse.Namespace) -> None:
    """One line for a bad ``--export`` combination, before anything is planned."""
    if args.export is None:
        if args.zero_stage is not None:
            raise UserError("--zero-stage is DeepSpeed's: give it with --export deepspeed")
        return
    if args.pull is not None or args.json or getattr(args, "plot", None):
        raise UserError("--export prints a framework's config: not with --pull, --json or --plot")
    framework = args.export.strip().lower()
    check_export(framework, fsdp=args.fsdp is not None, zero_stage=args.zero_stage)
    args.export = framework
    if args.fsdp is None and args.schedule not in (None, "bucket:auto"):
        raise UserError(
            f"--export {framework} takes one bucket size: --schedule bucket:auto (the default with "
            "--export); "
            f"'{args.schedule}' plans a bucket per group, which dpcomm.integrations runs instead"
        )


def print_export(out: Export, times: str | None = None) -> int:
    """The fragment on standard output, the notes (and ``times``) on standard error."""
    print(out.text())
    for line in ([times] if times else []) + out.notes:
        print(f"dpcomm: {line}", file=sys.stderr)
    return 0


def export_fsdp_plan(args: argparse.Namespace, plan: Any, trace: Any, world: int, t_iter_s: float) -> int:
    """``dpcomm plan --fsdp METHOD --export deepspeed|torchtitan``."""
    from dpcomm.integrations.export import export_fsdp

    out = export_fsdp(args.export, plan, trace, world, zero_stage=args.zero_stage)
    return print_export(out, f"the FSDP plan: t_iter {t_iter_s * 1e3:.2f} ms in the model")
