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

__all__ = ["call_order", "called_ancestor", "layer_params", "layers_in_call_order", "learnable_layers"]


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

    With ``example`` (a tensor or tuple of tensors) one no-grad forward pass orders the layers by first call.
    A layer whose own forward never runs has its parameters used inline by an ancestor that does run
    (``nn.MultiheadAttention`` applies ``out_proj``'s weight itself): it goes right after that ancestor's
    first call (:func:`called_ancestor`); a layer no called ancestor holds (an unused head) goes last, in
    registration order.
    """
    if example is None:
        return _owners(module)
    return layers_in_call_order(module, call_order(module, example))


def layers_in_call_order(module: nn.Module, order: dict[int, int]) -> list[tuple[str, nn.Module]]:
    """:func:`learnable_layers` sorted by a :func:`call_order` already taken (one forward for both)."""
    owners = _owners(module)
    names = {id(m): n for n, m in module.named_modules()}
    rank = {id(m): i for i, (_, m) in enumerate(owners)}

    def key(nm: tuple[str, nn.Module]) -> tuple[float, int]:
        name, m = nm
        if id(m) in order:
            return (order[id(m)], 0)
        anc = called_ancestor(module, names.get(id(m), name), order)
        return (order[id(anc)] + 0.5, rank[id(m)]) if anc is not None else (len(order) + rank[id(m)], 0)

    return sorted(owners, key=key)


def call_order(module: nn.Module, example: Any) -> dict[int, int]:
    """``id(submodule) -> index of its first call`` in one no-grad forward of ``example`` (every module)."""
    from dpcomm.utils.user_run import call

    order: dict[int, int] = {}

    def _first_call(m: nn.Module, _inputs: Any) -> None:  # must return None: a value would replace the inputs
        order.setdefault(id(m), len(order))

    hooks = [mod.register_forward_pre_hook(_first_call) for mod in module.modules()]
    try:
        with torch.no_grad():
            call(module, example)
    finally:
        for h in hooks:
            h.remove()
    return order


def called_ancestor(module: nn.Module, name: str, order: dict[int, int]) -> nn.Module | None:
    """The nearest proper ancestor of submodule ``name`` (dotted) whose forward ran (``id`` in ``order``),
    the root included; None if none did."""
    parts = name.split(".") if name else []
    while parts:
        parts = parts[:-1]
        anc = module.get_submodule(".".join(parts)) if parts else module
        if id(anc) in order:
            return anc
    return None


def layer_params(module: nn.Module, layers: list[tuple[str, nn.Module]]) -> list[list[nn.Parameter]]:
    """Per layer, the trainable parameters it owns (first owner wins for shared parameters)."""
    seen: set[int] = set()
    out = []
    for _, mod in layers:
        own = [p for p in mod.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in own)
        out.append(own)
    return out
