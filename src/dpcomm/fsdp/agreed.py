"""What :func:`dpcomm.fsdp.shard` builds from the one analysis every rank agreed on
(:func:`dpcomm.trace.units.agree`): the layers' parameters, the modules that may be units on every rank's
example, and the parameters whose units reduce-scatter zeros where a rank's data leaves them without a
gradient (a mixture's experts, a task's head: :mod:`dpcomm.fsdp.unused`).

A module the data routes to is never a unit of its own, even where every rank's example ran it: whether
it runs in a later step is the data's choice (a Switch Transformer's expert that no token of a rank's batch
picks), and a unit one rank gathers and reduce-scatters while another does not breaks the collectives. The
sign of routing that one example per rank shows: the module's inputs differ in shape across the ranks while
the model's own inputs do not (an expert takes the rows its router gave it; issue 54, findings 1-2), and its
siblings in a ``ModuleList`` or ``ModuleDict`` (the experts no example picked). Such a module, and
everything under it, goes to an ancestor every rank runs, whose unit reduce-scatters zeros
for the parameters a rank leaves unused. A routing that happens to give every rank's example the same
shapes is not seen; the docs say so.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from dpcomm.compat import fsdp_reduces_unused
from dpcomm.errors import UserError
from dpcomm.fsdp.groups import ROOT, shardable_modules
from dpcomm.fsdp.planning import on_model_device
from dpcomm.utils.user_run import on_every_rank

__all__ = ["agreed_shardable", "layer_params_of"]


def layer_params_of(model: nn.Module, analysis: Any) -> tuple[tuple[str, ...], ...]:
    """Parameter names per layer: the agreed units', or without an example the learnable layers'."""
    from dpcomm.models.layers import learnable_layers
    from dpcomm.trace.units import layer_units

    units = analysis.units if analysis is not None else layer_units(model, learnable_layers(model))
    return tuple(u.param_names for u in units)


def _routed(model: nn.Module, every: list[dict[str, list[tuple[int, ...]]]]) -> set[str]:
    """Modules (and all under them) whose input shapes differ across the ranks' examples while the model's
    own do not (module docstring)."""
    if any(e.get(ROOT) != every[0].get(ROOT) for e in every):
        return set()  # the ranks' inputs differ in shape: no module's difference is the router's
    routed = {p for p in set().union(*every) if any(e.get(p) != every[0].get(p) for e in every)}
    mods = dict(model.named_modules())
    for p in list(routed):  # an expert no rank's example picked is still an expert: its siblings' lot
        parent = p.rpartition(".")[0]
        if p and isinstance(mods[parent], nn.ModuleList | nn.ModuleDict):
            routed |= {f"{parent}.{k}" if parent else k for k in mods[parent]._modules}
    return {p for p in mods if any(p == r or p.startswith(f"{r}.") for r in routed)}


def _need_zeros(names: Any) -> None:
    """One :class:`UserError` where this torch's FSDP2 cannot reduce zeros for ``names``."""
    if not fsdp_reduces_unused():
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise UserError(
            f"dpcomm.fsdp.shard: {shown} get gradients on some ranks' examples and not on others'; this "
            "torch's FSDP2 has no set_reduce_scatter_unused_params to reduce them (newer torch has it)"
        )


def agreed_shardable(
    model: nn.Module, example: Any, analysis: Any, group: Any
) -> tuple[frozenset[str], tuple[str, ...]]:
    """The modules that may be units: those shardable on every rank's example (:func:`shardable_modules`),
    less those holding a parameter some rank's example leaves without a gradient (a unit of its own would
    gather on the ranks that run it and not on the others: its parameters go to an ancestor every rank
    runs) and those the data routes to (module docstring), plus those whose parameters no rank's example
    uses (a unit no rank gathers, whose gradients stay None as under DDP). And the parameters whose units
    reduce-scatter zeros (:func:`dpcomm.fsdp.unused.reduce_zeros`): the uneven ones and the routed
    modules'. Where this torch's FSDP2 cannot reduce zeros (:func:`dpcomm.compat.fsdp_reduces_unused`), a
    model with such parameters is one :class:`UserError` on every rank (what is gathered is agreed)."""
    if analysis is not None and analysis.uneven:
        _need_zeros(analysis.uneven)

    def local() -> tuple[list[str], dict[str, list[tuple[int, ...]]]]:
        shapes: dict[str, list[tuple[int, ...]]] = {}
        return sorted(shardable_modules(model, on_model_device(model, example), shapes)), shapes

    mine = on_every_rank(local, group, "dpcomm.fsdp.shard: running the model on the example")
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    routed = _routed(model, [e[1] for e in every])
    params = dict(model.named_parameters())
    zeros = set(analysis.uneven)
    zeros |= {f"{p}.{n}" if p else n for p, m in model.named_modules() if p in routed
              for n, q in m.named_parameters(recurse=False) if q.requires_grad}  # fmt: skip
    zeros = tuple(n for n in params if n in zeros)  # registration order (a tied one by its first name)
    if zeros:
        _need_zeros(zeros)
    uneven = {id(params[n]) for n in zeros}
    idle = {id(params[n]) for u in analysis.units if u.unused for n in u.param_names} - uneven
    held, unused = set(routed), set()
    for path, m in model.named_modules():
        mine = [id(p) for p in m.parameters(recurse=False) if p.requires_grad]
        held |= {path} if any(i in uneven for i in mine) else set()
        unused |= {path} if mine and all(i in idle for i in mine) else set()
    return frozenset((set.intersection(*(set(e[0]) for e in every)) | unused) - held), zeros
