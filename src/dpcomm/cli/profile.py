"""Profile a zoo model layer by layer and write a trace (``dpcomm-trace/1``).

Examples: ``dpcomm profile --model resnet50 --batch-size 8 -o resnet50.json`` (measured on this machine);
``dpcomm profile --model googlenet --batch-size 64 --analytic k80 -o g.json`` (FLOP model, instant);
``dpcomm profile --from-torch-profiler run.json --model resnet20 -o r.json`` (from a user's own
``torch.profiler`` Chrome trace, see :mod:`dpcomm.trace.torch_profiler`).
"""

from __future__ import annotations

import argparse
import sys

from dpcomm.errors import UserError

COMMAND = "profile"
HELP = "measure (or model with --analytic) each learnable layer's forward/backward time; write a trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="NAME", help="zoo model (see `dpcomm models`)")
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="mini-batch size (with --from-torch-profiler: as recorded)",
    )
    parser.add_argument(
        "--from-torch-profiler",
        metavar="TRACE",
        help="no measurement: per-layer times from a torch.profiler Chrome trace of --model "
        "(recorded with with_stack=True, with_modules=True)",
    )
    parser.add_argument(
        "--skip",
        type=int,
        default=0,
        metavar="N",
        help="with --from-torch-profiler: drop the first N iterations",
    )
    parser.add_argument("--device", default="cpu", metavar="DEV", help="cpu (default) or cuda[:N]")
    parser.add_argument(
        "--iters", type=int, default=10, metavar="N",
        help="measured iterations (default 10), each followed by one without hooks (whole-iteration time)",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="warm-up iterations (default 3)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's)")
    parser.add_argument(
        "--timer",
        default="wall",
        choices=("wall", "thread"),
        help="wall clock (default), or this thread's CPU time (cpu only; with --threads 1 on a busy machine)",
    )
    parser.add_argument(
        "--analytic",
        metavar="PRESET",
        help="no measurement: roofline model of a preset (k80, v100, h100, cpu)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for weights and the random batch (default 0)"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="trace file to write (default: print JSON)")


def run(args: argparse.Namespace) -> int:
    from dpcomm.models import example_input, get_model
    from dpcomm.utils.io import check_output_path

    if args.output is not None:
        check_output_path(args.output, make_folders=False)
    if args.from_torch_profiler:
        trace = _from_torch_profiler(args)
        _write(trace, args)
        return 0
    if args.batch_size is None:
        raise UserError("--batch-size is required (except with --from-torch-profiler)")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.iters < 1 or args.warmup < 0:
        raise UserError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.analytic:
        from dpcomm.trace.analytic import analytic_trace

        trace = analytic_trace(args.model, args.batch_size, args.analytic)
    else:
        import torch

        from dpcomm.trace.profiler import profile

        if args.threads is not None:
            torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        model = get_model(args.model)  # unknown names fail here, before any device work
        batch = example_input(args.model, args.batch_size)
        trace = _measure(profile, model, batch, args)
    _write(trace, args)
    return 0


def _from_torch_profiler(args: argparse.Namespace):
    import torch

    from dpcomm.models import example_input, get_model, input_shape
    from dpcomm.trace.torch_profiler import MAX_PROFILER_BYTES, from_chrome_trace, recorded_input_shape
    from dpcomm.utils.io import read_json

    if args.skip < 0:
        raise UserError(f"--skip must be >= 0, got {args.skip}")
    model = get_model(args.model)
    obj = read_json(args.from_torch_profiler, max_bytes=MAX_PROFILER_BYTES)  # before it is read
    shape = recorded_input_shape(obj, type(model).__name__, args.from_torch_profiler)
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
        shape = None if shape is None else (args.batch_size, *shape[1:])
    if shape is not None and len(shape) == 1 + len(input_shape(args.model)):
        example = torch.randn(shape)
    else:
        example = example_input(args.model, args.batch_size or 1)
    return from_chrome_trace(
        obj, model, example, model_name=args.model, skip=args.skip, source=args.from_torch_profiler
    )


def _write(trace, args: argparse.Namespace) -> None:
    from dpcomm.trace import save_trace

    if args.output:
        save_trace(trace, args.output)
        _summary(trace, args.output)
    else:
        import json

        print(json.dumps(trace.to_dict(), indent=1))


def _measure(profile, model, batch, args):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    console = Console(stderr=True)
    # a bar only on a terminal: elsewhere rich's stop() prints an empty line on stderr, and nothing else
    bar = Progress(*columns, console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task(f"profiling {args.model} b{args.batch_size} on {args.device}", total=None)

    def _tick(done: int, total: int) -> None:
        if not bar.disable and not bar.live.is_started:  # on the first iteration: set-up errors print none
            bar.start()
        bar.update(task, completed=done, total=total)

    try:
        return profile(
            model, batch, iters=args.iters, warmup=args.warmup, device=args.device, model_name=args.model,
            loss_fn=None, timer=args.timer, progress=_tick,
        )  # fmt: skip
    finally:
        if bar.live.is_started:
            bar.stop()


def _summary(trace, path: str) -> None:
    ms = 1e3
    line = (
        f"wrote {path}: {trace.model} batch {trace.batch_size} on {trace.device}, {trace.num_layers} layers, "
        f"{trace.total_params:,} params, t_f {trace.t_f * ms:.2f} ms, t_b {trace.t_b * ms:.2f} ms"
    )
    if trace.extra.get("measured_by") == "torch.profiler":
        f, b = trace.extra["iteration_forward_s"], trace.extra["iteration_backward_s"]
        k = trace.extra["iterations"]
        line += f" (the profiler's own totals, mean of {k}: {f * ms:.2f} + {b * ms:.2f} ms)"
    elif "iteration_forward_s" in trace.extra:
        f, b = trace.extra["iteration_forward_s"], trace.extra["iteration_backward_s"]
        line += f" (whole iterations without hooks: {f * ms:.2f} + {b * ms:.2f} ms)"
    print(line, file=sys.stdout)
