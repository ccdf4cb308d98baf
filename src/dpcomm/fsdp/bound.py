"""The plan's peak as FSDP2 runs it, and planning again under it, for :func:`dpcomm.fsdp.shard`:
:func:`as_run` (the model's peak plus what FSDP2 keeps unsharded longer: a tied weight's unit, frozen
parameters under a unit's modules, a unit of frozen layers gathered in backward by a prefetch:
:func:`peak_as_run`), :func:`within_bound` (a planner's plan again under a budget lowered by the excess)
and :func:`per_block_within` (the timed trial's comparison plan, ``per-block`` within the budget as FSDP2
runs it). Planning itself is :mod:`dpcomm.fsdp.planning`'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.fsdp.groups import ShardGroups, call_params, layer_atoms, shard_groups
from dpcomm.fsdp.planning import overlap_of, plan_on_root, unit_s_of
from dpcomm.planner.fsdp_model import FsdpPlan, peak_memory
from dpcomm.planner.fsdp_precision import Precision
from dpcomm.trace.format import Trace

__all__ = ["REPLANS", "as_run", "peak_as_run", "per_block_within", "within_bound"]


def as_run(
    model: nn.Module,
    plan: FsdpPlan,
    groups: ShardGroups,
    layer_params: Any,
    trace: Trace | None = None,
    ag: Any = None,
    rs: Any = None,
    ar: Any = None,
    precision: Precision | None = None,
) -> tuple[FsdpPlan, int]:  # fmt: skip
    """The plan FSDP2 runs (``plan`` itself: every unit is one ``fully_shard`` call, point 2 of
    :mod:`dpcomm.fsdp.groups`) and the peak bound: the model's peak (:func:`peak_as_run`: units of frozen
    layers in backward as FSDP2 runs them, from ``trace``) plus the spanning units' bytes (bytes from the
    model's own parameters, in ``precision``'s ``param_dtype``: FSDP2 gathers and holds them cast; frozen
    parameters under a unit's modules included). ``ag``, ``rs`` and ``ar`` are unused (kept for callers)."""
    if groups.units != tuple(plan.units):  # the planners plan over atoms: nothing is ever merged
        raise RuntimeError(f"dpcomm internal error: FSDP units {groups.units} differ from the plan's")
    p = precision or Precision()
    size = {n: x.numel() * p.gather_bytes(x.element_size()) for n, x in model.named_parameters()}
    m = np.array([sum(size[n] for n in names) for names in layer_params], dtype=float)
    held = m.copy()  # what each unit's fully_shard call also gathers: frozen parameters under its modules
    per_unit, always = _untrained_bytes(model, groups, layer_params, p)
    for (a, _), extra in zip(groups.units, per_unit, strict=True):
        held[a] += extra
    silent, kept = _frozen_backward(plan, groups, trace)
    peak = peak_as_run(list(plan.units), held, depth=plan.depth, reshard=plan.reshard_after_forward,
                       silent=silent, kept=kept) + always  # fmt: skip
    spans = sum(int(held[a : z + 1].sum()) for k, (a, z) in enumerate(plan.units) if k in groups.spanning)
    return plan, int(peak) + spans


def _frozen_backward(plan: FsdpPlan, groups: ShardGroups, trace: Trace | None) -> tuple[set[int], set[int]]:
    """The units of frozen layers only (``trace``'s, :func:`dpcomm.fsdp.frozen.with_frozen`) whose backward
    FSDP2 runs otherwise: ``silent`` where no output of their modules needs a gradient (FSDP2 registers no
    backward hook on them), ``kept`` where that is so or unknown (see :func:`peak_as_run`)."""
    silent: set[int] = set()
    kept: set[int] = set()
    if trace is None or trace.num_layers != plan.num_modules:
        return silent, kept
    needs = trace.extra.get("frozen_needs_grad", {})
    for k, (a, z) in enumerate(plan.units):
        if all(x.extra.get("frozen") for x in trace.layers[a : z + 1]):
            outs = {needs.get(m) for m in groups.modules[k]}
            kept |= {k} if outs != {True} else set()  # True: its backward runs as the others'
            silent |= {k} if outs == {False} else set()
    return silent, kept


def peak_as_run(units: list[tuple[int, int]], held: Any, *, depth: int, reshard: bool, silent: Any = (),
                kept: Any = ()) -> int:  # fmt: skip
    """:func:`dpcomm.planner.fsdp.peak_memory` of ``held`` (bytes per layer), with the ``silent`` and
    ``kept`` units of frozen layers as FSDP2 runs their backward (see there)."""
    return int(peak_memory(units, held, depth=depth, reshard=reshard, silent=silent, kept=kept))


def _untrained_bytes(
    model: nn.Module, groups: ShardGroups, layer_params: Any, precision: Precision
) -> tuple[list[int], int]:
    """Bytes each unit's ``fully_shard`` call manages beyond its layers' parameters (frozen ones under its
    modules: FSDP2 gathers them with the unit), and the bytes the root call keeps unsharded from the
    first forward to the end of backward when no unit is the root's (``reshard_after_forward=False``), in
    ``precision``'s ``param_dtype``."""
    named = dict(model.named_parameters())
    per_unit, rest = call_params(model, groups)
    extra = []

    def nbytes(p: torch.Tensor) -> int:
        return p.numel() * precision.gather_bytes(p.element_size())

    for (a, z), ps in zip(groups.units, per_unit, strict=True):
        trained = {id(named[n]) for names in layer_params[a : z + 1] for n in names}
        extra.append(sum(nbytes(p) for p in ps if id(p) not in trained))
    return extra, sum(nbytes(p) for p in rest)


REPLANS = 4
"""At most this many plans again under a lowered budget when FSDP2's peak exceeds the model's
(:func:`within_bound`)."""


def within_bound(
    method: str, plan: FsdpPlan, model: nn.Module, layer_params: Any, trace: Trace, ag: Any, rs: Any,
    budget: int | None, max_depth: int, group: Any, shardable: Any = None, ar: Any = None,
    precision: Precision | None = None, unit_s: float | None = None,
) -> FsdpPlan:  # fmt: skip
    """``plan`` (planner ``method``'s), or ``method``'s plan under a budget lowered by what FSDP2 keeps
    unsharded beyond the model's peak (a tied weight's unit, kept to its last module's forward; a unit of
    frozen layers a backward prefetch gathers, kept to the end: :attr:`Sharded.peak_bound_bytes`) until that
    bound fits ``budget``; where nothing fits the lowered budget, halfway between it and the last budget
    planned under (at most :data:`REPLANS` plans; every rank alike, the bound is a function of the plan). A
    plan that still does not fit is returned, and ``shard`` refuses it in one line."""
    if budget is None:
        return plan
    lowered, floor = budget, -1  # the budget ``plan`` was made under; the highest one nothing fitted
    for _ in range(REPLANS):
        groups = shard_groups(model, plan, layer_params, shardable)
        over = as_run(model, plan, groups, layer_params, trace, precision=precision)[1] - budget
        target = lowered - over if lowered - over > floor else (floor + lowered) // 2
        if over <= 0 or not floor < target < lowered:
            return plan
        try:
            again = plan_on_root(method, trace, ag, rs, target, max_depth, group, overlap_of(model), ar=ar,
                                 precision=precision, unit_s=unit_s_of(model) if unit_s is None else unit_s,
                                 atoms=layer_atoms(model, layer_params, shardable))  # fmt: skip
            plan, lowered = replace(again, shard_group=plan.shard_group), target
        except UserError:  # nothing fits the lowered budget: halfway up, next
            floor = target
    return plan


def per_block_within(model, trace, costs, budget, max_depth, group, layer_params, shardable, said,
                     shard_group, pr=None, unit_s=None):  # fmt: skip
    """``shard``'s trial's comparison plan, ``per-block`` within the budget as FSDP2 runs it, or None (said
    why). ``pr``: the policy priced (:class:`Precision`); ``unit_s``: as :func:`plan_on_workers`'s."""
    ag, rs, ar = costs
    c = unit_s_of(model) if unit_s is None else unit_s
    try:
        block = plan_on_root("per-block", trace, ag, rs, budget, max_depth, group, overlap_of(model), ar=ar,
                             precision=pr, unit_s=c,
                             atoms=layer_atoms(model, layer_params, shardable))  # fmt: skip
        block = within_bound("per-block", replace(block, shard_group=shard_group), model, layer_params, trace,
                             ag, rs, budget, max_depth, group, shardable, ar, pr, c)  # fmt: skip
    except UserError as exc:  # no blocks, or per-block does not fit: nothing to time against
        said.append(f"not timed against per-block: {exc}")
        return None
    bound = as_run(model, block, shard_groups(model, block, layer_params, shardable), layer_params, trace, ag,
                   rs, ar, pr)[1]  # fmt: skip
    if budget is not None and bound > budget:
        said.append(
            f"not timed against per-block: it needs {bound:,} bytes unsharded, over the budget of {budget:,}"
        )
        return None
    return block
