"""What :func:`dpcomm.fsdp.shard` builds from the one analysis every rank agreed on
(:func:`dpcomm.trace.units.agree`): the layers' parameters, the modules that may be units on every rank's
example, and the groups that reduce-scatter zeros for parameters some rank's data leaves without a
gradient (a mixture's experts, a task's head), as DDP's ``find_unused_parameters`` sums them.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from dpcomm.compat import fsdp_reduces_unused
from dpcomm.errors import UserError
from dpcomm.fsdp.groups import shardable_modules
from dpcomm.fsdp.planning import on_model_device
from dpcomm.utils.user_run import on_every_rank

__all__ = ["agreed_shardable", "layer_params_of", "zeros_for_uneven"]


def layer_params_of(model: nn.Module, analysis: Any) -> tuple[tuple[str, ...], ...]:
    """Parameter names per layer: the agreed units', or without an example the learnable layers'."""
    from dpcomm.models.layers import learnable_layers
    from dpcomm.trace.units import layer_units

    units = analysis.units if analysis is not None else layer_units(model, learnable_layers(model))
    return tuple(u.param_names for u in units)


def agreed_shardable(model: nn.Module, example: Any, analysis: Any, group: Any) -> frozenset[str]:
    """The modules shardable on every rank's example (:func:`shardable_modules`), less those holding a
    parameter some rank's example leaves without a gradient (a unit of its own would gather on the ranks
    that run it and not on the others: its parameters go to an ancestor every rank runs), plus those whose
    parameters no rank's example uses (a unit no rank gathers, whose gradients stay None as under DDP).
    Where this torch's FSDP2 cannot reduce zeros for them (:func:`dpcomm.compat.fsdp_reduces_unused`), a
    model with such parameters is one :class:`UserError` on every rank (``analysis.uneven`` is agreed)."""
    if analysis is not None and analysis.uneven and not fsdp_reduces_unused():
        shown = ", ".join(analysis.uneven[:4]) + (", ..." if len(analysis.uneven) > 4 else "")
        raise UserError(
            f"dpcomm.fsdp.shard: {shown} get gradients on some ranks' examples and not on others'; this "
            "torch's FSDP2 has no set_reduce_scatter_unused_params to reduce them (newer torch has it)"
        )
    mine = on_every_rank(
        lambda: shardable_modules(model, on_model_device(model, example)), group,
        "dpcomm.fsdp.shard: running the model on the example",
    )  # fmt: skip
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, sorted(mine), group=group)
    params = dict(model.named_parameters())
    uneven = {id(params[n]) for n in analysis.uneven}
    idle = {id(params[n]) for u in analysis.units if u.unused for n in u.param_names} - uneven
    held, unused = set(), set()
    for path, m in model.named_modules():
        mine = [id(p) for p in m.parameters(recurse=False) if p.requires_grad]
        held |= {path} if any(i in uneven for i in mine) else set()
        unused |= {path} if mine and all(i in idle for i in mine) else set()
    return frozenset((set.intersection(*(set(e) for e in every)) | unused) - held)


def zeros_for_uneven(model: nn.Module, analysis: Any) -> None:
    """FSDP2 reduce-scatters zeros for the parameters of a group some rank left without a gradient (set on
    the groups holding ``analysis.uneven``), as DDP's ``find_unused_parameters`` sums them."""
    from torch.distributed.fsdp import FSDPModule

    mods = dict(model.named_modules())
    for name in analysis.uneven:
        path = name.rpartition(".")[0]
        while not isinstance(mods[path], FSDPModule):
            path = path.rpartition(".")[0]
        mods[path].set_reduce_scatter_unused_params(True, recurse=False)
