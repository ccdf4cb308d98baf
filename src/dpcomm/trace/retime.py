"""A trace re-timed for another device, and its gradient bytes re-typed for the dtype the reduction uses.

**Re-timing** (:func:`retime`) rewrites every layer's forward and backward time ``f_l``, ``b_l`` two ways:

- an *analytic target* (:data:`TARGETS`, ``h100-bf16``): the roofline of :mod:`dpcomm.trace.analytic` at the
  target's tensor-core rate, per row ``l`` of the trace::

      f_l = max(F_l / (G * eta), B_l / (W * eta_mem)),   b_l = max(F'_l / (G * eta), B'_l / (W * eta_mem))

  with ``F_l``, ``F'_l`` the forward and backward FLOPs and ``B_l``, ``B'_l`` the bytes moved at the target's
  element size (2 for bf16). FLOPs and bytes come from the model (:func:`row_costs`: a meta-device pass,
  no memory, no arithmetic; the trace's own zoo model when it names one); without a model, from the
  trace's per-layer ``flops`` (the profiler writes them; backward ``backward_flops`` or 2x forward) and no
  memory term, which the result says. As in the analytic model, parameter-free work (activations, the
  attention's score products and softmax, residual adds) is not counted: the times are a lower bound there.
  Against the shipped bf16 H200 traces (``docs/traces.md``): 0.86 of TinyLlama-1.1B's measured per-layer sums,
  0.62-0.64 of BERT-base's and ViT-B/16's, and far less for small models, whose layers cost 44-261 us per
  pass of hooks and launches beyond the roofline: measure those, or use a measured scale.
- a *measured scale* (:func:`parse_retime`): ``scale:F`` (every time x F), ``scale:F,B`` (forward x F,
  backward x B), or ``ratio:TARGET,SOURCE``: the factors are the ratios of two traces of one model at one
  batch size measured on the two devices (``t_f`` to ``t_f``, ``t_b`` to ``t_b``), files or shipped names.

Either way the trace's rows, parameters and names are kept; the source's whole-iteration times
(``iteration_*_s``) are scaled with a scale and dropped by an analytic target (they were the source
device's); ``extra["retime"]`` says what was done and from what.

**Gradient bytes** (:func:`with_reduce_dtype`): ``dtype_bytes`` is the bytes of one gradient element on the
wire. Mixed precision decides it, not the parameters' dtype: ``torch.autocast`` keeps fp32 parameters and
gradients (4 bytes); a model cast to bf16 reduces 2-byte gradients; FSDP2's
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`` (torchtitan's default,
``mixed_precision_reduce = "float32"``) gathers 2-byte parameters and reduce-scatters 4-byte gradients. The
re-typed trace keeps the parameters' element size as ``extra["param_dtype_bytes"]``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from dpcomm.errors import UserError
from dpcomm.trace.analytic import DevicePreset, LayerCost
from dpcomm.trace.format import Layer, Trace, load_trace

__all__ = [
    "REDUCE_DTYPES",
    "TARGETS",
    "Scale",
    "Target",
    "load_trace_spec",
    "parse_retime",
    "retime",
    "row_costs",
    "with_reduce_dtype",
]

_ETA_BF16 = 0.5
# Fraction of the dense bf16 tensor-core peak that a learnable layer's matrix products reach in training.
# Source: MosaicML llm-foundry, scripts/train/benchmarking/README.md, table "H100 80GB BF16": end-to-end MFU
# (model FLOPs of the matrix products / (989 TFLOP/s x time)) of 26-46% for MPT 760M-70B on 8-64 H100s with
# FSDP, 46.4% for MPT-7B at sequence 2048 without activation checkpointing. That time also holds the norms,
# activations and exposed communication, so the products alone run at least that fast: 0.5, rounded up.
_ETA_MEM = 0.7  # fraction of HBM bandwidth for memory-bound layers: assumed, as the analytic h100 preset


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """An analytic target: a device's roofline rates and the element size its layers read and write."""

    preset: DevicePreset
    """Rates (``peak_flops`` is the tensor-core peak of the compute dtype) and their source."""
    element_bytes: int
    """Bytes of one activation or parameter element as the layers compute (2 for bf16)."""

    @property
    def name(self) -> str:
        return self.preset.name


@dataclass(frozen=True, slots=True, kw_only=True)
class Scale:
    """A measured scale: forward times x ``forward``, backward times x ``backward``."""

    forward: float
    backward: float
    label: str
    """What it came from (``0.05``, ``resnet20-h100-b128,resnet20-cpu-b128``)."""

    def __post_init__(self) -> None:
        for v in (self.forward, self.backward):
            if not (math.isfinite(v) and v > 0):
                raise UserError(f"retime scale {self.label}: factors must be finite numbers > 0, got {v!r}")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            preset=DevicePreset(
                name="h100-bf16",
                peak_flops=989.4e12,  # FLOP/s, H100 SXM5 dense BF16 tensor cores (1,978.9 with sparsity)
                efficiency=_ETA_BF16,
                mem_bw=3.35e12,  # bytes/s, HBM3
                mem_efficiency=_ETA_MEM,
                source="NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOP/s dense BF16, 3.35 TB/s "
                "HBM3); eta 0.5 from llm-foundry's H100 BF16 MFU table (26-46% end to end); eta_mem assumed",
            ),
            element_bytes=2,
        ),
        Target(
            preset=DevicePreset(
                name="h200-bf16",
                peak_flops=989.4e12,  # FLOP/s, the H100's GH100 compute: H200 SXM dense BF16
                efficiency=_ETA_BF16,
                mem_bw=4.8e12,  # bytes/s, HBM3e
                mem_efficiency=_ETA_MEM,
                source="NVIDIA H200 datasheet (SXM: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e); efficiencies "
                "as h100-bf16's",
            ),
            element_bytes=2,
        ),
    )
}
"""Analytic targets by name."""

REDUCE_DTYPES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
"""Bytes per gradient element by the reduction's dtype."""


def load_trace_spec(spec: str) -> Trace:
    """A trace file, or a shipped trace by name (:func:`dpcomm.trace.find_trace`) where there is no file."""
    from dpcomm.trace.shipped import find_trace

    return load_trace(spec) if os.path.exists(spec) or spec.endswith(".json") else find_trace(spec)


def _factor(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"--retime {what}: {text!r} is not a number") from None


def parse_retime(text: str) -> Target | Scale:
    """``--retime``'s reader: a target name (:data:`TARGETS`), ``scale:F``, ``scale:F,B`` or
    ``ratio:TARGET_TRACE,SOURCE_TRACE`` (module docstring)."""
    kind, sep, arg = text.strip().partition(":")
    if not sep and kind.lower() in TARGETS:
        return TARGETS[kind.lower()]
    if kind == "scale" and arg:
        parts = arg.split(",")
        if len(parts) > 2:
            raise UserError(f"--retime {text}: write scale:F or scale:F,B (forward, backward)")
        f = _factor(parts[0], text)
        return Scale(forward=f, backward=_factor(parts[-1], text), label=arg)
    if kind == "ratio" and arg.count(",") == 1:
        target, source = (load_trace_spec(s.strip()) for s in arg.split(","))
        if (target.model, target.batch_size) != (source.model, source.batch_size):
            raise UserError(
                f"--retime {text}: the two traces must be of one model at one batch size, got "
                f"{target.model} b{target.batch_size} and {source.model} b{source.batch_size}"
            )
        if min(source.t_f, source.t_b) <= 0:
            raise UserError(f"--retime {text}: the source trace has a zero forward or backward time")
        return Scale(forward=target.t_f / source.t_f, backward=target.t_b / source.t_b, label=arg)
    raise UserError(
        f"--retime {text!r}: choose a target ({', '.join(TARGETS)}), scale:F[,B] or ratio:TARGET,SOURCE"
    )


def _unit_module(layer: Layer, names: set[str]) -> str | None:
    """The learnable layer (module path) a trace row belongs to: its name less a ``[pre]``-style suffix,
    else the module owning its first parameter."""
    base = layer.name.split("[", 1)[0]
    if base in names:
        return base
    for pname in layer.param_names:
        owner = pname.rpartition(".")[0]
        if owner in names:
            return owner
    return None


def row_costs(trace: Trace, model: Any, example: Any, element_bytes: int) -> list[LayerCost]:
    """FLOPs and bytes per row of ``trace`` from ``model`` on ``example`` (one pass; on the meta device it
    costs nothing): each learnable layer's (:func:`dpcomm.trace.analytic.layer_costs`) split over its rows by
    parameters, as the profiler splits a layer's time over its gradient units."""
    from dpcomm.trace.analytic import layer_costs

    try:
        costs = {c.name: c for c in layer_costs(model, example, dtype_bytes=element_bytes)}
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        from dpcomm.errors import first_line

        raise UserError(f"counting {trace.model}'s FLOPs failed: {first_line(exc, with_type=True)}") from None
    owner = [_unit_module(layer, set(costs)) for layer in trace.layers]
    missing = [layer.name for layer, o in zip(trace.layers, owner, strict=True) if o is None]
    if missing:
        raise UserError(
            f"trace of {trace.model}: {len(missing)} rows are no learnable layer of the model given "
            f"({', '.join(missing[:4])}): is it the trace's model?"
        )
    held: dict[str, list[int]] = {}
    for layer, o in zip(trace.layers, owner, strict=True):
        held.setdefault(o, []).append(layer.params)
    out = []
    for layer, o in zip(trace.layers, owner, strict=True):
        c, total = costs[o], sum(held[o])
        share = layer.params / total if total else 1 / len(held[o])
        out.append(
            LayerCost(
                name=layer.name, kind=c.kind, params=layer.params,
                fwd_flops=round(c.fwd_flops * share), bwd_flops=round(c.bwd_flops * share),
                fwd_bytes=round(c.fwd_bytes * share), bwd_bytes=round(c.bwd_bytes * share),
            )
        )  # fmt: skip
    return out


def _trace_flops(trace: Trace) -> list[LayerCost]:
    """Costs from the trace's own ``flops`` fields (no bytes: no memory term)."""
    if not any("flops" in layer.extra for layer in trace.layers):
        raise UserError(
            f"trace of {trace.model} has no per-layer FLOPs and {trace.model!r} is no zoo model: give "
            "--model (and --input) to count them"
        )
    out = []
    for layer in trace.layers:
        f = int(layer.extra.get("flops", 0))
        b = int(layer.extra.get("backward_flops", 2 * f))  # backward = 2x forward (dpcomm.trace.analytic)
        out.append(LayerCost(name=layer.name, kind=str(layer.extra.get("type", "")), params=layer.params,
                             fwd_flops=f, bwd_flops=b, fwd_bytes=0, bwd_bytes=0))  # fmt: skip
    return out


def _zoo_costs(trace: Trace, element_bytes: int) -> list[LayerCost] | None:
    """Costs from the trace's own model, when it is a zoo name (built on the meta device)."""
    import torch

    from dpcomm.models import MODELS, example_input, get_model

    if trace.model not in MODELS:
        return None
    with torch.device("meta"):
        model = get_model(trace.model)
        example = example_input(trace.model, trace.batch_size, device="meta")
    model.train()
    return row_costs(trace, model, example, element_bytes)


def retime(trace: Trace, how: str | Target | Scale, *, costs: list[LayerCost] | None = None) -> Trace:
    """``trace`` re-timed (module docstring). ``how``: a target name, ``scale:...``/``ratio:...``, or a parsed
    :class:`Target`/:class:`Scale`. ``costs`` (one per row, :func:`row_costs`) are for a target; left out,
    they come from the trace's zoo model, else from its per-layer ``flops``."""
    how = parse_retime(how) if isinstance(how, str) else how
    before = {"device": trace.device, "t_f": trace.t_f, "t_b": trace.t_b}
    extra = {k: v for k, v in trace.extra.items() if k != "retime"}
    if isinstance(how, Scale):
        layers = tuple(
            dataclasses.replace(
                x, forward_s=x.forward_s * how.forward, backward_s=x.backward_s * how.backward
            )
            for x in trace.layers
        )
        for key, f in (("iteration_forward_s", how.forward), ("iteration_backward_s", how.backward)):
            if key in extra:
                extra[key] *= f
        info = {"scale": [how.forward, how.backward], "from_scale": how.label, "before": before}
        return dataclasses.replace(
            trace, layers=layers, device=f"scaled:{trace.device}", extra={**extra, "retime": info}
        )
    memory = "model"
    if costs is None:
        costs = _zoo_costs(trace, how.element_bytes)
    if costs is None:
        costs, memory = _trace_flops(trace), "none: the trace's FLOPs only (give --model for the bytes)"
    if len(costs) != trace.num_layers:
        raise UserError(f"retime: {len(costs)} costs for the {trace.num_layers} rows of the trace")
    g, w = how.preset.flops, how.preset.bandwidth  # FLOP/s and bytes/s reached: peak x eta

    def _t(flops: int, nbytes: int) -> float:
        return max(flops / g, nbytes / w)

    layers = tuple(
        dataclasses.replace(
            x,
            forward_s=_t(c.fwd_flops, c.fwd_bytes),
            backward_s=0.0 if x.unused else _t(c.bwd_flops, c.bwd_bytes),
            extra={**x.extra, "flops": c.fwd_flops, "backward_flops": c.bwd_flops},
        )
        for x, c in zip(trace.layers, costs, strict=True)
    )
    for key in ("iteration_forward_s", "iteration_backward_s"):
        extra.pop(key, None)  # the source device's whole iterations
    p = how.preset
    info = {
        "target": p.name, "peak_flops": p.peak_flops, "efficiency": p.efficiency, "mem_bw": p.mem_bw,
        "mem_efficiency": p.mem_efficiency, "element_bytes": how.element_bytes, "source": p.source,
        "memory_term": memory, "before": before,
    }  # fmt: skip
    return dataclasses.replace(
        trace, layers=layers, device=f"analytic:{p.name}", extra={**extra, "retime": info}
    )


def with_reduce_dtype(trace: Trace, dtype: str | int) -> Trace:
    """``trace`` with ``dtype_bytes`` set for a reduction in ``dtype`` (``bf16``, ``fp32`` ..., or bytes);
    the parameters' element size stays in ``extra["param_dtype_bytes"]`` (module docstring)."""
    if isinstance(dtype, str):
        if dtype.lower() not in REDUCE_DTYPES:
            raise UserError(f"unknown reduce dtype {dtype!r}; choose one of: {', '.join(REDUCE_DTYPES)}")
        nbytes, name = REDUCE_DTYPES[dtype.lower()], dtype.lower()
    else:
        nbytes, name = int(dtype), f"{int(dtype)} bytes"
        if nbytes not in (1, 2, 4, 8):
            raise UserError(f"reduce dtype of {dtype} bytes: use 1, 2, 4 or 8")
    extra = {**trace.extra, "reduce_dtype": name}
    extra.setdefault("param_dtype_bytes", trace.dtype_bytes)
    return dataclasses.replace(trace, dtype_bytes=nbytes, extra=extra)
