"""Gradient units: the parameters whose gradients become ready together, in the order they become ready.

dpcomm plans, prices and runs messages of *units*. A planner cannot start a message before the last of its
gradients is in ``.grad``, and DDP's reducer (like every backward hook) sees parameters in exactly that
order, not in module order. In a CNN both orders agree (a layer's weight and bias are ready back to back,
layers in reverse forward order), so a unit is a learnable layer; in a transformer they differ (a tied
embedding used first and last, ``nn.MultiheadAttention`` owning ``in_proj_weight`` while its ``out_proj``
is a child, a module whose parameters are used at two places), and units follow the gradients.

Definition. One local forward and backward of one batch records, with a post-accumulate-grad hook on every
trainable parameter, the order in which gradients land in ``.grad`` (the *ready order*). Each parameter
has one *owner*: the first module, in registration order, that holds it directly (so a tied weight belongs
to the module registered first, e.g. GPT-2's ``wte``, not ``lm_head``). Then:

1. a unit is a maximal run of consecutive parameters in the ready order with the same owner (a ``Linear``'s
   weight and bias become ready one after the other, with no other parameter between: one unit; a module
   whose parameters become ready at two times, with other modules' between, is two units);
2. a tied parameter is counted once, where its hook fires: the autograd engine accumulates every use into
   one ``.grad`` and runs the hook once, after the last use's backward (its *last* ready point);
3. frozen parameters (``requires_grad=False``) are left out: no gradient, no message;
4. unused parameters (trainable, but no gradient in this backward) form units of their own, one per owner,
   marked ``unused``, placed *first* in the ready order (reverse registration order among themselves):
   they wait for nothing, and DDP's reducer with ``find_unused_parameters=True`` marks them ready at the
   first gradient-ready event of each backward (``Reducer::autograd_hook``,
   ``has_marked_unused_parameters_``).

Across ranks (:func:`agree`): each rank records its own example's ready order and every rank builds from
rank 0's, by parameter name (:class:`Analysis`), so ranks whose data uses different parameters (routing, a
task's head) still plan, time and build one layout; ``uneven`` names the parameters the ranks disagree on.

Units are listed in *forward order* as the papers' layers are (unit 0 is ready last, unit ``L-1`` first),
so a plan over units is a plan over a trace's layers and every planner and the simulator take them as they
are. A unit is named after its owner (``h.0.attn.c_attn``); where the owner's parameters split over several
units, or a unit holds only some of them, the parameters follow in brackets (``root[post]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "Analysis",
    "Unit",
    "agree",
    "gradient_units",
    "layer_units",
    "owners",
    "ready_sequence",
    "trainable_names",
    "unit_params",
    "units_from_ready",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """Parameters whose gradients become ready together (see module docstring)."""

    name: str
    """Owner module's path, with the parameters in brackets when the unit holds only some of them."""
    module: str
    """Owner module's path (the root by its class name, as ``learnable_layers`` names it)."""
    param_names: tuple[str, ...]
    """Parameters' names as ``model.named_parameters()`` gives them (a tied one by its first name), in
    ready order."""
    unused: bool = False
    """No gradient in the recorded backward (see rule 4)."""


def trainable_names(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> name`` of the trainable parameters, registration order, a tied one by its first
    name (the order and names DDP's reducer uses)."""
    return {id(p): n for n, p in model.named_parameters() if p.requires_grad}


def owners(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> owner module path`` for trainable parameters: the first module holding it."""
    out: dict[int, str] = {}
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            if p.requires_grad and id(p) not in out:
                out[id(p)] = name or type(model).__name__
    return out


def ready_sequence(
    model: nn.Module, example: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None
) -> list[int]:
    """``id`` of each trainable parameter in the order its gradient became ready in one local forward and
    backward (a parameter whose hook fires twice counts at its last firing); unused parameters are absent.
    Gradients and buffers are restored."""
    from dpcomm.trace.profiler import default_loss
    from dpcomm.utils.user_run import call

    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda q: order.append(id(q))) for p in params]
    try:
        for p in params:
            p.grad = None
        (loss_fn or default_loss)(call(model, example)).backward()
    finally:
        for h in handles:
            h.remove()
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    last = {pid: k for k, pid in enumerate(order)}
    return [pid for k, pid in enumerate(order) if last[pid] == k]


def _name(module: str, params: list[str], whole: bool) -> str:
    """``module``, or ``module[a,b]`` when the unit holds only some of its parameters (or they split)."""
    return module if whole else f"{module}[{','.join(n.rsplit('.', 1)[-1] for n in params)}]"


def units_from_ready(model: nn.Module, ready: list[int]) -> list[Unit]:
    """Units (forward order) from ``ready``, the parameter ids in gradient-ready order (rules 1-4)."""
    names, owner = trainable_names(model), owners(model)
    seen = set(ready)
    runs: list[tuple[str, list[str], bool]] = []  # ready order
    unused: dict[str, list[str]] = {}
    for pid, name in names.items():
        if pid not in seen:
            unused.setdefault(owner[pid], []).append(name)
    for mod, ps in reversed(unused.items()):  # reverse registration order: what DDP walks first
        runs.append((mod, ps, True))
    for pid in ready:
        if pid not in names:  # a frozen parameter cannot fire; anything else is not the model's
            continue
        if runs and not runs[-1][2] and runs[-1][0] == owner[pid]:
            runs[-1][1].append(names[pid])
        else:
            runs.append((owner[pid], [names[pid]], False))
    whole: dict[str, list[str]] = {}
    for pid, name in names.items():
        whole.setdefault(owner[pid], []).append(name)
    count: dict[str, int] = {}
    for mod, _, _ in runs:
        count[mod] = count.get(mod, 0) + 1
    units = [
        Unit(
            name=_name(mod, ps, count[mod] == 1 and len(ps) == len(whole[mod])),
            module=mod,
            param_names=tuple(ps),
            unused=flag,
        )
        for mod, ps, flag in runs
    ]
    return units[::-1]


def gradient_units(
    model: nn.Module, example: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None
) -> list[Unit]:
    """The model's units (forward order), from one local forward and backward of ``example``."""
    return units_from_ready(model, ready_sequence(model, example, loss_fn))


def layer_units(model: nn.Module, layers: list[tuple[str, nn.Module]]) -> list[Unit]:
    """Units equal to learnable layers (a trace without parameter names: ``dpcomm-trace/1``, analytic)."""
    from dpcomm.models.layers import layer_params

    names = trainable_names(model)
    return [
        Unit(name=n, module=n, param_names=tuple(names[id(p)] for p in ps))
        for (n, _), ps in zip(layers, layer_params(model, layers), strict=True)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    """The one analysis of a model every rank builds from (:func:`agree`): rank 0's units and ready order,
    by parameter name, and which parameters the ranks' examples disagree on."""

    units: tuple[Unit, ...]
    """Rank 0's units, forward order (rules 1-4)."""
    ready: tuple[str, ...]
    """Rank 0's trainable parameters in gradient-ready order (used ones only)."""
    uneven: tuple[str, ...] = ()
    """Parameters with a gradient on some ranks' examples and not on others' (the data decides: routing,
    a task's head), registration order."""

    def ready_ids(self, model: nn.Module) -> list[int]:
        """:attr:`ready` as this rank's parameter ids (what :func:`ready_sequence` returns)."""
        by_name = dict(model.named_parameters())
        return [id(by_name[n]) for n in self.ready]


def agree(
    model: nn.Module, example: Any, loss_fn: Callable[[Any], torch.Tensor] | None, group: Any, who: str
) -> Analysis:
    """One forward and backward of this rank's ``example`` (gradients and buffers restored), then every
    rank takes rank 0's ready order: the units, and so the buckets, are one layout on every rank whatever
    each rank's data (a parameter rank 0 did not use is an unused unit everywhere). A failure on any rank
    is one :class:`~dpcomm.errors.UserError` on every rank."""
    import torch.distributed as dist

    from dpcomm.utils.user_run import on_every_rank

    names = trainable_names(model)
    local = on_every_rank(
        lambda: [names[pid] for pid in ready_sequence(model, example, loss_fn) if pid in names],
        group, f"{who}: running the model on the example",
    )  # fmt: skip
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, local, group=group)
    used = [set(r) for r in every]
    some = set().union(*used) - set.intersection(*used)
    by_name = dict(model.named_parameters())
    units = units_from_ready(model, [id(by_name[n]) for n in every[0]])
    return Analysis(
        units=tuple(units), ready=tuple(every[0]), uneven=tuple(n for n in names.values() if n in some)
    )


def unit_params(model: nn.Module, units: list[Unit] | tuple[Unit, ...]) -> list[list[nn.Parameter]]:
    """Each unit's parameters, looked up by name in ``model`` (a name it lacks is a ``KeyError``)."""
    by_name = dict(model.named_parameters())
    return [[by_name[n] for n in u.param_names] for u in units]
