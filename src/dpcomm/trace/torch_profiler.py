"""A trace (``dpcomm-trace/2``: gradient units) from the Chrome trace a user's own ``torch.profiler`` run
wrote.

Record it with the module hierarchy (``torch.profiler.profile(record_shapes=True, with_stack=True,
with_modules=True)``, then ``prof.export_chrome_trace(path)``): in eager mode every ``nn.Module`` call is then
a ``python_function`` event named ``nn.Module: <Class>_<k>``, and every operator a ``cpu_op`` event; backward
functions (``autograd::engine::evaluate_function: XBackward0``) carry the ``Sequence number`` of the forward
operator that made them. The layers are attributed the way :mod:`dpcomm.trace.profiler` partitions a measured
iteration (MG-WFBP Table I's t_f^(l), t_b^(l), summing to the iteration, Eq. 3):

- **iterations**: each top-level call of the model (its class's module event) is one forward; the backward
  is the evaluate-function events after it and before the next forward;
- **which module is which**: the module events inside one forward, in time order, are matched one by one with
  the module calls of one forward pass of ``model`` on an example batch (class names must agree), so reused
  modules and per-class instance numbers need no guessing;
- **forward**: a learnable layer owns the time from its module's start to the next learnable layer's start
  (the first also owns the time before it, the last the time to the end of the model's forward);
- **backward**: a backward function belongs to the layer whose module ran the forward operator with its
  sequence number (the innermost module); layer ``l`` owns the time from the previous such function's end to
  the end of its own, and the tail after the last one goes to the last layer that had one.

Per-layer times are means over the recorded iterations (``skip`` drops the first few), so their sums equal the
profiler's mean forward (module event) and backward (first to last evaluate-function event) times. The rows
are then the model's gradient units (:mod:`dpcomm.trace.units`, one local pass of the example), each with
its module's times (split by parameters where a module holds several units), so ``bucket_caps`` can cut DDP's
buckets where the plan does. On CUDA the
events are the host's (launch times), not the kernels': this reads CPU traces.

A trace file is at most :data:`MAX_PROFILER_BYTES` (256 MiB), checked before it is read (parsed, a Chrome
trace takes about ten times its size in memory): profile fewer steps (``schedule(active=2)``) to shrink it.
A gzipped file (``*.json.gz``, what ``tensorboard_trace_handler(dir, use_gzip=True)`` writes) is read as
well, up to the same size unpacked (:func:`read_chrome_trace`).

The model may be a zoo model or the user's own (``dpcomm profile --model package.module:Class --input SPEC
--from-torch-profiler FILE``, :mod:`dpcomm.trace.user_model`): the module events are matched by class name,
so the model given must be the class that was recorded.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError, first_line
from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.trace.format import Layer, Trace
from dpcomm.utils.io import read_json

__all__ = ["MAX_PROFILER_BYTES", "from_chrome_trace", "read_chrome_trace", "recorded_input_shape"]

MAX_PROFILER_BYTES = 256 << 20
"""Largest ``torch.profiler`` Chrome trace read, bytes (a few profiled iterations of the zoo are < 50 MB)."""

_MODULE = "nn.Module: "


def read_chrome_trace(path: str | os.PathLike) -> Any:
    """A Chrome trace file, parsed: JSON, or gzipped JSON (``.gz``), at most :data:`MAX_PROFILER_BYTES`
    (unpacked); a problem is a one-line :class:`UserError` naming the file."""
    if not str(path).endswith(".gz"):
        return read_json(path, max_bytes=MAX_PROFILER_BYTES)
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read(MAX_PROFILER_BYTES + 1)  # read no more than the limit, however well it packs
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise UserError(f"{path}: cannot read it as gzip ({exc})") from None
    if len(data) > MAX_PROFILER_BYTES:
        raise UserError(f"{path}: more than {MAX_PROFILER_BYTES:,} bytes unpacked")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON inside the gzip ({first_line(exc)})") from None


_BACKWARD = "autograd::engine::evaluate_function: "


@dataclass(slots=True, kw_only=True)
class _Event:
    name: str
    tid: Any
    start: float
    """Microseconds (Chrome trace ``ts``)."""
    end: float
    seq: int | None = None


def _events(obj: Any, source: str) -> tuple[list[_Event], list[_Event], list[_Event]]:
    """(module events, forward operators with a sequence number, backward functions), each sorted by start."""
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise UserError(
            f"{source}: not a Chrome trace (no 'traceEvents' list); write it with export_chrome_trace"
        )
    modules, ops, backward = [], [], []
    for e in obj["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e:
            continue
        name, args = str(e.get("name", "")), e.get("args") or {}
        ev = _Event(name=name, tid=e.get("tid"), start=float(e["ts"]), end=float(e["ts"]) + float(e["dur"]))
        if e.get("cat") == "python_function" and name.startswith(_MODULE):
            ev.name = name[len(_MODULE) :].rpartition("_")[0]
            modules.append(ev)
        elif e.get("cat") == "cpu_op" and name.startswith(_BACKWARD):
            ev.seq = args.get("Sequence number")
            backward.append(ev)
        elif e.get("cat") == "cpu_op" and args.get("Sequence number") is not None:
            ev.seq = int(args["Sequence number"])
            ops.append(ev)
    if not modules:
        raise UserError(
            f"{source}: no nn.Module events; record with torch.profiler.profile(with_stack=True, "
            "with_modules=True)"
        )
    for lst in (modules, ops, backward):
        lst.sort(key=lambda ev: (ev.start, -ev.end))
    return modules, ops, backward


def _call_order(model: nn.Module, example: Any) -> list[nn.Module]:
    calls: list[nn.Module] = []
    hooks = [m.register_forward_pre_hook(lambda m, _i: calls.append(m)) for m in model.modules()]
    try:
        with torch.no_grad():
            model(*example) if isinstance(example, tuple) else model(example)
    finally:
        for h in hooks:
            h.remove()
    return calls


def _partition(start: float, marks: list[tuple[int, float]], end: float, n: int, opens: bool) -> list[float]:
    """Split ``[start, end]`` (microseconds) among layers at ``marks``; seconds per layer."""
    out = [0.0] * n
    if not marks:
        return out
    points = [start, *(t for _, t in marks), end]
    for k in range(len(points) - 1):
        owner = marks[max(k - 1, 0)][0] if opens else marks[min(k, len(marks) - 1)][0]
        out[owner] += max(0.0, points[k + 1] - points[k]) * 1e-6
    return out


def recorded_input_shape(obj: Any, model_class: str, source: str = "trace") -> tuple[int, ...] | None:
    """The shape of the first operator input inside the model's first recorded forward (``record_shapes``):
    the input batch's shape for models whose first operator takes the input; None when not recorded."""
    modules, _, _ = _events(obj, source)
    root = _roots(modules, model_class, source)[0]
    for e in obj["traceEvents"]:
        if (
            not isinstance(e, dict)
            or e.get("ph") != "X"
            or e.get("cat") != "cpu_op"
            or e.get("tid") != root.tid
        ):
            continue
        if root.start <= float(e["ts"]) <= root.end:
            dims = (e.get("args") or {}).get("Input Dims") or []
            if dims and isinstance(dims[0], list) and dims[0]:
                return tuple(int(d) for d in dims[0])
    return None


def _roots(modules: list[_Event], model_class: str, source: str) -> list[_Event]:
    roots, open_until = [], -1.0
    for m in modules:
        if m.name == model_class and m.start >= open_until:
            roots.append(m)
            open_until = m.end
    if not roots:
        seen = sorted({m.name for m in modules})[:8]
        raise UserError(
            f"{source}: no call of model class {model_class} in the trace (modules: {', '.join(seen)})"
        )
    return roots


def from_chrome_trace(
    trace: str | os.PathLike | dict[str, Any],
    model: nn.Module,
    example: Any,
    *,
    model_name: str | None = None,
    skip: int = 0,
    source: str | None = None,
) -> Trace:
    """Per-layer forward/backward times of ``model`` from a ``torch.profiler`` Chrome trace (see module
    docstring). ``example``: an input batch of the recorded shape (orders the modules; run once, no grad)."""
    source = source or (str(trace) if not isinstance(trace, dict) else "trace")
    obj = trace if isinstance(trace, dict) else read_chrome_trace(trace)
    modules, ops, backward = _events(obj, source)
    layers = learnable_layers(model, example)
    owned = layer_params(model, layers)
    layer_of = {id(mod): i for i, (_, mod) in enumerate(layers)}
    calls = _call_order(model, example)
    n = len(layers)
    roots = _roots(modules, type(model).__name__, source)[skip:]
    if not roots:
        raise UserError(f"{source}: skip={skip} leaves no recorded iteration")
    op_starts = [o.start for o in ops]
    f_sum, b_sum, totals = [0.0] * n, [0.0] * n, []
    for i, root in enumerate(roots):
        inside = [m for m in modules if m.tid == root.tid and root.start <= m.start and m.end <= root.end]
        names = [m.name for m in inside]
        if names != [type(c).__name__ for c in calls]:
            raise UserError(
                f"{source}: forward {i + skip} called {len(names)} modules, the model {len(calls)} "
                "(or in another order): is the trace of this model, with this input shape?"
            )
        which = [layer_of.get(id(c)) for c in calls]
        f_marks = [(which[k], m.start) for k, m in enumerate(inside) if which[k] is not None]
        seq_layer: dict[int, int] = {}
        lo, hi = bisect.bisect_left(op_starts, root.start), bisect.bisect_right(op_starts, root.end)
        for op in ops[lo:hi]:
            if op.tid != root.tid:
                continue
            owner = None
            for k, m in enumerate(inside):  # innermost module running the operator: the last that contains it
                if m.start <= op.start and op.end <= m.end:
                    owner = which[k]
            if owner is not None:
                seq_layer.setdefault(op.seq, owner)
        nxt = roots[i + 1].start if i + 1 < len(roots) else float("inf")
        bw = [b for b in backward if root.end <= b.start < nxt]
        if not bw:
            raise UserError(f"{source}: forward {i + skip} has no backward after it")
        b_start, b_end = bw[0].start, max(b.end for b in bw)
        b_marks = [(seq_layer[b.seq], b.end) for b in bw if b.seq in seq_layer]
        b_marks.sort(key=lambda m: m[1])
        f = _partition(root.start, f_marks, root.end, n, opens=True)
        b = _partition(b_start, b_marks, b_end, n, opens=False)
        f_sum = [x + y for x, y in zip(f_sum, f, strict=True)]
        b_sum = [x + y for x, y in zip(b_sum, b, strict=True)]
        totals.append(((root.end - root.start) * 1e-6, (b_end - b_start) * 1e-6))
    k = len(roots)
    first = example[0] if isinstance(example, tuple) else example
    rows = _unit_rows(model, example, layers, owned, [f / k for f in f_sum], [b / k for b in b_sum])
    params = [p for ps in owned for p in ps]
    return Trace(
        model=model_name or type(model).__name__,
        batch_size=int(first.shape[0]) if first.dim() > 0 else 1,
        device="cpu",
        dtype_bytes=params[0].element_size() if params else 4,
        layers=rows,
        extra={
            "measured_by": "torch.profiler",
            "iterations": k,
            "iteration_forward_s": statistics.fmean(t[0] for t in totals),
            "iteration_backward_s": statistics.fmean(t[1] for t in totals),
        },
    )


def _unit_rows(
    model: nn.Module, example: Any, layers: list, owned: list, f: list[float], b: list[float]
) -> tuple[Layer, ...]:
    """The trace's rows as gradient units (:func:`dpcomm.trace.units.gradient_units`, ``dpcomm-trace/2``):
    each unit takes its module's times, split by parameters where a module holds several units (a module
    whose parameters are ready at two points, or unused ones). For a CNN the units are the layers."""
    from dpcomm.trace.units import gradient_units

    units = gradient_units(model, example)
    layer_of = {name: i for i, (name, _) in enumerate(layers)}
    numel = dict(model.named_parameters())
    size = [sum(numel[n].numel() for n in u.param_names) for u in units]
    held = [0] * len(layers)
    for u, unit in zip(units, size, strict=True):
        held[layer_of[u.module]] += unit
    rows = []
    for u, n in zip(units, size, strict=True):
        i = layer_of[u.module]
        share = n / held[i] if held[i] else 1.0
        rows.append(
            Layer(name=u.name, params=n, forward_s=f[i] * share, backward_s=b[i] * share,
                  param_names=u.param_names, unused=u.unused, extra={"type": type(layers[i][1]).__name__})
        )  # fmt: skip
    return tuple(rows)
