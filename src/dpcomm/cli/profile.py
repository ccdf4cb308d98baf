"""Profile a model layer by layer and write a trace (``dpcomm-trace/1`` or ``/2``).

Examples: ``dpcomm profile --model resnet50 --batch-size 8 -o resnet50.json`` (a zoo model, measured on this
machine); ``dpcomm profile --model googlenet --batch-size 64 --analytic k80 -o g.json`` (FLOP model,
instant); ``dpcomm profile --model mypkg.net:Net --model-args '{"width": 64}' --input float32[8,3,32,32]``
(the user's own model, :mod:`dpcomm.trace.user_model`); ``dpcomm profile --from-torch-profiler run.json
--model resnet20 -o r.json`` (from a user's own ``torch.profiler`` Chrome trace, see
:mod:`dpcomm.trace.torch_profiler`); ``dpcomm profile --trace gpt2-cpu-b1 --retime h100-bf16 --reduce-dtype
fp32 -o g.json`` (a trace re-timed for another GPU and re-typed for the reduction's dtype, see
:mod:`dpcomm.trace.retime`; ``--retime``/``--reduce-dtype`` apply to every way of making a trace).

Kept as one module (about 430 lines): it is the argument parsing and dispatch of every way to make a
trace (zoo, user model, keyword inputs, analytic, torch.profiler, re-timing); the work is in
:mod:`dpcomm.trace`.
"""

from __future__ import annotations

import argparse
import os
import sys

from dpcomm.errors import UserError

COMMAND = "profile"
HELP = "measure (or model with --analytic) each learnable layer's forward/backward time; write a trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="zoo model (see `dpcomm models`), or your own as package.module:Class (with --input)",
    )
    parser.add_argument(
        "--model-args", metavar="JSON", help="with package.module:Class: its keyword arguments, a JSON object"
    )
    parser.add_argument(
        "--input",
        metavar="SPEC",
        help="with package.module:Class: example inputs, one per forward argument, ';'-separated: "
        "DTYPE[D0,D1,...][:vocab=N], e.g. float32[8,3,32,32] or long[4,128]:vocab=50257 (first dim: batch)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="mini-batch size of a zoo model (with --from-torch-profiler: as recorded)",
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
    parser.add_argument(
        "--trace",
        metavar="TRACE",
        help="no measurement: re-express this trace (a file or a shipped name) with --retime/--reduce-dtype; "
        "--model (and --input) give the FLOPs and bytes where the trace's model is not a zoo name",
    )
    parser.add_argument(
        "--retime",
        metavar="HOW",
        help="re-time the trace for another device: h100-bf16 or h200-bf16 (roofline at the bf16 "
        "tensor-core rate), scale:F[,B] (times x F, backward x B), or ratio:TARGET,SOURCE (two traces of one "
        "model and batch measured on the two devices)",
    )
    parser.add_argument(
        "--reduce-dtype",
        metavar="DTYPE",
        help="gradient bytes as the reduction's dtype has them: fp32 (autocast, FSDP2's reduce_dtype) or "
        "bf16/fp16 (a model cast to bf16)",
    )
    parser.add_argument("--device", default="cpu", metavar="DEV", help="cpu (default) or cuda[:N]")
    parser.add_argument(
        "--autocast",
        metavar="DTYPE",
        help="bf16 or fp16: forward and loss under torch.autocast (mixed precision, as GPU training runs)",
    )
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
        help="no measurement: roofline model of a preset (k80, v100, h100, cpu; h100-bf16, h200-bf16)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for weights and the random batch (default 0)"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="trace file to write (default: print JSON)")


def run(args: argparse.Namespace) -> int:
    from dpcomm.trace.retime import REDUCE_DTYPES, Target, parse_retime, retime, with_reduce_dtype
    from dpcomm.utils.io import check_output_path

    if args.output is not None:
        check_output_path(args.output, make_folders=False)
    how = parse_retime(args.retime) if args.retime else None  # bad input fails before any work
    if args.reduce_dtype is not None and args.reduce_dtype.lower() not in REDUCE_DTYPES:
        raise UserError(f"--reduce-dtype {args.reduce_dtype!r}: choose one of {', '.join(REDUCE_DTYPES)}")
    user = args.model is not None and ":" in args.model
    if user and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `mymodel.py` here imports, as `uvicorn --app-dir .` has it
    if args.trace:
        trace = _retrace(args)
    else:
        if args.model is None:
            raise UserError("--model is required (a zoo name or package.module:Class), or --trace FILE")
        if (args.model_args or args.input) and not user:
            raise UserError("--model-args and --input go with a model given as package.module:Class")
        if user and args.input is None:
            raise UserError(f"--model {args.model}: give its example input, e.g. --input float32[8,3,32,32]")
        if user and args.batch_size is not None:
            raise UserError("with package.module:Class the batch size is --input's first dimension")
        trace = _make(args, user)
    if how is not None:
        costs = None  # a scale needs none; a target counts them on the model (default: the trace's zoo model)
        if isinstance(how, Target) and user:
            costs = _user_costs(args, trace, how)
        elif isinstance(how, Target) and args.trace and args.model:
            costs = _zoo_costs(args.model, trace, how)
        trace = retime(trace, how, costs=costs)
    if args.reduce_dtype is not None:
        trace = with_reduce_dtype(trace, args.reduce_dtype)
    _write(trace, args)
    return 0


def _make(args: argparse.Namespace, user: bool):
    """The trace of --model: measured, analytic, or from a torch.profiler trace."""
    if args.from_torch_profiler:
        return _from_torch_profiler(args, user)
    if not user:
        if args.batch_size is None:
            raise UserError("--batch-size is required (except with --from-torch-profiler)")
        if args.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.iters < 1 or args.warmup < 0:
        raise UserError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.analytic:
        return _analytic(args, user)
    import torch

    from dpcomm.models import example_input, get_model
    from dpcomm.trace.profiler import autocast_dtype, profile

    autocast_dtype(args.autocast)  # a bad --autocast is one line before the model is built

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if user:
        from dpcomm.trace.user_model import build_model, parse_model_args

        inputs = _inputs(args.input)  # bad specs fail before the user's module is imported
        model = build_model(args.model, parse_model_args(args.model_args))
        batch = inputs("cpu")
    else:
        model = get_model(args.model)  # unknown names fail here, before any device work
        batch = example_input(args.model, args.batch_size)
    try:
        return _with_holders(_measure(profile, model, batch, args), model, batch, args.device)
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, AttributeError) as exc:
        from dpcomm.errors import first_line

        raise UserError(f"--model {args.model} on its --input: {first_line(exc, with_type=True)}") from None


def _with_holders(trace, model, batch, device):
    """Each unit's ``fsdp_modules``: the modules ``dpcomm.fsdp.shard`` gives its parameters to
    (:func:`dpcomm.fsdp.groups.layer_holders`), so that ``plan --fsdp`` prints only units shard runs."""
    from dataclasses import replace

    from dpcomm.fsdp.groups import layer_holders
    from dpcomm.utils.user_run import map_tensors

    if not all(x.param_names for x in trace.layers):
        return trace
    example = map_tensors(batch, lambda t: t.to(device))
    held = layer_holders(model, example, [x.param_names for x in trace.layers])
    layers = (
        replace(x, extra={**x.extra, "fsdp_modules": h}) for x, h in zip(trace.layers, held, strict=True)
    )
    return replace(trace, layers=tuple(layers))


def _inputs(text: str):
    """``--input``: positional specs, then keyword ones as ``NAME=SPEC`` (``input_ids=long[4,128]:vocab=1000;
    attention_mask=long[4,128]:vocab=2``, for ``forward(input_ids, attention_mask=...)``); a function of
    the device giving the example (a tensor, a tuple, a dict or :class:`dpcomm.ddp.Inputs`)."""
    import re

    from dpcomm.trace.user_model import _split, make_inputs, parse_inputs
    from dpcomm.utils.user_run import Inputs

    parts = _split(text)
    named = [re.match(r"([A-Za-z_]\w*)\s*=\s*(.+)$", p) for p in parts]
    if any(m is not None and n is None for m, n in zip(named, named[1:], strict=False)):
        raise UserError(f"--input {text!r}: positional inputs come before NAME=SPEC ones")
    positional = parse_inputs(";".join(p for p, m in zip(parts, named, strict=True) if m is None)) if (
        any(m is None for m in named)) else ()  # fmt: skip
    keyword = {m.group(1): parse_inputs(m.group(2)) for m in named if m is not None}
    if any(len(v) != 1 for v in keyword.values()):
        raise UserError(f"--input {text!r}: one tensor per NAME=SPEC")
    if not keyword:
        return lambda device: make_inputs(positional, device=device)

    def build(device):
        args = make_inputs(positional, device=device) if positional else ()
        return Inputs(
            args=args if isinstance(args, tuple) else (args,),
            kwargs={k: make_inputs(v, device=device) for k, v in keyword.items()},
        )

    return build


def _meta_user(args: argparse.Namespace):
    """The user's model and example input on the meta device: shapes only, no memory, no arithmetic."""
    import torch

    from dpcomm.trace.user_model import build_model, parse_model_args
    from dpcomm.utils.user_run import batch_size

    if args.input is None:
        raise UserError(f"--model {args.model}: give its example input, e.g. --input float32[8,3,32,32]")
    inputs = _inputs(args.input)
    with torch.device("meta"):
        model = build_model(args.model, parse_model_args(args.model_args))
    model.train()
    example = inputs("meta")
    return model, example, batch_size(example)


def _analytic(args: argparse.Namespace, user: bool):
    from dpcomm.trace.analytic import DEVICE_PRESETS, analytic_trace, layer_costs, resolve_device
    from dpcomm.trace.retime import TARGETS

    key = args.analytic.removeprefix("analytic:").lower()
    if not user and key not in TARGETS:
        return analytic_trace(args.model, args.batch_size, args.analytic)
    if key not in TARGETS and key not in DEVICE_PRESETS:
        raise UserError(f"unknown device preset {args.analytic!r}; choose one of: "
                        f"{', '.join([*DEVICE_PRESETS, *TARGETS])}")  # fmt: skip
    preset, elem = (
        (TARGETS[key].preset, TARGETS[key].element_bytes) if key in TARGETS else (resolve_device(key), 4)
    )
    if user:
        model, example, batch = _meta_user(args)
    else:
        import torch

        from dpcomm.models import example_input, get_model

        with torch.device("meta"):
            model = get_model(args.model)
            example = example_input(args.model, args.batch_size, device="meta")
        model.train()
        batch = args.batch_size
    from dpcomm.errors import first_line
    from dpcomm.trace.analytic import trace_from_costs

    try:
        costs = layer_costs(model, example, dtype_bytes=elem)
    except (ValueError, RuntimeError, TypeError, NotImplementedError) as exc:
        raise UserError(f"{args.model} on the meta device: {first_line(exc, with_type=True)}") from None
    grad_bytes = next((p.element_size() for p in model.parameters()), 4)
    return trace_from_costs(costs, preset, model=args.model, batch_size=batch, dtype_bytes=grad_bytes)


def _user_costs(args: argparse.Namespace, trace, how):
    """Per-row FLOPs and bytes of the user's model at the trace's batch, for an analytic --retime."""
    from dpcomm.trace.retime import row_costs

    model, example, batch = _meta_user(args)
    if batch != trace.batch_size:
        raise UserError(f"--input's batch {batch} is not the trace's batch size {trace.batch_size}")
    return row_costs(trace, model, example, how.element_bytes)


def _zoo_costs(name: str, trace, how):
    import torch

    from dpcomm.models import example_input, get_model
    from dpcomm.trace.retime import row_costs

    with torch.device("meta"):
        model = get_model(name)
        example = example_input(name, trace.batch_size, device="meta")
    model.train()
    return row_costs(trace, model, example, how.element_bytes)


def _retrace(args: argparse.Namespace):
    """--trace: the trace to re-time or re-type."""
    from dpcomm.trace.retime import load_trace_spec

    if args.from_torch_profiler or args.analytic:
        raise UserError(
            "--trace re-expresses a trace: it does not go with --from-torch-profiler or --analytic"
        )
    if not (args.retime or args.reduce_dtype):
        raise UserError("--trace needs --retime and/or --reduce-dtype (what to change in it)")
    return load_trace_spec(args.trace)


def _from_torch_profiler(args: argparse.Namespace, user: bool):
    import torch

    from dpcomm.models import example_input, get_model, input_shape
    from dpcomm.trace.torch_profiler import from_chrome_trace, read_chrome_trace, recorded_input_shape

    if args.skip < 0:
        raise UserError(f"--skip must be >= 0, got {args.skip}")
    if user:
        from dpcomm.trace.user_model import build_model, make_inputs, parse_inputs, parse_model_args

        specs = parse_inputs(args.input)
        torch.manual_seed(args.seed)
        model = build_model(args.model, parse_model_args(args.model_args))
        obj = read_chrome_trace(args.from_torch_profiler)
        return from_chrome_trace(
            obj,
            model,
            make_inputs(specs),
            model_name=args.model,
            skip=args.skip,
            source=args.from_torch_profiler,
        )
    model = get_model(args.model)
    obj = read_chrome_trace(args.from_torch_profiler)  # before it is read
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
    from dpcomm.utils.user_run import batch_size

    task = bar.add_task(f"profiling {args.model} b{batch_size(batch)} on {args.device}", total=None)

    def _tick(done: int, total: int) -> None:
        if not bar.disable and not bar.live.is_started:  # on the first iteration: set-up errors print none
            bar.start()
        bar.update(task, completed=done, total=total)

    try:
        return profile(
            model, batch, iters=args.iters, warmup=args.warmup, device=args.device, model_name=args.model,
            loss_fn=None, timer=args.timer, progress=_tick, autocast=args.autocast,
        )  # fmt: skip
    finally:
        if bar.live.is_started:
            bar.stop()


def _ms(seconds: float) -> str:
    """Milliseconds, two decimals (three significant digits under a millisecond: a re-timed small model)."""
    return f"{seconds * 1e3:.2f}" if seconds >= 1e-3 or seconds == 0 else f"{seconds * 1e3:.3g}"


def _summary(trace, path: str) -> None:
    ms = 1e3
    line = (
        f"wrote {path}: {trace.model} batch {trace.batch_size} on {trace.device}, {trace.num_layers} layers, "
        f"{trace.total_params:,} params, t_f {_ms(trace.t_f)} ms, t_b {_ms(trace.t_b)} ms"
    )
    if trace.extra.get("measured_by") == "torch.profiler":
        f, b = trace.extra["iteration_forward_s"], trace.extra["iteration_backward_s"]
        k = trace.extra["iterations"]
        line += f" (the profiler's own totals, mean of {k}: {f * ms:.2f} + {b * ms:.2f} ms)"
    elif "hooked_forward_s" in trace.extra:  # the units scaled to the passes timed without hooks
        f, b = trace.extra["hooked_forward_s"], trace.extra["hooked_backward_s"]
        line += f" (scaled to the iterations without hooks; with hooks: {f * ms:.2f} + {b * ms:.2f} ms)"
    elif "iteration_forward_s" in trace.extra:
        f, b = trace.extra["iteration_forward_s"], trace.extra["iteration_backward_s"]
        line += f" (whole iterations without hooks: {f * ms:.2f} + {b * ms:.2f} ms)"
    info = trace.extra.get("retime")
    if info is not None:
        was = info["before"]
        how = info.get("target") or f"scale {info['from_scale']}"
        line += f"; re-timed ({how}) from {was['device']} {_ms(was['t_f'])} + {_ms(was['t_b'])} ms"
    if "reduce_dtype" in trace.extra:
        mib = trace.total_params * trace.dtype_bytes / 2**20
        line += f"; gradients reduced in {trace.extra['reduce_dtype']}: {mib:,.1f} MiB"
    print(line, file=sys.stdout)
