"""The trace format every planner, the simulator and the tests read.

A trace lists the *learnable layers* of a model in forward order (``l = 0..L-1`` in the papers' notation;
see :func:`dpcomm.models.learnable_layers`) with, per layer, its parameter count ``p_l`` and its measured
forward and backward times ``f_l``/``b_l`` in seconds (MG-WFBP Table I calls them t_f^(l) and t_b^(l))::

    {"format": "dpcomm-trace/1", "model": "resnet50", "batch_size": 32, "device": "cpu", "dtype_bytes": 4,
     "layers": [{"name": "conv1", "params": 9408, "forward_s": 0.0012, "backward_s": 0.0025}, ...]}

Extra fields are allowed and kept in ``Trace.extra`` / ``Layer.extra``.

``dpcomm-trace/2`` (written when the layers are gradient units, see :mod:`dpcomm.trace.units`) is the same
object whose layers are *units*: the parameters whose gradients become ready together, in forward order
(unit ``L-1`` ready first). Each layer carries ``param_names`` (its parameters' names in the model, as
``named_parameters()`` gives them; at least one, unique across the trace), so that DDP's buckets and every
runtime can find a unit's tensors, and may carry ``unused: true`` (no gradient in the profiled backward)::

    {"format": "dpcomm-trace/2", ..., "layers": [{"name": "wte", "params": 32768, "forward_s": 1e-05,
     "backward_s": 2e-05, "param_names": ["wte.weight"]}, ...]}

``dpcomm-trace/1`` files are read as they are (layer-level: units = learnable layers, no names); a trace
without names or unused units is written as ``/1``, so layer-level traces keep their format.

Limits, checked when a trace is read (a file of at most 64 MiB, :data:`dpcomm.utils.io.MAX_JSON_BYTES`):
at most :data:`MAX_LAYERS` layers, :data:`MAX_PARAMS` parameters in all (so every byte count the planners
and simulators compute fits an int64 and a float exactly), ``dtype_bytes`` up to :data:`MAX_DTYPE_BYTES`,
``batch_size`` up to :data:`MAX_BATCH`, and each time up to :data:`MAX_SECONDS`. Layer names are unique (a
plan, a per-block FSDP unit and a report name layers by them); the profiler's whole-iteration times
(``iteration_forward_s``, ``iteration_backward_s``), where present, are finite numbers >= 0 as the layers'.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcomm.errors import UserError
from dpcomm.utils.io import atomic_write_json, read_json

__all__ = [
    "MAX_BATCH",
    "MAX_DTYPE_BYTES",
    "MAX_LAYERS",
    "MAX_PARAMS",
    "MAX_SECONDS",
    "TRACE_FORMAT",
    "TRACE_FORMATS",
    "Layer",
    "Trace",
    "load_trace",
    "save_trace",
    "trace_from_dict",
]

TRACE_FORMAT = "dpcomm-trace/2"
"""The format written for a trace of gradient units (layers with ``param_names``)."""
TRACE_FORMATS = ("dpcomm-trace/1", TRACE_FORMAT)
"""Formats read."""
MAX_PARAMS = 10**13
"""Most parameters in a trace (all layers): 10 trillion, 10x today's largest models; x 16 bytes < 2**53."""
MAX_LAYERS = 100_000
"""Most layers in a trace (the zoo's largest has 194; the exact planner is quadratic in layers)."""
MAX_DTYPE_BYTES = 16
"""Widest gradient element, bytes (complex128)."""
MAX_BATCH = 2**31 - 1
"""Largest per-worker batch size."""
MAX_SECONDS = 86_400.0
"""Longest forward or backward time of one layer, seconds (a day)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One learnable layer."""

    name: str
    """Module path of the layer in its model (``features.0``)."""
    params: int
    """Number of learnable parameters p_l (weight and bias together)."""
    forward_s: float
    """Forward time f_l, seconds."""
    backward_s: float
    """Backward time b_l, seconds (gradient of the inputs and of the parameters)."""
    param_names: tuple[str, ...] = ()
    """``dpcomm-trace/2``: the unit's parameters by name in the model (empty: a layer-level trace)."""
    unused: bool = False
    """``dpcomm-trace/2``: no gradient in the profiled backward (a unit of unused parameters)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields beyond the format's, kept as read (e.g. ``flops``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_names", tuple(self.param_names))
        if self.params < 0:
            raise ValueError(f"layer {self.name}: params must be >= 0")
        for key in ("forward_s", "backward_s"):
            v = getattr(self, key)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"layer {self.name}: {key} must be a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A model's learnable layers in forward order, with their sizes and times."""

    model: str
    """Model name (a zoo name or the user's)."""
    batch_size: int
    """Per-worker mini-batch size the times were measured at."""
    device: str
    """Where it was measured or modelled: ``cpu``, ``cuda:NVIDIA H100``, ``analytic:k80`` ..."""
    dtype_bytes: int
    """Bytes per gradient element on the wire (4 for float32)."""
    layers: tuple[Layer, ...]
    """Learnable layers, forward order."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a trace needs at least one layer")
        names = [n for layer in self.layers for n in layer.param_names]
        if len(names) != len(set(names)):
            raise ValueError("a parameter name appears in two units of the trace")
        if self.batch_size < 1 or self.dtype_bytes < 1:
            raise ValueError("batch_size and dtype_bytes must be >= 1")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def t_f(self) -> float:
        """Forward time of one iteration, seconds."""
        return sum(layer.forward_s for layer in self.layers)

    @property
    def t_b(self) -> float:
        """Backward time of one iteration, seconds."""
        return sum(layer.backward_s for layer in self.layers)

    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def has_units(self) -> bool:
        """Every layer names its parameters (a ``dpcomm-trace/2`` of gradient units)."""
        return all(layer.param_names for layer in self.layers)

    def layer_bytes(self, l: int) -> int:
        """Bytes of layer ``l``'s gradient on the wire."""
        return self.layers[l].params * self.dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        v2 = any(layer.param_names or layer.unused for layer in self.layers)
        return {
            "format": TRACE_FORMAT if v2 else TRACE_FORMATS[0],
            "model": self.model,
            "batch_size": self.batch_size,
            "device": self.device,
            "dtype_bytes": self.dtype_bytes,
            **self.extra,
            "layers": [
                {
                    "name": layer.name,
                    "params": layer.params,
                    "forward_s": layer.forward_s,
                    "backward_s": layer.backward_s,
                    **({"param_names": list(layer.param_names)} if layer.param_names else {}),
                    **({"unused": True} if layer.unused else {}),
                    **layer.extra,
                }
                for layer in self.layers
            ],
        }


_TOP = {"model": str, "batch_size": int, "device": str, "dtype_bytes": int}
_LAYER = {"name": str, "params": int, "forward_s": float, "backward_s": float}
_V2 = ("param_names", "unused")
_ITERATION = ("iteration_forward_s", "iteration_backward_s")  # dpcomm.trace.profiler's whole-iteration times


def _shown(value: Any) -> str:
    """``value`` quoted for a one-line message (a number of hundreds of digits is cut)."""
    text = (
        repr(value)
        if not isinstance(value, int) or abs(value) < 10**30
        else f"about 10**{len(str(abs(value))) - 1}"
    )
    return text if len(text) <= 60 else f"{text[:57]}..."


def _check(value: Any, kind: type, where: str, source: str, *, most: int | None = None) -> Any:
    """``value`` if it is a ``kind`` (a float: finite, >= 0; an int: >= 0, or from 1 to ``most``)."""
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise UserError(f"{source}: field '{where}' must be {kind.__name__}, got {_shown(value)}")
    if kind is float and (not math.isfinite(value) or value < 0):
        raise UserError(f"{source}: field '{where}' must be a finite number >= 0, got {value!r}")
    if kind is int and most is not None and not 1 <= value <= most:
        raise UserError(f"{source}: field '{where}' must be from 1 to {most:,}, got {_shown(value)}")
    if kind is int and value < 0:
        raise UserError(f"{source}: field '{where}' must be >= 0, got {value!r}")
    return value


def trace_from_dict(obj: Any, source: str = "trace") -> Trace:
    """Validate a parsed trace; a problem is a one-line :class:`UserError` naming ``source`` and the field."""
    if not isinstance(obj, dict):
        raise UserError(f"{source}: a trace is a JSON object")
    if obj.get("format") not in TRACE_FORMATS:
        raise UserError(
            f"{source}: field 'format' must be '{TRACE_FORMATS[0]}' or '{TRACE_FORMAT}', "
            f"got {_shown(obj.get('format'))}"
        )
    v2 = obj["format"] == TRACE_FORMAT
    own = (*_LAYER, *_V2) if v2 else tuple(_LAYER)
    most = {"batch_size": MAX_BATCH, "dtype_bytes": MAX_DTYPE_BYTES}
    for key, kind in _TOP.items():
        if key not in obj:
            raise UserError(f"{source}: missing field '{key}'")
        _check(obj[key], kind, key, source, most=most.get(key))
    for key in _ITERATION:
        if key in obj:
            _check(obj[key], float, key, source)
    layers = obj.get("layers")
    if not isinstance(layers, list):
        raise UserError(f"{source}: missing field 'layers' (a list)")
    if not layers:
        raise UserError(f"{source}: field 'layers' is empty (a trace needs at least one layer)")
    if len(layers) > MAX_LAYERS:
        raise UserError(f"{source}: {len(layers):,} layers, more than the {MAX_LAYERS:,} a trace may have")
    parsed, total, names, seen = [], 0, set(), {}
    for i, item in enumerate(layers):
        if not isinstance(item, dict):
            raise UserError(f"{source}: field 'layers[{i}]' must be an object")
        for key, kind in _LAYER.items():
            if key not in item:
                raise UserError(f"{source}: missing field 'layers[{i}].{key}'")
            _check(item[key], kind, f"layers[{i}].{key}", source)
        if item["name"] in seen:
            raise UserError(
                f"{source}: field 'layers[{i}].name' repeats the name {_shown(item['name'])} of "
                f"layers[{seen[item['name']]}] (layer names are unique)"
            )
        seen[item["name"]] = i
        total += item["params"]
        if total > MAX_PARAMS:
            raise UserError(
                f"{source}: field 'layers[{i}].params' brings the trace to more than {MAX_PARAMS:,} "
                f"parameters (got {_shown(item['params'])})"
            )
        for key in ("forward_s", "backward_s"):
            if item[key] > MAX_SECONDS:
                raise UserError(
                    f"{source}: field 'layers[{i}].{key}' must be at most {MAX_SECONDS:g} s, "
                    f"got {item[key]!r}"
                )
        pnames = item.get("param_names", []) if v2 else []
        if not isinstance(pnames, list) or not all(isinstance(n, str) and n for n in pnames):
            raise UserError(f"{source}: field 'layers[{i}].param_names' must be a list of parameter names")
        if names & set(pnames) or len(set(pnames)) != len(pnames):
            raise UserError(f"{source}: field 'layers[{i}].param_names' repeats a parameter of the trace")
        names.update(pnames)
        unused = item.get("unused", False) if v2 else False
        if not isinstance(unused, bool):
            raise UserError(
                f"{source}: field 'layers[{i}].unused' must be true or false, got {_shown(unused)}"
            )
        if v2 and not pnames:  # a unit holds at least one parameter (dpcomm.trace.units)
            raise UserError(
                f"{source}: field 'layers[{i}].param_names' is missing or empty: each unit of a "
                f"'{TRACE_FORMAT}' trace names its parameters"
            )
        parsed.append(
            Layer(
                name=item["name"],
                params=item["params"],
                forward_s=float(item["forward_s"]),
                backward_s=float(item["backward_s"]),
                param_names=tuple(pnames),
                unused=unused,
                extra={k: v for k, v in item.items() if k not in own},
            )
        )
    extra = {k: v for k, v in obj.items() if k not in _TOP and k not in ("format", "layers")}
    return Trace(
        model=obj["model"],
        batch_size=obj["batch_size"],
        device=obj["device"],
        dtype_bytes=obj["dtype_bytes"],
        layers=tuple(parsed),
        extra=extra,
    )


def load_trace(path: str | os.PathLike) -> Trace:
    """Read and validate a trace file (see module docstring)."""
    return trace_from_dict(read_json(path), source=str(path))


def save_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Write a trace atomically."""
    return atomic_write_json(path, trace.to_dict())
