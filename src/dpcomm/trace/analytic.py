"""Analytic traces: per-layer FLOPs and bytes of a model, turned into times by a device preset (a roofline).

MG-WFBP (Eq. 18) models a layer's backward time as a function of the device's FLOP rate G and the layer's
size, ``t_b^(l) = T_b(p^(l), G, theta)``; its 64-node simulation replays K80 traces. We build such traces
without the hardware: per learnable layer ``l`` (forward order),

    f_l = max(F_l / (G * eta), B_l / (W * eta_mem))        forward
    b_l = max(2 F_l / (G * eta), 2 B_l / (W * eta_mem))    backward (1x instead of 2x for a layer whose input
                                                           needs no gradient, e.g. the first convolution)

with ``F_l`` the forward FLOPs, ``B_l`` the bytes moved (input + output activations + parameters, float32),
G the peak FP32 FLOP/s, W the memory bandwidth, and eta, eta_mem the fractions of peak reached (per preset).

FLOP conventions (a multiply-add counts as 2 FLOPs):

- convolution: ``2 * out.numel() * (C_in / groups) * prod(kernel)`` (+ ``out.numel()`` for the bias);
  transposed convolution: ``2 * in.numel() * (C_out / groups) * prod(kernel)`` (+ bias);
- linear: ``2 * out.numel() * in_features`` (+ ``out.numel()`` for the bias);
- batch/layer/group/instance norm in training: 5 FLOPs per element with an affine transform, 4 without (the
  DeepSpeed FLOPS profiler's convention);
- embedding: 0 (a gather); any other module owning parameters: ``2 * params * batch`` (each parameter used
  once per sample, as in a dense layer).

Backward = 2x forward: one product of the same size for the input gradient and one for the weight gradient
(Kaplan et al., "Scaling Laws for Neural Language Models", 2020, section 2.1: training compute ~ 3x forward;
Hobbhahn and Sevilla, "What's the backward-forward FLOP ratio for neural networks?", Epoch AI 2021: ~2:1).
Parameter-free operations (ReLU, pooling, concatenation, residual adds) are not counted: analytic times are a
lower bound on those steps.

Everything runs on the ``meta`` device: shapes only, no memory and no arithmetic, so VGG19-22K at batch 64
costs the same as LeNet-5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError, first_line
from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.trace.format import Layer, Trace

__all__ = [
    "DevicePreset",
    "DEVICE_PRESETS",
    "LayerCost",
    "layer_costs",
    "resolve_device",
    "analytic_trace",
    "trace_from_costs",
]

_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePreset:
    """A device's compute and memory rates for the roofline above."""

    name: str
    """Preset name (``k80``)."""
    peak_flops: float
    """Peak FP32 rate G, FLOP/s."""
    efficiency: float
    """Fraction eta of ``peak_flops`` that convolutions and matrix products reach in training."""
    mem_bw: float
    """Memory bandwidth W, bytes/s."""
    mem_efficiency: float
    """Fraction eta_mem of ``mem_bw`` that memory-bound layers (norms, small layers) reach."""
    source: str
    """Where the figures come from."""

    def __post_init__(self) -> None:
        for key in ("peak_flops", "mem_bw"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                raise ValueError(f"device preset {self.name}: {key} must be > 0")
        for key in ("efficiency", "mem_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"device preset {self.name}: {key} must be in (0, 1]")

    @property
    def flops(self) -> float:
        """Effective FLOP/s, ``G * eta``."""
        return self.peak_flops * self.efficiency

    @property
    def bandwidth(self) -> float:
        """Effective bytes/s, ``W * eta_mem``."""
        return self.mem_bw * self.mem_efficiency


DEVICE_PRESETS: dict[str, DevicePreset] = {
    p.name: p
    for p in (
        DevicePreset(
            name="k80",
            peak_flops=4.37e12,  # one GK210 (half a K80 board): 2496 cores x 2 FLOP x 875 MHz boost
            efficiency=0.30,
            mem_bw=240e9,  # half of the board's 480 GB/s
            mem_efficiency=0.6,
            source="NVIDIA Tesla K80 datasheet (8.73 TFLOP/s FP32 and 480 GB/s per 2-GPU board, boost "
            "clock); efficiency 0.30 calibrated so ResNet-50 at batch 32 gives ~0.65 s/iteration, i.e. the "
            "~49.5 images/s per K80 GPU of TensorFlow's 2017 benchmarks "
            "(tensorflow.org/performance/benchmarks, Google Compute Engine)",
        ),
        DevicePreset(
            name="v100",
            peak_flops=15.7e12,  # V100 SXM2 FP32, boost clock
            efficiency=0.5,
            mem_bw=900e9,
            mem_efficiency=0.7,
            source="NVIDIA V100 datasheet (SXM2: 15.7 TFLOP/s FP32, 900 GB/s HBM2); efficiencies assumed",
        ),
        DevicePreset(
            name="h100",
            peak_flops=66.9e12,  # H100 SXM5 FP32 on CUDA cores; TF32 tensor cores (not modelled) are faster
            efficiency=0.5,
            mem_bw=3.35e12,
            mem_efficiency=0.7,
            source="NVIDIA H100 datasheet (SXM5: 67 TFLOP/s FP32, 3.35 TB/s HBM3); efficiencies assumed",
        ),
        DevicePreset(
            name="cpu",
            peak_flops=100e9,  # reached by convolutions here (1 thread): efficiency 1 by construction
            efficiency=1.0,
            mem_bw=4e9,  # reached by batch norm (+ its ReLU) here, in this module's bytes convention
            mem_efficiency=1.0,
            source="measured, not a datasheet: one torch thread on the 2-core VM dpcomm was built on (torch "
            "2.13.0 CPU), from the shipped resnet50-cpu-b8 trace (convolutions ~102 GFLOP/s, batch norm "
            "~4 GB/s); see docs/traces.md",
        ),
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """FLOPs and bytes of one learnable layer for one forward and one backward pass."""

    name: str
    kind: str
    """Module class name (``Conv2d``)."""
    params: int
    fwd_flops: int
    bwd_flops: int
    fwd_bytes: int
    bwd_bytes: int


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, list | tuple):
        for item in obj:
            t = _first_tensor(item)
            if t is not None:
                return t
    return None


def _forward_flops(mod: nn.Module, x: torch.Tensor | None, out: torch.Tensor, params: int) -> int:
    if isinstance(mod, nn.modules.conv._ConvNd):
        k = math.prod(mod.kernel_size)
        bias = out.numel() if mod.bias is not None else 0
        if mod.transposed:
            return 2 * (x.numel() if x is not None else 0) * (mod.out_channels // mod.groups) * k + bias
        return 2 * out.numel() * (mod.in_channels // mod.groups) * k + bias
    if isinstance(mod, nn.Linear):
        return 2 * out.numel() * mod.in_features + (out.numel() if mod.bias is not None else 0)
    if isinstance(mod, _NORMS):
        affine = getattr(mod, "affine", getattr(mod, "elementwise_affine", True))
        return out.numel() * (5 if affine else 4)
    if isinstance(mod, nn.Embedding | nn.EmbeddingBag):
        return 0
    batch = x.shape[0] if x is not None and x.dim() > 0 else 1
    return 2 * params * batch


def layer_costs(module: nn.Module, example: Any, *, dtype_bytes: int = 4) -> list[LayerCost]:
    """Per learnable layer (forward order), FLOPs and bytes of its forward and backward pass.

    Runs one forward pass of ``module`` on ``example`` with grad enabled (use meta tensors to make it free).
    Layers that run several times add up; layers that never run cost 0.
    """
    layers = learnable_layers(module, example)
    owned = layer_params(module, layers)
    sizes = [sum(p.numel() for p in ps) for ps in owned]
    acc = [[0, 0, 0, 0] for _ in layers]  # fwd flops, bwd flops, fwd bytes, bwd bytes

    def _hook(i: int):
        def hook(mod: nn.Module, inputs: tuple, output: Any) -> None:
            x, out = _first_tensor(inputs), _first_tensor(output)
            if out is None:
                return
            f = _forward_flops(mod, x, out, sizes[i])
            nbytes = ((x.numel() if x is not None else 0) + out.numel() + sizes[i]) * dtype_bytes
            needs_input_grad = x is not None and x.requires_grad
            acc[i][0] += f
            acc[i][1] += f * (2 if needs_input_grad else 1)  # no input gradient: the weight gradient only
            acc[i][2] += nbytes
            acc[i][3] += nbytes * (2 if needs_input_grad else 1)

        return hook

    from dpcomm.utils.user_run import call

    handles = [mod.register_forward_hook(_hook(i)) for i, (_, mod) in enumerate(layers)]
    try:
        with torch.enable_grad():
            call(module, example)
    finally:
        for h in handles:
            h.remove()
    return [
        LayerCost(
            name=name, kind=type(mod).__name__, params=sizes[i],
            fwd_flops=a[0], bwd_flops=a[1], fwd_bytes=a[2], bwd_bytes=a[3],
        )
        for i, ((name, mod), a) in enumerate(zip(layers, acc, strict=True))
    ]  # fmt: skip


def resolve_device(device: str | DevicePreset) -> DevicePreset:
    """A preset by name (``k80``, ``analytic:k80``) or the preset itself; an unknown name is a UserError."""
    if isinstance(device, DevicePreset):
        return device
    key = device.removeprefix("analytic:").lower()
    if key not in DEVICE_PRESETS:
        raise UserError(f"unknown device preset {device!r}; choose one of: {', '.join(DEVICE_PRESETS)}")
    return DEVICE_PRESETS[key]


def trace_from_costs(
    costs: list[LayerCost], preset: DevicePreset, *, model: str, batch_size: int, dtype_bytes: int = 4
) -> Trace:
    """Turn per-layer costs into a trace with the roofline times of ``preset``."""

    def _time(flops: int, nbytes: int) -> float:
        return max(flops / preset.flops, nbytes / preset.bandwidth)

    layers = tuple(
        Layer(
            name=c.name,
            params=c.params,
            forward_s=_time(c.fwd_flops, c.fwd_bytes),
            backward_s=_time(c.bwd_flops, c.bwd_bytes),
            extra={"type": c.kind, "flops": c.fwd_flops, "backward_flops": c.bwd_flops},
        )
        for c in costs
    )
    return Trace(
        model=model,
        batch_size=batch_size,
        device=f"analytic:{preset.name}",
        dtype_bytes=dtype_bytes,
        layers=layers,
        extra={
            "analytic": {
                "peak_flops": preset.peak_flops,
                "efficiency": preset.efficiency,
                "mem_bw": preset.mem_bw,
                "mem_efficiency": preset.mem_efficiency,
                "source": preset.source,
            },
            "flops": sum(c.fwd_flops + c.bwd_flops for c in costs),
        },
    )


def analytic_trace(model: str, batch_size: int, device: str | DevicePreset = "k80") -> Trace:
    """The analytic trace of zoo model ``model`` at ``batch_size`` on a device preset (``device`` field
    ``analytic:<preset>``). Built on the meta device: no memory, no compute."""
    from dpcomm.models import example_input, get_model

    preset = resolve_device(device)
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}")
    with torch.device("meta"):
        net = get_model(model)
        example = example_input(model, batch_size, device="meta")  # token ids for a token model
    net.train()
    try:
        costs = layer_costs(net, example)
    except (ValueError, RuntimeError) as exc:  # e.g. batch norm refusing a batch of 1 in training
        raise UserError(f"{model} at batch size {batch_size}: {first_line(exc)}") from None
    return trace_from_costs(costs, preset, model=model, batch_size=batch_size)
