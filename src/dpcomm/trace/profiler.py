"""Unit-wise profiler: each gradient unit's forward and backward time, measured on a real device.

The trace's layers are *gradient units* (:mod:`dpcomm.trace.units`): the parameters whose gradients become
ready together, in forward order (unit ``L-1`` ready first), each with its parameters' names, unused ones
marked; the trace is a ``dpcomm-trace/2``. In a CNN a unit is a learnable layer. The units are given
(``units=``: the ones every rank agreed on, as ``wrap`` and ``shard`` pass them) or come from one extra
local forward/backward before the warm-up (gradients and buffers restored).

The papers' traces (MG-WFBP Table I: t_f^(l), t_b^(l); section V-C replays "the measured layer-wise backward
propagation time") list only learnable layers, yet the whole iteration has to add up: t_f = sum_l t_f^(l) and
t_b = sum_l t_b^(l) (MG-WFBP Eq. 3). So the profiler *partitions* each pass's timeline among the learnable
layers instead of timing layers in isolation:

- **forward**: a forward pre-hook on every learnable layer marks when it starts; layer l owns the time from
  its start to the next learnable layer's start, i.e. its own computation plus the parameter-free operations
  that follow it (activation, pooling, residual add); the last layer also owns the loss. The time before the
  first layer starts goes to the first layer.
- **backward**: a post-accumulate-grad hook on every parameter marks when its gradient is in ``.grad``;
  layer l owns the time from the previous such mark (or from the start of ``backward()``) to its own marks.
  That is exactly the interval a wait-free scheduler sees: the gradient of layer l becomes ready
  t_b^(L-1) + ... + t_b^(l) after the backward pass starts (MG-WFBP Eq. 6), and the backward of the
  parameter-free operations between two layers is paid before the earlier layer's gradient is ready. The
  tail after the last gradient (the engine finishing) goes to the last layer whose gradient arrived.

Units: the backward partition is by unit (the marks are per parameter, a unit owns the interval ending at
each of its parameters' marks, so it owns everything up to its ready point), and an unused unit gets none.
The forward partition is by learnable layer (the module that owns the parameters, timed as above) and a
layer's forward time is split over its units in proportion to their parameters (a module whose parameters
split into two units, or one with unused parameters); for a CNN that is the layer's own time.

Per-layer sums therefore equal the instrumented iteration, and the medians over iterations are scaled to
add up to its median (:func:`layer_medians`). Each measured (hooked) iteration is followed by a
plain one without hooks; the trace records the plain iterations' median forward and backward times
(``iteration_forward_s``, ``iteration_backward_s``). The hooks and marks stretch an iteration whose device
waits for the host (a launch-bound GPU iteration: bf16 on an H200 ran 1.12-1.60x the hookless one), so the
hooked iteration gives each unit's *share* of a pass and the hookless one the pass's *time*: every pass's
shares are scaled to the hookless median (:func:`dpcomm.trace.shares.to_iteration`), and the units' forward
and backward times sum to the iteration that training runs (the hooked medians stay in ``hooked_forward_s``
and ``hooked_backward_s``, their ratio to the hookless ones is the stretch; docs/traces.md argues the choice).
Warm-up iterations come first (after one forward that orders the layers and one that counts their FLOPs, see
:mod:`dpcomm.trace.analytic`); times are medians.
On CUDA, marks are CUDA events on the current stream, read after a synchronize.

``autocast`` (``bf16``, ``fp16``) runs every forward and loss under ``torch.autocast`` on the device, as mixed
precision training does; without it the caller's own autocast (``with torch.autocast(...): wrap(...)``) is
what the forward runs under, and the trace's ``autocast`` field records either.

Kept as one module (about 400 lines): the hooks, the warm-up and the timed passes share one state per
run; the shares and their scaling live apart in :mod:`dpcomm.trace.shares`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError, first_line
from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.trace.analytic import layer_costs
from dpcomm.trace.format import Layer, Trace
from dpcomm.trace.shares import to_iteration
from dpcomm.trace.units import Unit, gradient_units, unit_params

__all__ = [
    "AUTOCAST",
    "TIMERS",
    "autocast_dtype",
    "default_loss",
    "layer_medians",
    "profile",
    "time_iteration",
]

Progress = Callable[[int, int], None]
"""``progress(done, total)`` after every iteration (warm-up included)."""


def default_loss(output: Any) -> torch.Tensor:
    """A loss touching every floating output: the sum of their means (so aux heads get gradients too)."""
    tensors = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise UserError("the model's output has no floating-point tensor that requires grad; pass loss_fn")
    return sum(t.float().mean() for t in tensors)  # type: ignore[return-value]


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensors(item)]
    return []


TIMERS = ("wall", "thread")
"""``wall``: elapsed time (``perf_counter``; CUDA events on a GPU). ``thread``: CPU time of the calling thread
(``thread_time``), CPU only: on a shared machine it leaves out the time other processes hold the core, but it
sees only this thread's work, so use it with ``torch.set_num_threads(1)``."""


AUTOCAST = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
"""``autocast`` spellings and the torch dtype each names (mixed precision: parameters stay as they are)."""


def autocast_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """The dtype an ``autocast`` argument names (None: none); an unknown one is a one-line error."""
    if value is None or isinstance(value, torch.dtype):
        return value
    name = AUTOCAST.get(str(value).strip().lower())
    if name is None:
        raise UserError(f"autocast {value!r}: choose one of {', '.join(AUTOCAST)}")
    return getattr(torch, name)


def _amp(dev: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``dev`` in ``dtype``; None: the caller's own state, untouched."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(dev.type, dtype=dtype)


def _ambient(dev: torch.device) -> torch.dtype | None:
    """The caller's autocast dtype on ``dev``'s type, None when autocast is off there."""
    return torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else None


class _Clock:
    """Marks on the host or on the CUDA stream (timing events); read ``seconds`` after ``sync``."""

    def __init__(self, device: torch.device, timer: str = "wall") -> None:
        if timer not in TIMERS:
            raise UserError(f"unknown timer {timer!r}; choose one of: {', '.join(TIMERS)}")
        if timer == "thread" and device.type != "cpu":
            raise UserError("timer 'thread' measures CPU time and works only with device cpu")
        self.cuda = device.type == "cuda"
        self.device = device
        self._now = time.thread_time if timer == "thread" else time.perf_counter

    def mark(self) -> Any:
        if not self.cuda:
            return self._now()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))  # this thread's stream (autograd sets it)
        return event

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, a: Any, b: Any) -> float:
        return max(0.0, a.elapsed_time(b) / 1e3 if self.cuda else b - a)


def _partition(clock: _Clock, start: Any, marks: list[tuple[int, Any]], end: Any, n: int, *, opens: bool):
    """Split ``[start, end]`` among layers at ``marks`` (in record order).

    ``opens``: a mark opens its layer's interval (forward); otherwise it closes it (backward).
    """
    out = [0.0] * n
    if not marks:
        return out
    points = [start, *(m for _, m in marks), end]
    for k in range(len(points) - 1):
        if opens:
            owner = marks[max(k - 1, 0)][0]  # [start, m0) -> layer of m0; [m_i, m_i+1) -> layer of m_i
        else:
            owner = marks[min(k, len(marks) - 1)][0]  # (m_i-1, m_i] -> layer of m_i; tail -> last layer
        out[owner] += clock.seconds(points[k], points[k + 1])
    return out


def _call(module: nn.Module, example: Any) -> Any:
    from dpcomm.utils.user_run import call

    return call(module, example)


def _iteration(module, example, loss_fn, params, clock, amp=None) -> tuple[Any, Any, Any]:
    for p in params:
        p.grad = None
    t0 = clock.mark()
    with _amp(clock.device, amp):
        loss = loss_fn(_call(module, example))
    t1 = clock.mark()
    loss.backward()
    t2 = clock.mark()
    return t0, t1, t2


def _resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {device!r}; use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda requested but torch.cuda.is_available() is False on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"device {device!r} is not supported; use cpu or cuda[:N]")
    return dev


def _to(example: Any, dev: torch.device) -> Any:
    if isinstance(example, torch.Tensor):
        return example.to(dev)
    if isinstance(example, tuple | list):
        return tuple(_to(x, dev) for x in example)
    from dpcomm.utils.user_run import Inputs, map_tensors

    if isinstance(example, dict | Inputs):  # keyword inputs (dpcomm.utils.user_run.Inputs)
        return map_tensors(example, lambda t: t.to(dev))
    raise UserError(
        "example batch must be a tensor, a tuple (positional), a dict (keyword) or dpcomm.ddp.Inputs, got "
        f"{type(example).__name__}"
    )


def _device_label(dev: torch.device) -> str:
    return f"cuda:{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else "cpu"


def time_iteration(
    module: nn.Module,
    example_batch: Any,
    *,
    iters: int = 10,
    warmup: int = 3,
    device: str | torch.device = "cpu",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    timer: str = "wall",
    autocast: str | torch.dtype | None = None,
) -> tuple[float, float]:
    """Median ``(forward_s, backward_s)`` of whole training iterations, no hooks (an independent check);
    ``autocast`` as :func:`profile`'s."""
    dev = _resolve_device(device)
    amp = autocast_dtype(autocast)
    module.to(dev).train()
    example = _to(example_batch, dev)
    params = [p for p in module.parameters() if p.requires_grad]
    clock, fwd, bwd = _Clock(dev, timer), [], []
    for i in range(warmup + iters):
        t0, t1, t2 = _iteration(module, example, loss_fn or default_loss, params, clock, amp)
        clock.sync()
        if i >= warmup:
            fwd.append(clock.seconds(t0, t1))
            bwd.append(clock.seconds(t1, t2))
    return statistics.median(fwd), statistics.median(bwd)


def layer_medians(runs: list[list[float]]) -> list[float]:
    """Each layer's median over ``runs`` (one list of per-layer times each: passes, or workers), scaled so
    that they add up to the median run's total. A sum of medians is not the median of the sums: where
    processes share cores, a preemption (or a CPU quota's pause) falls in one layer in one pass and in
    another in the next, and each layer's own median leaves it out. Four co-located parameter-server
    workers on two cores profiled ResNet-20's forward at 53 ms in the run before the scaling and 110 ms in
    the run after it, where training took 71-89 ms (``docs/ps.md``). ``runs`` must not be empty."""
    med = [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))]
    total, summed = statistics.median(sum(r) for r in runs), sum(med)
    return [m * total / summed for m in med] if summed > 0 else med


def profile(
    module: nn.Module,
    example_batch: Any,
    *,
    iters: int = 10,
    warmup: int = 3,
    device: str | torch.device = "cpu",
    model_name: str | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    timer: str = "wall",
    progress: Progress | None = None,
    autocast: str | torch.dtype | None = None,
    units: Sequence[Unit] | None = None,
) -> Trace:
    """Measure every gradient unit's forward and backward time (medians of ``iters`` after ``warmup``).

    ``module`` is moved to ``device`` and put in training mode; ``example_batch`` is a tensor or a tuple of
    tensors (its first dimension is the batch size). ``loss_fn(output) -> scalar`` defaults to
    :func:`default_loss`. The trace's layers are the units of :func:`dpcomm.trace.units.gradient_units`, in
    forward order (for a CNN, :func:`dpcomm.models.learnable_layers`). ``timer`` is one of :data:`TIMERS`.
    ``autocast``: a key of :data:`AUTOCAST` (or a dtype) to run the forward under ``torch.autocast``; None:
    the caller's autocast, if any. The units' times add up to the hookless iteration
    (:func:`dpcomm.trace.shares.to_iteration`). ``units``: the units to time, already made (the ones every
    rank agreed on, :func:`dpcomm.trace.units.agree`: a gradient arriving out of their order is timed
    to its own unit); default: this example's own, from one more forward and backward.
    """
    if iters < 1 or warmup < 0:
        raise UserError(f"iters must be >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    amp = autocast_dtype(autocast)
    dev = _resolve_device(device)
    amp_used = amp or _ambient(dev)
    clock = _Clock(dev, timer)
    module.to(dev).train()
    example = _to(example_batch, dev)
    from dpcomm.utils.user_run import batch_size as _batch

    batch_size = _batch(example)
    loss_fn = loss_fn or default_loss
    try:
        with _amp(dev, amp):  # the passes that find the layers and units run as the measured ones
            layers = learnable_layers(module, example)
            flops = [c.fwd_flops for c in layer_costs(module, example)]
            if units is None:
                units = gradient_units(module, example, loss_fn) if layers else []
            units = list(units)
    except (ValueError, RuntimeError) as exc:  # e.g. a shape mismatch or batch norm on a batch of 1
        raise UserError(f"model forward failed at batch size {batch_size}: {first_line(exc)}") from None
    if not layers:
        raise UserError("the model has no learnable layer (no parameter requires grad)")
    owned = layer_params(module, layers)
    params = [p for ps in owned for p in ps]
    index = {id(mod): i for i, (_, mod) in enumerate(layers)}
    per_unit = unit_params(module, units)
    unit_of = {id(p): u for u, ps in enumerate(per_unit) for p in ps}
    layer_of = {name: i for i, (name, _) in enumerate(layers)}
    # a layer's forward time goes to its units in proportion to their parameters (module docstring)
    sizes = [sum(p.numel() for p in ps) for ps in per_unit]
    layer_size = [0] * len(layers)
    layer_units = [0] * len(layers)
    for u, unit in enumerate(units):
        layer_size[layer_of[unit.module]] += sizes[u]
        layer_units[layer_of[unit.module]] += 1
    share = [
        sizes[u] / layer_size[layer_of[unit.module]]
        if layer_size[layer_of[unit.module]]
        else 1 / layer_units[layer_of[unit.module]]
        for u, unit in enumerate(units)
    ]
    fwd_marks: list[tuple[int, Any]] = []
    bwd_marks: list[tuple[int, Any]] = []

    def _on_forward(mod: nn.Module, _inputs: Any) -> None:
        fwd_marks.append((index[id(mod)], clock.mark()))

    def _on_grad(p: torch.Tensor) -> None:
        bwd_marks.append((unit_of[id(p)], clock.mark()))

    per_layer: list[tuple[list[float], list[float]]] = []
    plain_f: list[float] = []
    plain_b: list[float] = []
    total = warmup + 2 * iters
    for step in range(total):
        hooked = step >= warmup and (step - warmup) % 2 == 0
        handles = []
        if hooked:
            handles = [mod.register_forward_pre_hook(_on_forward) for _, mod in layers]
            handles += [p.register_post_accumulate_grad_hook(_on_grad) for ps in per_unit for p in ps]
        fwd_marks.clear()
        bwd_marks.clear()
        try:
            t0, t1, t2 = _iteration(module, example, loss_fn, params, clock, amp)
        finally:
            for h in handles:
                h.remove()
        clock.sync()
        if hooked:
            f = _partition(clock, t0, fwd_marks, t1, len(layers), opens=True)
            b = _partition(clock, t1, bwd_marks, t2, len(units), opens=False)
            per_layer.append((f, b))
        elif step >= warmup:
            plain_f.append(clock.seconds(t0, t1))
            plain_b.append(clock.seconds(t1, t2))
        if progress is not None:
            progress(step + 1, total)
    for p in params:
        p.grad = None

    fwd, bwd = layer_medians([f for f, _ in per_layer]), layer_medians([b for _, b in per_layer])
    trace_layers = []
    for u, unit in enumerate(units):
        i = layer_of[unit.module]
        trace_layers.append(
            Layer(
                name=unit.name,
                params=sizes[u],
                forward_s=fwd[i] * share[u],
                backward_s=bwd[u],
                param_names=unit.param_names,
                unused=unit.unused,
                extra={"type": type(layers[i][1]).__name__, "flops": round(flops[i] * share[u])},
            )
        )
    trace = Trace(
        model=model_name or type(module).__name__,
        batch_size=batch_size,
        device=_device_label(dev),
        dtype_bytes=params[0].element_size() if params else 4,
        layers=tuple(trace_layers),
        extra={
            "units": "gradient-ready (dpcomm.trace.units)",
            "iteration_forward_s": statistics.median(plain_f),
            "iteration_backward_s": statistics.median(plain_b),
            "autocast": str(amp_used).removeprefix("torch.") if amp_used is not None else None,
            "iters": iters,
            "warmup": warmup,
            "torch": torch.__version__,
            "threads": torch.get_num_threads() if dev.type == "cpu" else None,
            "timer": timer,
            "loss": "default (sum of output means)" if loss_fn is default_loss else "user",
        },
    )
    return to_iteration(trace)
