"""Modules holding only frozen parameters as FSDP units (:mod:`dpcomm.fsdp.groups`, point 6; issue 54).

Frozen parameters have no gradient unit (:mod:`dpcomm.trace.units`, rule 3), so a plan over gradient units
never holds them, and FSDP2's root call took them whole on every rank: a frozen stem, backbone or vision
tower beside a trained head was gathered in full from the first forward to the end of backward. Here:

- :func:`frozen_holders`: each module holding frozen parameters only, under no module holding trainable
  (or ignored) ones, is a layer: ``(module paths, parameter names)``, modules sharing a tied parameter
  together; frozen parts inside a trained module (a LoRA layer's ``base``) stay with that module;
- :func:`with_frozen`: those layers added to a trace, each where its forward first runs (rank 0's forward
  of the example), with zero times (the profiled units' times already include their forward), and whether
  their outputs need a gradient: FSDP2 registers no backward hook for a unit whose output needs none, yet
  the next unit's backward prefetch gathers it and it stays unsharded to the end of backward, as
  :func:`dpcomm.fsdp.bound.as_run` counts it.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.fsdp.groups import _holders
from dpcomm.trace.format import Layer, Trace
from dpcomm.utils.user_run import call, on_every_rank

__all__ = ["HELD_OUT", "frozen_holders", "with_frozen"]

HELD_OUT: set[int] = set()
"""``id`` of the parameters in FSDP2's ``ignored_params`` while ``shard`` plans (frozen for the while by
:func:`dpcomm.fsdp.keywords.planned_without`): whole on every rank, in no layer (point 6)."""


def frozen_holders(model: nn.Module, shardable: Collection[str] | None = None) -> list[tuple[list, list]]:
    """The frozen layers of point 6: ``(module paths, parameter names)`` each, the modules sharing a (tied)
    parameter together; none holds an ignored parameter (:data:`HELD_OUT`)."""
    live = {p for p, m in model.named_modules()
            if any(q.requires_grad or id(q) in HELD_OUT for q in m.parameters())}  # fmt: skip
    direct, out = _holders(model, shardable), []  # groups.py's point 1, with point 4's shardable
    for path, names in direct.items():  # below no holder of trainable (or ignored) parameters but the root
        if path and path not in live and not any(path.startswith(t + ".") for t in direct if t and t in live):
            hit = [x for x in out if set(x[1]) & set(names)]
            paths, held = [q for x in hit for q in x[0]] + [path], [n for x in hit for n in x[1]] + names
            out = [x for x in out if x not in hit] + [(paths, list(dict.fromkeys(held)))]
    return out


def _forward_ticks(model: nn.Module, example: Any) -> tuple[dict[str, int], dict[str, bool | None]]:
    """One forward of ``example`` (the model left as it was): each module's first call, in order, and for
    those whose parameters are all frozen, whether an output needs a gradient (None: an output it cannot
    read): FSDP2 runs backward hooks for a unit only then."""
    from torch.utils._pytree import tree_leaves

    from dpcomm.utils.user_run import untouched

    paths = {m: p for p, m in model.named_modules()}
    frozen = {m for m in paths if not any(q.requires_grad for q in m.parameters())}
    tick: dict[str, int] = {}
    needs: dict[str, bool | None] = {}

    def enter(mod: nn.Module, _: Any) -> None:
        tick.setdefault(paths[mod], len(tick))

    def leave(mod: nn.Module, _: Any, out: Any) -> None:
        leaves = tree_leaves(out)
        grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)
        odd = not grad and any(
            not isinstance(t, torch.Tensor | int | float | bool | str | None) for t in leaves
        )
        was = needs.get(paths[mod], False)
        needs[paths[mod]] = None if odd or was is None else (was or grad)

    handles = [m.register_forward_pre_hook(enter) for m in paths]
    handles += [m.register_forward_hook(leave) for m in frozen if next(m.parameters(), None) is not None]
    try:
        with untouched(model), torch.enable_grad():
            call(model, example)
    finally:
        for h in handles:
            h.remove()
    return tick, needs


def with_frozen(model: nn.Module, trace: Trace, example: Any, shardable: Any, group: Any) -> Trace:
    """``trace`` with a layer for each module holding only frozen parameters
    (:func:`frozen_holders`), each placed before the first layer whose parameters' modules
    all first run after it (rank 0's forward of ``example``; without one, registration order): planned as the
    others, gathered when its forward runs. Its times are 0 (the profiled units' add up to the iteration,
    its forward included). ``extra["frozen"]``: ``True``; the trace's ``extra["frozen_needs_grad"]``: per
    module of a frozen subtree, whether its output needs a gradient (absent: unknown), what FSDP2's backward
    hooks of a unit of frozen layers depend on (:func:`dpcomm.fsdp.bound.as_run`)."""
    frozen = frozen_holders(model, shardable)
    if not frozen:
        return trace
    tick: dict[str, int] = {p: i for i, (p, _) in enumerate(model.named_modules())}
    needs: dict[str, Any] = {}
    if example is not None:
        box = [on_every_rank(lambda: _forward_ticks(model, example), group,
                             "dpcomm.fsdp.shard: running the model on the example")]  # fmt: skip
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group
        )
        tick, needs = box[0]
    mods = dict(model.named_modules())

    def at(path: str) -> float:  # a module's first call; one that never ran: its nearest ancestor's that did
        while path and path not in tick:
            path = path.rpartition(".")[0]
        return tick.get(path, 0)

    where = {}
    for path, mod in mods.items():
        for p in mod.parameters(recurse=False):
            where[id(p)] = min(where.get(id(p), math.inf), at(path))
    named = dict(model.named_parameters())
    ticks = [min((where[id(named[n])] for n in x.param_names), default=math.inf) for x in trace.layers]
    rows = list(trace.layers)
    for paths, names in sorted(frozen, key=lambda f: min(at(p) for p in f[0]), reverse=True):
        t = min(at(p) for p in paths)
        k = next((i for i, u in enumerate(ticks) if u > t), len(rows))
        n = sum(named[q].numel() for q in names)
        rows.insert(k, Layer(name="+".join(paths), params=n, forward_s=0.0, backward_s=0.0,
                             param_names=tuple(names), extra={"frozen": True}))  # fmt: skip
        ticks.insert(k, t)
    grads = {p: needs[p] for p in needs if needs[p] is not None}
    return replace(trace, layers=tuple(rows), extra={**trace.extra, "frozen_needs_grad": grads})
