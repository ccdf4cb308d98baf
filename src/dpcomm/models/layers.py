"""The learnable layer, the unit ``l`` of the papers: a module that directly owns parameters.

Weight and bias of a layer go together. Layers are listed in *forward order*, taken from the order in
which modules first run in a forward pass when an example input is given (so a model whose ``__init__``
order differs from its ``forward`` still gets the papers' order), else in registration order.
Parameters shared by several modules belong to the first layer that owns them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["learnable_layers", "layer_params"]


def _owners(module: nn.Module) -> list[tuple[str, nn.Module]]:
    seen: set[int] = set()
    out = []
    for name, mod in module.named_modules():
        own = [p for p in mod.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        if own:
            seen.update(id(p) for p in own)
            out.append((name or type(module).__name__, mod))
    return out


def learnable_layers(module: nn.Module, example: Any | None = None) -> list[tuple[str, nn.Module]]:
    """``[(name, submodule), ...]`` of the layers owning trainable parameters, in forward order.

    With ``example`` (a tensor or tuple of tensors) one no-grad forward pass orders the layers by first call;
    layers never called keep registration order after the called ones.
    """
    owners = _owners(module)
    if example is None:
        return owners
    order: dict[int, int] = {}

    def _first_call(m: nn.Module, _inputs: Any) -> None:  # must return None: a value would replace the inputs
        order.setdefault(id(m), len(order))

    hooks = [mod.register_forward_pre_hook(_first_call) for _, mod in owners]
    try:
        with torch.no_grad():
            module(*example) if isinstance(example, tuple) else module(example)
    finally:
        for h in hooks:
            h.remove()
    rank = {id(m): i for i, (_, m) in enumerate(owners)}
    return sorted(owners, key=lambda nm: order.get(id(nm[1]), len(order) + rank[id(nm[1])]))


def layer_params(module: nn.Module, layers: list[tuple[str, nn.Module]]) -> list[list[nn.Parameter]]:
    """Per layer, the trainable parameters it owns (first owner wins for shared parameters)."""
    seen: set[int] = set()
    out = []
    for _, mod in layers:
        own = [p for p in mod.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in own)
        out.append(own)
    return out
