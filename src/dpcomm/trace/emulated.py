"""A model that computes as a trace says: real parameters, each layer's forward and backward a sleep.

:func:`emulated_model` (``SPEC``: a trace, a trace file or a shipped trace, :func:`dpcomm.trace.find_trace`;
``benchmarks/ibatch_testbed.py --model emulated:resnet20-cpu-b32``) builds one learnable layer per trace
layer, in the trace's order, each owning one parameter tensor of the layer's ``params`` elements. Layer
``l``'s forward sleeps ``forward_s`` and its backward ``backward_s``, so gradients become ready, and
parameters are needed, on the trace's timeline, while the CPU stays free, as on a machine whose accelerator
computes.

What it is for: the emulated cluster (``dpcomm testbed``) runs one process per server on this machine's
cores. With real compute, processes that compute also have to read and write their sockets on the same
cores, and where there are more processes than cores the network waits for the CPU (``docs/ps.md``). With
emulated compute the traffic is real TCP on the shaped links and the compute is the trace's, which is the
regime the papers measure (GPUs computing, the network the bottleneck) at any number of servers.

The gradients are zeros (the parameters still travel and are updated: SGD without weight decay leaves
them at zero), the output is ``(batch, num_classes)`` zeros that depend on every parameter, and the input
is read for its batch size only. ``time.sleep`` overshoots by about 0.1 ms per call here (39 sleeps of
ResNet-20's CPU trace took 54 ms for its 50), so each sleep is shortened by what the sleeps before it
overshot (:func:`_sleep`); measure the emulated model (the profiler does) where it matters.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcomm.trace.format import Trace, load_trace

__all__ = ["PREFIX", "EmulatedLayer", "EmulatedModel", "emulated_model"]

PREFIX = "emulated:"
"""Model names ``emulated:SPEC`` (where a tool takes them) build :func:`emulated_model` of ``SPEC``."""


_debt = threading.local()


def _sleep(seconds: float, since: float) -> None:
    """Sleep until ``seconds`` after ``since`` (a ``perf_counter``; the layer's own work counts), less what
    this thread's earlier sleeps overshot, and carry the new overshoot (s)."""
    until = since + seconds - getattr(_debt, "s", 0.0)
    now = time.perf_counter()
    if until <= now:
        _debt.s = now - until
        return
    time.sleep(until - now)
    _debt.s = time.perf_counter() - until


class _Sleep(torch.autograd.Function):
    """``h -> h`` that sleeps ``forward_s`` on the way in and ``backward_s`` on the way back, and gives the
    layer's parameter a zero gradient (so its post-accumulate-grad hook fires at the trace's time)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, forward_s: float, backward_s: float):
        t0 = time.perf_counter()
        ctx.backward_s = backward_s
        ctx.shape = weight.shape
        out = h.clone()
        _sleep(forward_s, t0)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        t0 = time.perf_counter()
        zeros = torch.zeros(ctx.shape, dtype=grad.dtype)
        _sleep(ctx.backward_s, t0)
        return grad, zeros, None, None


class EmulatedLayer(nn.Module):
    """One trace layer: ``params`` elements (at least one) and its forward and backward times (s)."""

    def __init__(self, params: int, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max(1, params)))
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(h, self.weight, self.forward_s, self.backward_s)

    def extra_repr(self) -> str:
        n = self.weight.numel()
        return f"params={n}, forward_s={self.forward_s:.6g}, backward_s={self.backward_s:.6g}"


class EmulatedModel(nn.Module):
    """The trace's layers in order; ``forward(x)`` returns ``(len(x), num_classes)`` zeros."""

    def __init__(self, trace: Trace, num_classes: int = 10) -> None:
        super().__init__()
        self.trace_model, self.trace_batch = trace.model, trace.batch_size
        self.num_classes = num_classes
        self.layers = nn.ModuleList(EmulatedLayer(l.params, l.forward_s, l.backward_s) for l in trace.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], self.num_classes)
        for layer in self.layers:
            h = layer(h)
        return h


def emulated_model(spec: str | Trace, num_classes: int = 10) -> EmulatedModel:
    """:class:`EmulatedModel` of a trace, or of a trace file or shipped trace named ``spec``."""
    if isinstance(spec, Trace):
        return EmulatedModel(spec, num_classes)
    from dpcomm.trace.shipped import find_trace

    spec = spec.removeprefix(PREFIX)
    trace = load_trace(spec) if Path(spec).is_file() else find_trace(spec)
    return EmulatedModel(trace, num_classes)
