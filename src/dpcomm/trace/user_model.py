"""A user's own model for ``dpcomm profile``: ``package.module:Class``, its arguments, and example inputs.

**The model** is named as ``uvicorn`` and setuptools' entry points name an object: ``package.module:Attr``
(``Attr`` may be dotted, ``mymodels.gpt:Configs.small``). The attribute is called with the keyword arguments
of ``--model-args`` (a JSON object) and must return an ``nn.Module``: a class, or a function that builds one.
The current folder is put first on ``sys.path`` by the command line (as ``uvicorn --app-dir .`` does), so
``mymodel.py`` next to where you run ``dpcomm`` imports. A module that does not import, a missing attribute,
arguments the constructor refuses, or something that is not a module: one-line :class:`UserError`.

**Example inputs** (``--input``): one tensor per positional argument of ``forward``, in order, separated by
``;`` (or by ``,`` outside brackets)::

    float32[8,3,32,32]                      one image batch, standard normal
    long[4,128]:vocab=50257                 token ids, uniform in [0, 50257)
    long[4,128]:vocab=1000; float32[4,128]  two arguments

``DTYPE[D0,D1,...]``: the dtype is one of :data:`DTYPES` (``float32``, ``bf16``, ``long`` ...; left out:
float32). Floating tensors are standard normal draws; integer tensors need ``:vocab=N`` (uniform in
``[0, N)``, as token ids are); ``bool`` tensors are fair coin flips. The first input's first dimension is
the batch size the trace records. At most :data:`MAX_INPUTS` tensors of :data:`MAX_ELEMENTS` elements each.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError, first_line

__all__ = [
    "DTYPES",
    "MAX_ELEMENTS",
    "MAX_INPUTS",
    "InputSpec",
    "build_model",
    "is_user_model",
    "load_factory",
    "make_inputs",
    "parse_inputs",
    "parse_model_args",
]

DTYPES: dict[str, torch.dtype] = {
    **dict.fromkeys(("float32", "float", "fp32"), torch.float32),
    **dict.fromkeys(("bfloat16", "bf16"), torch.bfloat16),
    **dict.fromkeys(("float16", "half", "fp16"), torch.float16),
    **dict.fromkeys(("float64", "double", "fp64"), torch.float64),
    **dict.fromkeys(("int64", "long"), torch.int64),
    **dict.fromkeys(("int32", "int"), torch.int32),
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
"""Names an input's dtype may have (PyTorch's, and the usual short forms)."""
MAX_INPUTS = 16
"""Most example tensors (positional arguments of ``forward``)."""
MAX_ELEMENTS = 2**31
"""Most elements in one example tensor (8 GiB of float32): a typo such as ``[8,3,2240,2240]`` stops here."""

_SPEC = re.compile(r"^\s*([A-Za-z0-9_]*)\s*\[([^\]]*)\]\s*(?::\s*(.*?))?\s*$")


def is_user_model(name: str) -> bool:
    """``package.module:Class`` rather than a zoo name (zoo names have no ``:``)."""
    return ":" in name


def load_factory(spec: str) -> Callable[..., Any]:
    """The object ``package.module:Attr`` names (imported; not called)."""
    module_name, _, attr = spec.strip().partition(":")
    if (
        not module_name
        or not attr
        or not all(p.isidentifier() for p in (*module_name.split("."), *attr.split(".")))
    ):
        raise UserError(f"--model {spec!r}: write a zoo name or package.module:Class (see `dpcomm models`)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = "" if os.getcwd() in sys.path else " (is its folder on PYTHONPATH?)"
        raise UserError(
            f"--model {spec}: cannot import module {module_name!r}: {first_line(exc)}{where}"
        ) from None
    except (
        Exception
    ) as exc:  # the user's module raised while importing (a SyntaxError, a missing package ...)
        raise UserError(
            f"--model {spec}: importing module {module_name!r} failed: {first_line(exc, with_type=True)}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = sorted(
                n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, nn.Module)
            )
            listed = f" (nn.Module classes there: {', '.join(found[:8])})" if found else ""
            raise UserError(f"--model {spec}: module {module_name!r} has no attribute {attr!r}{listed}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"--model {spec}: {attr} is a {type(obj).__name__}, not a class or function")
    return obj


def parse_model_args(text: str | None) -> dict[str, Any]:
    """``--model-args``: a JSON object of keyword arguments (``{"n_layer": 2}``); None gives ``{}``."""
    if text is None:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--model-args is not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(obj, dict):
        raise UserError(f"--model-args must be a JSON object of keyword arguments, got {type(obj).__name__}")
    return obj


def build_model(spec: str, kwargs: dict[str, Any] | None = None) -> nn.Module:
    """Import ``spec`` (``package.module:Class``) and call it with ``kwargs``: the user's ``nn.Module``, built
    on torch's current default device (under ``torch.device("meta")``: shapes only)."""
    factory = load_factory(spec)
    try:
        model = factory(**(kwargs or {}))
    except Exception as exc:  # a wrong keyword, or the constructor's own check
        raise UserError(f"--model {spec}: building it failed: {first_line(exc, with_type=True)}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {spec}: calling it gave a {type(model).__name__}, not a torch.nn.Module")
    return model


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpec:
    """One example tensor."""

    dtype: torch.dtype
    """Its dtype."""
    shape: tuple[int, ...]
    """Its shape (every dimension >= 1)."""
    vocab: int | None = None
    """Integer tensors: values are uniform in ``[0, vocab)``."""

    def __post_init__(self) -> None:
        if any(d < 1 for d in self.shape):
            raise UserError(f"input shape {list(self.shape)}: every dimension must be >= 1")
        if math.prod(self.shape) > MAX_ELEMENTS:
            raise UserError(f"input shape {list(self.shape)}: more than {MAX_ELEMENTS:,} elements")
        integer = not self.dtype.is_floating_point and self.dtype is not torch.bool
        if integer and self.vocab is None:
            raise UserError(f"an input of dtype {self.dtype} needs :vocab=N (values uniform in [0, N))")
        if self.vocab is not None and (not integer or self.vocab < 1):
            raise UserError(f"vocab={self.vocab}: only an integer input takes vocab, and it must be >= 1")
        if integer and self.vocab - 1 > torch.iinfo(self.dtype).max:
            raise UserError(f"vocab={self.vocab} does not fit dtype {self.dtype}")

    def __str__(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        dims = ",".join(str(d) for d in self.shape)
        return f"{name}[{dims}]" + (f":vocab={self.vocab}" if self.vocab is not None else "")


def _split(text: str) -> list[str]:
    """Split at ``;``, and at ``,`` outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == ";" or (ch == "," and depth == 0):
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _one(text: str) -> InputSpec:
    m = _SPEC.match(text)
    if m is None:
        raise UserError(
            f"--input {text!r}: write DTYPE[D0,D1,...] with an optional :vocab=N (long[4,128]:vocab=1000)"
        )
    name, dims, opts = m.group(1).lower() or "float32", m.group(2), m.group(3)
    if name not in DTYPES:
        raise UserError(f"--input {text!r}: unknown dtype {name!r}; choose one of: {', '.join(DTYPES)}")
    try:
        shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise UserError(f"--input {text!r}: dimensions must be whole numbers") from None
    if not shape:
        raise UserError(f"--input {text!r}: give at least one dimension (the batch)")
    vocab = None
    for opt in filter(None, (o.strip() for o in (opts or "").split(":"))):
        key, eq, value = opt.partition("=")
        if key.strip() != "vocab" or not eq or not value.strip().isdigit():
            raise UserError(f"--input {text!r}: unknown option {opt!r} (the only one is vocab=N)")
        vocab = int(value)
    try:
        return InputSpec(dtype=DTYPES[name], shape=shape, vocab=vocab)
    except UserError as exc:
        raise UserError(f"--input {text!r}: {exc}") from None


def parse_inputs(text: str) -> tuple[InputSpec, ...]:
    """``--input``'s reader (module docstring)."""
    specs = tuple(_one(part) for part in _split(text))
    if not specs:
        raise UserError("--input is empty: give one tensor per argument of forward, e.g. float32[8,3,32,32]")
    if len(specs) > MAX_INPUTS:
        raise UserError(f"--input: {len(specs)} tensors, more than {MAX_INPUTS}")
    return specs


def make_inputs(
    specs: tuple[InputSpec, ...],
    *,
    device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Random tensors for ``specs``: one tensor, or a tuple where there are several (what the profiler
    passes as ``forward``'s positional arguments). On ``meta``, shapes only."""
    out = []
    for s in specs:
        if s.dtype.is_floating_point:
            t = torch.randn(s.shape, device=device, generator=generator).to(s.dtype)
        elif s.dtype is torch.bool:
            t = torch.randint(0, 2, s.shape, device=device, generator=generator).bool()
        else:
            t = torch.randint(0, s.vocab or 1, s.shape, device=device, generator=generator, dtype=s.dtype)
        out.append(t)
    return out[0] if len(out) == 1 else tuple(out)
