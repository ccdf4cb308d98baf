"""FSDP2's own ``fully_shard`` keywords as :func:`dpcomm.fsdp.shard` takes them.

- :func:`check_fsdp_keywords`: ``shard(model, plan, **fsdp_kw)`` passes ``fsdp_kw`` to every unit's
  ``fully_shard`` call and to the trial's copies; a keyword ``fully_shard`` does not take, one that is
  ``shard``'s to decide (``mesh``, ``reshard_after_forward``: the plan's choice), a policy of the wrong
  type, an offload that pins memory where no accelerator is, or ``ignored_params`` that are not the model's
  own parameters is one :class:`UserError` before anything is profiled or sharded (FSDP2 itself would raise
  a traceback from the middle of sharding, after the planning).
- :func:`check_dense`: a module with ``sparse=True`` (``nn.Embedding``, ``nn.EmbeddingBag``) and a trainable
  weight gives a sparse gradient, which FSDP2 cannot reduce-scatter (its ``chunk_cat`` has no sparse
  kernel: a multi-line ``NotImplementedError`` from the first backward): one :class:`UserError` first.
- :func:`check_unit_s`: ``shard``'s own ``unit_s`` (FSDP2's fixed cost of a unit per pass, the planner's
  ``c``), checked the same way.
- :func:`planned_without`: the ignored parameters held out of planning (FSDP2 neither shards, gathers nor
  reduces them: no unit may plan them).
- :func:`as_fsdp2_computes`: the model's parameters and floating inputs in a policy's ``param_dtype`` while
  its units are timed, as FSDP2 runs them (the parameters cast, the buffers not, the floating inputs of
  every module holding parameters cast, as FSDP2 casts a unit's: the units are not known yet, and any such
  module may be one), so a model FSDP2 cannot run under the policy fails here, in one line, and one it runs
  is timed as it runs. With ``units`` (the planned ``fully_shard`` calls' modules) only those cast, as
  FSDP2 will: :func:`check_runs_as_planned` runs the model so before it is sharded.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.utils.user_run import map_tensors

__all__ = [
    "as_fsdp2_computes",
    "check_dense",
    "check_runs_as_planned",
    "check_fsdp_keywords",
    "check_unit_s",
    "planned_without",
]

OWN = {"reshard_after_forward": "the plan's choice, not a keyword (an FsdpPlan given to shard fixes it)"}
"""``fully_shard`` keywords that are ``shard``'s to decide, and why (``mesh`` is ``shard``'s own argument)."""


def check_dense(model: nn.Module) -> None:
    """One :class:`UserError` naming the modules whose trainable weights get sparse gradients."""
    sparse = [
        f"{path or '(root)'} ({type(m).__name__}(sparse=True))"
        for path, m in model.named_modules()
        if getattr(m, "sparse", False) is True and any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    if sparse:
        raise UserError(
            f"dpcomm.fsdp.shard: {', '.join(sparse[:3])}{' ...' if len(sparse) > 3 else ''} gives sparse "
            "gradients, which FSDP2 cannot reduce-scatter; build it with sparse=False"
        )


def check_fsdp_keywords(model: nn.Module, fsdp_kw: dict[str, Any]) -> None:
    """One :class:`UserError` for keywords FSDP2 would refuse, or refuse later with a traceback."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    for key in fsdp_kw:
        if key in OWN:
            raise UserError(f"dpcomm.fsdp.shard: {key} is {OWN[key]}")
    takes = [k for k in inspect.signature(fully_shard).parameters if k not in ("module", "mesh", *OWN)]
    bad = sorted(set(fsdp_kw) - set(takes))
    if bad:
        said = ", ".join(takes)
        raise UserError(f"dpcomm.fsdp.shard: fully_shard takes no keyword {bad[0]!r}; it takes {said}")
    mp = fsdp_kw.get("mp_policy", MixedPrecisionPolicy())
    if not isinstance(mp, MixedPrecisionPolicy):
        raise UserError(
            f"dpcomm.fsdp.shard: mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy, got {mp!r}"
        )
    off = fsdp_kw.get("offload_policy", OffloadPolicy())
    if not isinstance(off, OffloadPolicy):
        raise UserError(f"dpcomm.fsdp.shard: offload_policy must be an OffloadPolicy, got {off!r}")
    if isinstance(off, CPUOffloadPolicy) and off.pin_memory and not _accelerator():
        raise UserError(
            "dpcomm.fsdp.shard: CPUOffloadPolicy() pins the offloaded shards, which needs an accelerator "
            "(none here); pass CPUOffloadPolicy(pin_memory=False)"
        )
    ignored = fsdp_kw.get("ignored_params")
    if ignored is not None:
        if not isinstance(ignored, set | frozenset) or not all(isinstance(p, torch.Tensor) for p in ignored):
            raise UserError("dpcomm.fsdp.shard: ignored_params must be a set of the model's parameters")
        own = {id(p) for p in model.parameters()}
        if any(id(p) not in own for p in ignored):
            raise UserError("dpcomm.fsdp.shard: ignored_params holds a parameter that is not the model's")


def check_unit_s(unit_s: Any, plan: Any) -> float:
    """``shard``'s ``unit_s`` (FSDP2's fixed cost of a unit per pass, seconds): a finite number >= 0, and
    only with a planner name (it prices the plans ``shard`` makes); anything else, one :class:`UserError`."""
    if isinstance(unit_s, bool) or not isinstance(unit_s, int | float) or not 0 <= unit_s < float("inf"):
        raise UserError(f"dpcomm.fsdp.shard: unit_s is seconds a unit per pass, a finite number >= 0, "
                        f"got {unit_s!r}")  # fmt: skip
    if not isinstance(plan, str):
        raise UserError("dpcomm.fsdp.shard: unit_s prices the plans shard makes; a given FsdpPlan runs as it "
                        "is: make it with plan_fsdp(..., unit_s=) or pass a planner name")  # fmt: skip
    return float(unit_s)


def _accelerator() -> bool:
    acc = getattr(torch, "accelerator", None)
    return bool(acc.is_available()) if acc is not None else torch.cuda.is_available()


@contextlib.contextmanager
def planned_without(fsdp_kw: dict[str, Any]) -> Iterator[None]:
    """The ignored parameters frozen (``requires_grad=False``) while the block plans: no gradient unit
    holds them, so no unit gathers or reduces them; their flags restored after."""
    from dpcomm.fsdp.frozen import HELD_OUT

    ignored = list(fsdp_kw.get("ignored_params") or ())
    flags = [p.requires_grad for p in ignored]
    try:
        for p in ignored:
            p.requires_grad_(False)
        HELD_OUT.update(id(p) for p in ignored)  # frozen for planning, but no frozen unit may take them
        yield
    finally:
        HELD_OUT.difference_update(id(p) for p in ignored)
        for p, flag in zip(ignored, flags, strict=True):
            p.requires_grad_(flag)


@contextlib.contextmanager
def as_fsdp2_computes(
    model: nn.Module, example: Any, dtype: torch.dtype | None, units: Any = None
) -> Iterator[Any]:
    """``example`` with its floating tensors in ``dtype``, the model's parameters cast to ``dtype`` (their
    data swapped; gradients cleared) and the floating inputs of every module holding parameters cast on
    the way in (a forward pre-hook) for the block, as FSDP2's ``MixedPrecisionPolicy(param_dtype=dtype)``
    runs them; the hooks removed and the parameters' own data and gradients put back after. ``dtype`` None:
    as they are.
    Holds a ``dtype`` copy of the parameters beside them for the block (planning a model too large for that:
    build it on ``meta``, planned from FLOPs)."""
    if dtype is None:
        yield example
        return
    params = list(model.parameters())
    saved = [(p.data, p.grad) for p in params]

    def cast(x: Any) -> Any:
        return map_tensors(x, lambda t: t.to(dtype) if t.is_floating_point() else t)

    def inputs(_: nn.Module, args: Any, kwargs: Any) -> Any:  # FSDP2's cast_forward_inputs, per unit
        return cast(args), cast(kwargs)

    mods = dict(model.named_modules())
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    if units is not None:  # the planned units' modules and the root: where FSDP2 itself casts
        owners = [mods[p] for p in dict.fromkeys(["", *(p for ps in units for p in ps)])]
    hooks = []
    try:
        for p in params:
            p.grad = None
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        hooks = [m.register_forward_pre_hook(inputs, with_kwargs=True) for m in owners]
        yield cast(example)
    finally:
        for h in hooks:
            h.remove()
        for p, (data, grad) in zip(params, saved, strict=True):
            p.data = data
            p.grad = grad


def check_runs_as_planned(
    model: nn.Module, example: Any, dtype: Any, units: Any, loss_fn: Any, group: Any
) -> None:
    """One forward and backward of ``example`` with the inputs cast to ``dtype`` only where a planned unit
    (``units``: each ``fully_shard`` call's module paths) or the root starts, as FSDP2's mixed precision
    casts them; one :class:`UserError` on every rank where the model cannot compute so (a float32 buffer
    added to a half activation inside a unit, then a half norm: it ran in the profile, where every module
    holding parameters was cast). The model is left as it was."""
    from dpcomm.trace.profiler import default_loss
    from dpcomm.utils.user_run import call, on_every_rank, untouched

    def run() -> None:
        with untouched(model), as_fsdp2_computes(model, example, dtype, units) as cast:
            (loss_fn or default_loss)(call(model, cast)).backward()

    shown = "; ".join(", ".join(p or "(root)" for p in ps) for ps in units[:4])
    shown += "; ..." if len(units) > 4 else ""
    what = (
        "dpcomm.fsdp.shard: the model as FSDP2's mp_policy runs it, its inputs cast only where a unit starts "
        f"(units [{shown}]; give the modules whose inputs mix dtypes units of their own),"
    )
    on_every_rank(run, group, what)
