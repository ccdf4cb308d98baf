"""Which modules each unit of an :class:`~dpcomm.planner.fsdp_model.FsdpPlan` hands to ``fully_shard``.

A plan's units are contiguous ranges of a trace's layers; each layer is a set of parameters (a
``dpcomm-trace/2`` gradient unit's ``param_names``, :mod:`dpcomm.trace.units`, or a learnable layer's).
FSDP2 (``torch.distributed.fsdp.fully_shard``) groups *modules*: a call on a module, or a list of
modules, manages every parameter in their subtrees that no earlier call took, so children are sharded
before their parents and the root (``fully_shard(model)``) last, taking whatever is left (torchtitan's
``parallelize``). The mapping, :func:`shard_groups`:

1. every parameter is placed in the unit of its layer; a module is in the unit of the parameters it
   holds directly (a tied parameter is held by every module it is registered on: GPT-2's ``lm_head``
   holds ``wte.weight``);
2. **whole modules**: a module whose direct parameters fall in units ``i < j`` cannot be split by FSDP2;
   the planners never make such a plan (they plan over the *atoms*, :func:`layer_atoms`,
   :mod:`dpcomm.planner.fsdp_atoms`), and a plan given that splits one is refused in one line. A tied
   parameter joins *every* module holding it to its unit; where such a module runs
   elsewhere in forward (``lm_head`` last, ``wte`` first), FSDP2 keeps the group unsharded from its
   first module's forward to its last's (it reshards a group after its last module's forward): the
   unit is *spanning*, and its bytes are added to the plan's peak as a bound; so is a unit whose module
   contains another unit's (a child called first, e.g. a layer's last norm joined to the next layer): the
   child is gathered while its parent's unit is still unsharded;
3. each unit's module list is lifted to the largest subtrees whose parameter-holding modules are all in
   the unit (``h.3`` rather than its eight leaves): the same parameters, fewer hooks;
4. a module whose forward never runs on the example (``nn.MultiheadAttention``'s ``out_proj``: its weight is
   read by its parent's forward) or whose output is a view (an ``nn.Linear`` on a 3-D input: FSDP2's
   pre-backward hook on a view is lost to an in-place op, and FSDP2 warns) is not *shardable*: its
   parameters count as held by its nearest shardable ancestor (the root at worst), so FSDP2 gathers them
   where they are read (:func:`shardable_modules`; without an example, every module that has a forward);
5. calls are ordered children first (a module holding parameters of unit ``j`` whose submodules hold
   those of unit ``k`` is sharded after ``k``); a unit holding the root's own parameters is the root call,
   made last. Parameters in no layer stay with the call of a module above them, else the root's;
6. a module holding frozen parameters only, under no module holding trainable ones (a frozen stem, backbone
   or tower), is a layer of its own, planned and gathered as the others (:mod:`dpcomm.fsdp.frozen`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.planner.fsdp_atoms import holder_atoms, merge_units
from dpcomm.planner.fsdp_model import FsdpPlan

__all__ = [
    "ShardGroups",
    "call_params",
    "layer_atoms",
    "layer_holders",
    "merge_units",
    "mixed_dtypes",
    "shard_groups",
    "shardable_modules",
]

ROOT = ""
"""The root module's path (``model.named_modules()`` names it ``""``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardGroups:
    """Per unit of the plan as run, the module paths one ``fully_shard`` call gets, and the call order."""

    units: tuple[tuple[int, int], ...]
    """The plan's units, ``(first, last)`` layers (each one ``fully_shard`` call: point 2)."""
    modules: tuple[tuple[str, ...], ...]
    """Module paths per unit (``""`` alone: the root call)."""
    order: tuple[int, ...]
    """Unit indices in the order ``fully_shard`` is called (children first, the root last)."""
    spanning: tuple[int, ...]
    """Units FSDP2 keeps unsharded beyond their own layers (a tied parameter's other holder, or the root)."""
    notes: tuple[str, ...]
    """One line per unit FSDP2 keeps unsharded beyond its layers (the root's, a tied parameter's), for the
    user."""

    @property
    def root_unit(self) -> int | None:
        """The unit made by the root call, if a unit holds the root's own parameters."""
        return next((k for k, m in enumerate(self.modules) if m == (ROOT,)), None)


def call_params(model: nn.Module, groups: ShardGroups) -> tuple[list[list[nn.Parameter]], list[nn.Parameter]]:
    """The parameters each unit's ``fully_shard`` call manages (every one under its modules that no earlier
    call took, frozen ones included; the root unit's call takes whatever is left), and those the root call
    takes when no unit is the root's."""
    mods = dict(model.named_modules())
    taken: set[int] = set()
    out: list[list[nn.Parameter]] = [[] for _ in groups.units]
    for k in groups.order:
        if groups.modules[k] == (ROOT,):
            continue
        for path in groups.modules[k]:
            for p in mods[path].parameters():
                if id(p) not in taken:
                    taken.add(id(p))
                    out[k].append(p)
    rest = [p for p in model.parameters() if id(p) not in taken]
    if groups.root_unit is None:
        return out, rest
    out[groups.root_unit] = rest
    return out, []


def mixed_dtypes(model: nn.Module, groups: ShardGroups) -> str | None:
    """One line naming the first ``fully_shard`` call whose parameters differ in dtype (FSDP2 asserts
    "uniform original parameter dtype"), None when every call's are uniform."""
    per_unit, rest = call_params(model, groups)
    names = {id(p): n for n, p in model.named_parameters()}
    for k, ps in [*enumerate(per_unit), (None, rest)]:
        kinds: dict[torch.dtype, list[str]] = {}
        for p in ps:
            kinds.setdefault(p.dtype, []).append(names[id(p)])
        if len(kinds) > 1:
            where = (
                "the root call"
                if k is None
                else f"unit {k} ({', '.join(m or '(root)' for m in groups.modules[k])})"
            )
            parts = "; ".join(
                f"{dt}: {', '.join(ns[:3])}{' ...' if len(ns) > 3 else ''}" for dt, ns in kinds.items()
            )
            return (
                f"dpcomm.fsdp.shard: FSDP2 needs one parameter dtype per fully_shard call, and {where} mixes "
                f"{parts}; cast them alike (and pass FSDP2 a MixedPrecisionPolicy for the compute dtype)"
            )
    return None


def shardable_modules(
    model: nn.Module, example: Any, shapes: dict[str, list[tuple[int, ...]]] | None = None
) -> frozenset[str]:
    """Paths of the modules whose forward runs on ``example`` and returns no view that needs a gradient
    (point 4); one forward, no backward, under :func:`dpcomm.utils.user_run.untouched`. ``shapes``: filled
    with each module's input shapes, every call (:mod:`dpcomm.fsdp.agreed` compares them across ranks)."""
    from dpcomm.utils.user_run import call, tensors_in

    paths = {m: p for p, m in model.named_modules()}
    ran: set[str] = {ROOT}
    views: set[str] = set()

    def inputs(mod: nn.Module, args: Any, kwargs: Any) -> None:  # None: the inputs go on as they are
        shapes.setdefault(paths[mod], []).extend(tuple(t.shape) for t in tensors_in((args, kwargs)))  # type: ignore[union-attr]

    def hook(mod: nn.Module, _inputs: Any, output: Any) -> None:
        ran.add(paths[mod])
        if any(t.requires_grad and t._base is not None for t in tensors_in(output, most=64)):
            views.add(paths[mod])

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    if shapes is not None:
        handles += [m.register_forward_pre_hook(inputs, with_kwargs=True) for m in model.modules()]
    try:
        with torch.enable_grad():
            call(model, example)
    finally:
        for h in handles:
            h.remove()
    return frozenset(ran - (views - {ROOT}))


def layer_holders(model: nn.Module, example: Any, layer_params: Sequence[Sequence[str]]) -> list[list[str]]:
    """Per layer (a trace's, by its parameters' names), the modules :func:`shard_groups` gives its
    parameters to: each one's nearest shardable holder on ``example`` (points 1 and 4; ``""``: the root).
    What ``dpcomm profile`` records as a layer's ``fsdp_modules``, so that ``dpcomm plan --fsdp`` plans and
    prints only units ``shard`` runs as they are. One forward, the model left as it was."""
    from dpcomm.utils.user_run import untouched

    with untouched(model):
        shardable = shardable_modules(model, example)
    return _layer_holders(model, layer_params, shardable)


def layer_atoms(
    model: nn.Module, layer_params: Sequence[Sequence[str]], shardable: Collection[str] | None = None
) -> list[tuple[int, int]]:
    """The runs of consecutive layers one ``fully_shard`` call must take whole
    (:func:`dpcomm.planner.fsdp_atoms.holder_atoms` of each layer's holders, points 1 and 4): what every
    planner of :func:`dpcomm.fsdp.shard` plans over, so that :func:`shard_groups` never has to merge."""
    return holder_atoms(_layer_holders(model, layer_params, shardable))


def _layer_holders(
    model: nn.Module, layer_params: Sequence[Sequence[str]], shardable: Collection[str] | None
) -> list[list[str]]:
    holders: dict[str, list[str]] = {}  # a tied parameter: every module holding it
    for path, names in _holders(model, shardable).items():
        for n in names:
            holders.setdefault(n, []).append(path)
    return [list(dict.fromkeys(h for n in names for h in holders.get(n, [ROOT]))) for names in layer_params]


def _shardable(model: nn.Module, shardable: Collection[str] | None) -> Callable[[str, nn.Module], bool]:
    def ok(path: str, mod: nn.Module) -> bool:
        if not path:
            return True
        if type(mod).forward is nn.Module.forward:  # a ModuleList runs no forward: fully_shard refuses it
            return False
        return shardable is None or path in shardable

    return ok


def _holders(model: nn.Module, shardable: Collection[str] | None = None) -> dict[str, list[str]]:
    """Module path -> names of the parameters it holds directly, a tied one by its first name in
    ``model.named_parameters()`` (the name traces use); a module that is not shardable hands its parameters
    to its nearest shardable ancestor (point 4)."""
    canon = {id(p): n for n, p in model.named_parameters()}
    ok = _shardable(model, shardable)
    mods = dict(model.named_modules())
    direct: dict[str, list[str]] = {}
    for path, mod in model.named_modules():
        names = [canon[id(p)] for _, p in mod.named_parameters(recurse=False, remove_duplicate=False)]
        if not names:
            continue
        holder = path
        while not ok(holder, mods[holder]):
            holder = holder.rpartition(".")[0]
        direct.setdefault(holder, []).extend(n for n in names if n not in direct.get(holder, []))
    return direct


def shard_groups(
    model: nn.Module,
    plan: FsdpPlan,
    layer_params: Sequence[Sequence[str]],
    shardable: Collection[str] | None = None,
) -> ShardGroups:
    """The ``fully_shard`` calls that run ``plan`` on ``model`` (module docstring); ``layer_params``: the
    parameter names of each of the plan's layers (forward order); ``shardable``: the modules that may be a
    unit (:func:`shardable_modules`; None: every module with a forward). A one-line :class:`UserError` where
    the layers do not match the model, where a unit splits a module (point 2), or where no call order
    exists."""
    if len(layer_params) != plan.num_modules:
        raise UserError(f"the plan has {plan.num_modules} modules, the model's trace {len(layer_params)}")
    direct = _holders(model, shardable)
    known = {n for names in direct.values() for n in names}
    layer_of: dict[str, int] = {}
    for i, names in enumerate(layer_params):
        for n in names:
            if n not in known:
                raise UserError(f"the trace names parameter {n!r}, which the model does not have")
            layer_of[n] = i
    units = list(plan.units)
    notes: list[str] = []
    unit_of = {i: k for k, (a, b) in enumerate(units) for i in range(a, b + 1)}
    for path, names in direct.items():  # point 2: every module's direct parameters in one unit
        ks = sorted({unit_of[layer_of[n]] for n in names if n in layer_of})
        if len(ks) > 1:
            first, last = (_unit_text(units, k, layer_params) for k in (ks[0], ks[-1]))
            raise UserError(
                f"FSDP plan '{plan.method}' splits module {path or '(root)'} between the units of {first} "
                f"and {last}; FSDP2 shards whole modules: plan over the model's atoms "
                "(dpcomm.fsdp.groups.layer_atoms, plan_fsdp(..., atoms=...))"
            )
    members: list[set[str]] = [set() for _ in units]
    for path, names in direct.items():
        ks = {unit_of[layer_of[n]] for n in names if n in layer_of}
        if ks:
            members[ks.pop()].add(path)
    owners = {n: p for p, names in reversed(list(direct.items())) for n in names}  # first holder
    spanning = set()
    for k, mods in enumerate(members):
        if ROOT in mods:
            spanning.add(k)
            notes.append(
                f"the unit of {_unit_text(units, k, layer_params)} holds the root module's own parameters: "
                "it is the root call, gathered first"
            )
        shared = sorted(p for p in mods if any(owners[n] != p for n in direct[p] if n in layer_of))
        if shared and len(units) > 1:  # one unit is gathered for the whole pass anyway
            spanning.add(k)
            notes.append(
                f"the unit of {_unit_text(units, k, layer_params)} also holds {', '.join(shared)} (a tied "
                "parameter): FSDP2 keeps it unsharded until its last module's forward"
            )
    ok = _shardable(model, shardable)
    lifted = [_lift(model, mods, set(direct), ok) if ROOT not in mods else (ROOT,) for mods in members]
    for k, j, outer, inner in _nested(lifted):  # k's module runs j's inside it: both unsharded at once
        if k not in spanning:
            spanning.add(k)
            notes.append(
                f"the unit of {_unit_text(units, k, layer_params)} ({outer}) runs {inner} of unit {j} inside "
                "its forward: FSDP2 holds both unsharded then"
            )
    return ShardGroups(
        units=tuple(units),
        modules=tuple(lifted),
        order=_order(lifted),
        spanning=tuple(sorted(spanning)),
        notes=tuple(notes),
    )


def _nested(lifted: Sequence[tuple[str, ...]]) -> list[tuple[int, int, str, str]]:
    """``(k, j, outer, inner)`` where unit ``k``'s module ``outer`` (not the root) contains unit ``j``'s
    ``inner``: a call on a child made before its parent's (children first), run inside the parent's
    forward."""
    out = []
    for k, outer_mods in enumerate(lifted):
        for outer in outer_mods:
            inner = [
                (j, q)
                for j, qs in enumerate(lifted)
                if j != k
                for q in qs
                if outer and q.startswith(outer + ".")
            ]
            if outer and inner:
                out.append((k, inner[0][0], outer, inner[0][1]))
                break
    return out


def _unit_text(units: Sequence[tuple[int, int]], k: int, layer_params: Sequence[Sequence[str]]) -> str:
    """Unit ``k`` named by its parameters (``h.3.*``), for the notes."""
    from dpcomm.trace.names import pattern

    a, z = units[k]
    every = [n for names in layer_params for n in names]
    return pattern([n for names in layer_params[a : z + 1] for n in names], every)


def _lift(
    model: nn.Module, mods: set[str], holders: set[str], ok: Callable[[str, nn.Module], bool]
) -> tuple[str, ...]:
    """The largest non-root subtrees whose parameter-holding modules all lie in ``mods`` (point 3); a
    module that is not shardable (``ok``; a ``ModuleList`` runs no forward of its own) is never one."""
    below: dict[str, set[str]] = {}
    for path, _ in model.named_modules():
        if path in holders:
            parts = path.split(".")
            for k in range(1, len(parts) + 1):
                below.setdefault(".".join(parts[:k]), set()).add(path)
    chosen: list[str] = []
    for path, mod in model.named_modules():  # pre-order: an ancestor comes before its descendants
        if not path or any(path.startswith(c + ".") for c in chosen):
            continue
        if not ok(path, mod):
            continue
        if below.get(path) and below[path] <= mods:
            chosen.append(path)
    left = sorted(mods - {h for c in chosen for h in below[c]})  # holders whose subtree reaches other units
    out = chosen + left
    # a module whose ancestor is in the same call is taken by it (the other units below are sharded first)
    return tuple(p for p in out if not any(p.startswith(q + ".") for q in out))


def _order(lifted: list[tuple[str, ...]]) -> tuple[int, ...]:
    """Units in call order: a unit holding an ancestor of another unit's module comes after it (point 4)."""
    after: dict[int, set[int]] = {k: set() for k in range(len(lifted))}
    for k, mods in enumerate(lifted):
        for j, other in enumerate(lifted):
            if j != k and any(o.startswith(m + ".") or (m == ROOT and o) for m in mods for o in other):
                after[k].add(j)  # k's module is an ancestor of j's: shard j first
    out: list[int] = []
    while len(out) < len(lifted):
        ready = [k for k in after if k not in out and after[k] <= set(out)]
        if not ready:
            raise UserError("FSDP2 cannot shard this plan: two units hold each other's submodules")
        out.append(ready[0])
    return tuple(out)
