"""A dpcomm plan as DistributedDataParallel buckets: ``bucket_cap_mb_list``, one cap per bucket.

A plan's layers are the model's *gradient units* (:mod:`dpcomm.trace.units`: parameters whose gradients
become ready together, forward order), the layers of a ``dpcomm-trace/2``; a layer-level trace (``/1``,
analytic) gives units equal to learnable layers, which is what they are for a CNN.

How torch 2.13's DDP cuts buckets (``torch/nn/parallel/distributed.py``: ``_BucketCapacityConfig``,
``_ddp_init_helper``; the reducer's ``compute_bucket_assignment_by_size`` and ``rebuild_buckets``): it walks
the parameters in an order, adds each one's gradient bytes to the open bucket, and closes the bucket as soon
as it holds ``>=`` that bucket's cap; the ``k``-th bucket of the walk gets ``bucket_cap_mb_list[k]`` (the
last cap repeats). With a list given, the first bucket has no separate cap, and the same list serves both
walks DDP makes:

- **at construction** it walks the parameters in *registration* order (``named_parameters()``, a tied one
  at its first name, frozen ones left out) and reverses the resulting bucket list, so the first cap goes
  to the bucket that communicates *last*;
- **after the first backward** (``find_unused_parameters=False``, or ``static_graph=True`` after the
  second) the reducer *rebuilds* its buckets, walking the parameters in the order their gradients became
  ready in that backward (with ``static_graph`` the unused ones follow, in registration order: a plan
  whose units put them first, as the units do, loses the cuts around them), and keeps them. With
  ``find_unused_parameters=True`` and no ``static_graph`` it never rebuilds (``should_rebuild_buckets``):
  the construction-time buckets are the buckets for good.

For the registration walk there is a third way, and :func:`build_ddp` takes it (``dpcomm.ddp.wrap`` always
builds DDP through it): DDP's constructor asks ``torch.distributed._compute_bucket_assignment_by_size``
for its construction-time buckets, and ``build_ddp`` answers that one call with the plan's groups (the
parameters' indices per group, reversed as DDP expects, DDP reverses them back). DDP is otherwise built
as always; with ``find_unused_parameters=True`` it never rebuilds, so it runs every cut of the plan from
the first iteration (walk ``assigned``).

So a plan's groups, in communication order, become DDP's buckets when the caps are the groups' exact byte
sizes (``int(cap_mb * 2**20)`` is exact for ``cap_mb = bytes / 2**20``) in the order DDP's walk meets them
(communication order for the rebuild; reversed for the registration walk), and every group's parameters
are contiguous in that walk (then the running sum meets each cap exactly at the group's last parameter).

For the rebuild walk this holds for every plan over units whose ready order is the same every iteration:
units *are* runs of the ready order. For the registration walk it holds when each group's parameters are
contiguous in reverse registration order: a model whose modules are registered in the order they run (as
GPT-2's are, a tied embedding registered first and ready last, an unused head registered last and, being
unused, ready first; see the unit rules). Where it does not hold the cut is dropped (the groups around it
merge, the finest such coarsening) and :class:`BucketCaps` says which and why in one line, with the cost
model's price of the difference when a trace and a cost are given. The first iteration before a rebuild
cuts the same caps in registration order; its buckets differ from the plan, its sums do not.

A model whose parameters mix dtypes gets one bucket per dtype of each group, and caps fitted to DDP's
per-dtype walk (:mod:`dpcomm.ddp.dtypes`).

Kept as one module (about 350 lines): the walk and the caps are one argument about how DDP cuts buckets,
read together; handing DDP the buckets is :mod:`dpcomm.ddp.build`, the planning around them
:mod:`dpcomm.ddp.planning`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.ddp.build import build_ddp
from dpcomm.errors import UserError
from dpcomm.models.layers import learnable_layers
from dpcomm.plan import Plan
from dpcomm.trace.format import Trace
from dpcomm.trace.units import (
    Analysis,
    Unit,
    gradient_units,
    layer_units,
    ready_sequence,
    trainable_names,
    unit_params,
    units_from_ready,
)

__all__ = [
    "BucketCaps",
    "bucket_caps",
    "build_ddp",
    "ddp_walk",
    "expressible_plan",
    "model_units",
    "ready_order",
]

WALKS = ("ready", "static", "registration", "assigned")
"""The order DDP's reducer walks parameters in when it cuts the buckets it keeps (module docstring);
``assigned``: none, :func:`build_ddp` hands it the plan's buckets."""

_WHY = {
    "ready": "gradients of those units become ready out of unit order",
    "registration": (
        "find_unused_parameters=True without static_graph: DDP never rebuilds its buckets and cuts them in "
        "reverse registration order, where those units are not contiguous; static_graph=True, for a model "
        "whose used parameters never change, makes DDP cut in gradient-ready order"
    ),
    "static": (
        "static_graph=True: DDP's rebuilt buckets put the unused parameters after the used ones, where the "
        "units put them first (they wait for nothing); find_unused_parameters=True without static_graph "
        "keeps them where they are registered"
    ),
}

_MIB = 1 << 20
"""Bytes per MiB: DDP's ``bucket_cap_mb`` unit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketCaps:
    """What to pass to DDP so that it runs ``plan``, and how that plan relates to the one asked for."""

    bucket_cap_mb_list: list[float]
    """One cap per bucket in MiB (communication order): each group's exact gradient bytes / 2**20."""
    plan: Plan
    """The plan DDP will run: ``requested`` itself, or its nearest coarsening DDP can express."""
    requested: Plan
    """The plan asked for."""
    dropped: tuple[int, ...] = ()
    """Cuts of ``requested`` DDP cannot make, each as unit ``l`` of the cut ``l|l-1``."""
    walk: str = "ready"
    """The order DDP cuts in (:data:`WALKS`): ``ready`` (its rebuilt buckets), ``static`` (rebuilt, unused
    parameters last) or ``registration`` (never rebuilt)."""
    extra_s: float | None = None
    """Cost-model price of running ``plan`` instead of ``requested`` (seconds per iteration), if priced."""
    param_groups: tuple[tuple[str, ...], ...] = ()
    """Parameter names of each of DDP's buckets (communication order): ``plan``'s groups, a group of several
    dtypes as a bucket per dtype (:mod:`dpcomm.ddp.dtypes`); what :func:`build_ddp` assigns."""
    unit_names: tuple[str, ...] = ()
    """Each unit's name (forward order), to name cuts in :attr:`note`."""
    why: str | None = None
    """Why cuts were dropped, where the walk alone does not say (parameters of mixed dtypes)."""

    @property
    def exact(self) -> bool:
        """DDP forms exactly the requested groups."""
        return not self.dropped

    @property
    def note(self) -> str | None:
        """One line saying what DDP runs instead, None when it runs the requested plan."""
        if self.exact:
            return None
        if self.unit_names:
            cuts = ", ".join(f"{self.unit_names[g]} | {self.unit_names[g - 1]}" for g in self.dropped)
        else:
            cuts = ", ".join(f"{g}|{g - 1}" for g in self.dropped)
        price = "" if self.extra_s is None else f"; the cost model prices it at {self.extra_s * 1e3:+.3f} ms"
        why = self.why or _WHY[self.walk]
        return (
            f"DDP cannot cut plan '{self.requested.schedule}' between {cuts} ({why}); "
            f"running {len(self.plan.groups)} buckets instead of {len(self.requested.groups)}{price}"
        )

    def ddp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DistributedDataParallel(...)``."""
        return {"bucket_cap_mb_list": list(self.bucket_cap_mb_list)}


def model_units(
    model: nn.Module,
    example: Any | None = None,
    loss_fn: Any = None,
    trace: Trace | None = None,
    *,
    ready: list[int] | None = None,
) -> list[Unit]:
    """The units a plan for ``model`` indexes: ``trace``'s when it names its parameters
    (``dpcomm-trace/2``), else :func:`~dpcomm.trace.units.gradient_units` when ``example`` is given, else
    the learnable layers in registration order. Every trainable parameter must be in exactly one unit.
    ``ready``: :func:`~dpcomm.trace.units.ready_sequence` of ``example``, when already recorded."""
    if trace is not None and trace.has_units:
        units = [
            Unit(name=x.name, module=x.name, param_names=x.param_names, unused=x.unused) for x in trace.layers
        ]
    elif ready is not None:
        units = units_from_ready(model, ready)
    elif example is not None:
        units = gradient_units(model, example, loss_fn)
    else:
        units = layer_units(model, learnable_layers(model))
    if not units:
        raise UserError("the model has no learnable layer (no parameter requires grad)")
    named = [n for u in units for n in u.param_names]
    trainable = set(trainable_names(model).values())
    if set(named) != trainable or len(named) != len(trainable):
        odd = sorted(set(named) ^ trainable) or ["a parameter in two units"]
        raise UserError(
            f"the trace's units do not match the model's trainable parameters (e.g. {odd[0]}); "
            "profile this model again"
        )
    return units


def ddp_walk(
    model: nn.Module,
    units: list[Unit],
    *,
    example: Any | None = None,
    loss_fn: Any = None,
    find_unused_parameters: bool = False,
    static_graph: bool = False,
    ready: list[int] | None = None,
) -> tuple[str, list[int]]:
    """``(walk, order)``: the order DDP's reducer cuts its kept buckets in (:data:`WALKS`) and the unit index
    of each parameter in that order, communication side first (module docstring). The ready order comes
    from one local forward/backward of ``example`` (or is ``ready``, already recorded); without either, the
    units' own order is assumed."""
    if ready is None and example is not None and not (find_unused_parameters and not static_graph):
        ready = ready_sequence(model, example, loss_fn)
    walk, names, _ = _walk_names(model, units, find_unused_parameters, static_graph, ready)
    unit_of = {n: k for k, u in enumerate(units) for n in u.param_names}
    return walk, [unit_of[n] for n in names]


def _walk_names(
    model: nn.Module, units: list[Unit], find_unused: bool, static_graph: bool, ready: list[int] | None
) -> tuple[str, list[str], bool]:
    """:func:`ddp_walk` by parameter name, and whether the order inside each unit is the one DDP will see
    (not so where no ready order was recorded and the units' own order is assumed)."""
    names = trainable_names(model)
    if find_unused and not static_graph:
        return "registration", list(reversed(list(names.values()))), True
    if ready is None:
        return "ready", [n for k in reversed(range(len(units))) for n in units[k].param_names], False
    used = set(ready)
    unused = [n for pid, n in names.items() if pid not in used]  # static_graph: after the used ones
    walk = "static" if static_graph else "ready"
    return walk, [names[pid] for pid in ready if pid in names] + unused, True


def ready_order(
    model: nn.Module,
    example: Any,
    loss_fn: Any = None,
    params_per_layer: list[list[nn.Parameter]] | None = None,
) -> list[int]:
    """Unit index of each parameter (layer index, given ``params_per_layer``), in the order their gradients
    became ready in one local backward pass (the order DDP's reducer rebuilds its buckets in); unused
    parameters are left out. Parameters, gradients and buffers are restored."""
    if params_per_layer is None:
        params_per_layer = unit_params(model, gradient_units(model, example, loss_fn))
    layer_of = {id(p): i for i, ps in enumerate(params_per_layer) for p in ps}
    return [layer_of[pid] for pid in ready_sequence(model, example, loss_fn) if pid in layer_of]


def expressible_plan(
    plan: Plan, order: list[int], group_bytes: list[int] | None = None
) -> tuple[Plan, tuple]:
    """The finest coarsening of ``plan`` whose groups DDP can form when it walks parameters in ``order``
    (unit index per parameter, communication side first, see :func:`ddp_walk`), and the cuts it drops.

    A cut after communication group ``k`` is possible when every parameter of groups ``0..k`` is ready
    before every parameter of the later groups (and group ``k`` is not empty in bytes: a zero cap would
    close an empty bucket).
    """
    group_of = {layer: k for k, g in enumerate(plan.groups) for layer in g}
    first = [len(order)] * len(plan.groups)
    last = [-1] * len(plan.groups)
    for pos, layer in enumerate(order):
        k = group_of[layer]
        first[k], last[k] = min(first[k], pos), max(last[k], pos)
    sizes, dropped, run, latest = [], [], 0, -1
    for k, g in enumerate(plan.groups):
        run += len(g)
        latest = max(latest, last[k])
        if k == len(plan.groups) - 1:
            sizes.append(run)
            break
        later = min(first[k + 1 :])
        empty = group_bytes is not None and group_bytes[k] == 0
        if latest < later and not empty:
            sizes.append(run)
            run = 0
        else:
            dropped.append(g[0])
    if not dropped:
        return plan, ()
    meta = {**plan.meta, "ddp_from": plan.schedule}
    return Plan.from_sizes(plan.schedule, sizes, plan.num_layers, **meta), tuple(dropped)


def bucket_caps(
    plan: Plan,
    model: nn.Module,
    *,
    example: Any | None = None,
    loss_fn: Any = None,
    trace: Trace | None = None,
    cost: CommCost | None = None,
    nodes: int | None = None,
    warn: bool = True,
    find_unused_parameters: bool = False,
    static_graph: bool = False,
    assign: bool = False,
    analysis: Analysis | None = None,
) -> BucketCaps:
    """The ``bucket_cap_mb_list`` that makes DDP form ``plan``'s groups (see module docstring).

    ``plan`` indexes :func:`model_units` (``trace``'s units when it has them, else the gradient units of
    ``example``, else the learnable layers in registration order); ``plan.num_layers`` must match.
    ``find_unused_parameters`` and ``static_graph`` are the ones DDP will get: they decide which order DDP
    cuts in (:func:`ddp_walk`). Cuts DDP cannot make are dropped (a warning says so, priced by
    :func:`dpcomm.sim.simulate` when ``trace``, ``cost`` and ``nodes`` are given). ``assign``: DDP will be
    built by :func:`build_ddp`, which hands a DDP that never rebuilds (the registration walk) the plan's
    buckets, so no cut is dropped there (walk ``assigned``). ``analysis``: the units and ready order every
    rank agreed on (:func:`dpcomm.trace.units.agree`), used instead of a local pass of ``example``.
    """
    if analysis is not None:
        ready = analysis.ready_ids(model)
    else:  # one local pass serves both
        ready = ready_sequence(model, example, loss_fn) if example is not None else None
    units = model_units(model, example, loss_fn, trace, ready=ready)
    if plan.num_layers != len(units):
        raise UserError(f"plan '{plan.schedule}' has {plan.num_layers} layers, the model {len(units)} units")
    per_unit = unit_params(model, units)
    devices = {p.device for ps in per_unit for p in ps}
    if len(devices) > 1:
        raise UserError(
            f"DDP buckets need one device; the trainable parameters are on {sorted(map(str, devices))}"
        )
    unit_bytes = [sum(p.numel() * p.element_size() for p in ps) for ps in per_unit]
    walk, walked, exact = _walk_names(model, units, find_unused_parameters, static_graph, ready)
    unit_of = {n: k for k, u in enumerate(units) for n in u.param_names}
    order = [unit_of[n] for n in walked]
    group_bytes = [sum(unit_bytes[u] for u in g) for g in plan.groups]
    if assign and walk == "registration":
        walk, order = "assigned", [k for k in reversed(range(len(units))) for _ in units[k].param_names]
    runs, dropped = expressible_plan(plan, order, group_bytes)
    groups = tuple(tuple(n for u in g for n in units[u].param_names) for g in runs.groups)
    caps = [sum(unit_bytes[u] for u in g) / _MIB for g in runs.groups]
    if walk == "registration":  # DDP's first cap goes to the first bucket of registration order
        caps.reverse()
    why = None
    if len({p.dtype for ps in per_unit for p in ps}) > 1:  # one bucket per dtype (ddp/dtypes)
        from dpcomm.ddp.dtypes import WHY, split_plan

        runs, more, groups, caps = split_plan(model, runs, groups, walk, walked, exact)
        if more:
            why = WHY if not dropped else f"{_WHY[walk]}; and {WHY}"
            dropped = tuple(sorted(set(dropped) | set(more), reverse=True))
    extra = None
    if dropped and trace is not None and cost is not None and nodes is not None:
        from dpcomm.sim import simulate

        extra = simulate(trace, runs, cost, nodes).t_iter_s - simulate(trace, plan, cost, nodes).t_iter_s
    out = BucketCaps(
        bucket_cap_mb_list=caps, plan=runs, requested=plan, dropped=dropped, extra_s=extra, walk=walk,
        param_groups=groups, unit_names=tuple(u.name for u in units), why=why,
    )  # fmt: skip
    if out.note and warn:
        warnings.warn(f"dpcomm: {out.note}", stacklevel=2)
    return out
