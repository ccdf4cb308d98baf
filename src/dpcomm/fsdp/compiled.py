"""dpcomm's FSDP2 plans under ``torch.compile``: compile the units in place, and price the plan with the
compiled model's times.

torchtitan's pattern is ``fully_shard`` per block, then ``torch.compile`` per block: each unit's forward
and backward become compiled graphs, FSDP2's hooks stay outside them (``torch._dynamo.config.
skip_fsdp_hooks``, on by default in torch 2.13), so the units, their all-gathers and reduce-scatters and
the prefetch lists are FSDP2's, unchanged. What compiling changes is the compute: a unit runs as one
fused graph, faster or slower than eager, and a unit's gradients all become ready at the end of its
compiled backward. The FSDP cost model (:mod:`dpcomm.planner.fsdp_model`) needs each layer's forward and
backward time; :func:`shard_compiled` takes them from the compiled model:

1. before sharding it keeps an unsharded replica of the model (a whole copy on every rank: this is for
   models one device holds; a model on ``meta`` is not timed);
2. :func:`dpcomm.fsdp.shard` shards the model (its plan made on the eager profile, as always);
3. the replica's units (the same module paths as the plan's ``fully_shard`` calls) are compiled as
   :func:`compile_units` compiles the model's, each behind a thin timing wrapper (outside the compiled
   graph, so the graph is the model's), and timed on ``example`` (:func:`unit_times`): a unit's forward
   runs from its first module's start to the next unit's, the loss with the last; its backward from the
   previous gradient-ready mark to each of its parameters' marks (the profiler's partition,
   :mod:`dpcomm.trace.profiler`, at unit granularity: inside a compiled unit there are no layers to time),
   medians over ``time_iters`` passes after two warm-up passes (the first compiles), averaged over ranks;
4. each unit's compiled times are spread over its layers in proportion to the eager profile's
   (:func:`compiled_trace`), the result replaces ``model.dpcomm.trace`` (``extra``: ``measured_by =
   "dpcomm.fsdp.compiled"``, the backend, the eager unit sums and price) and the plan's ``time_s`` is the
   cost model's price on it (the units, depth and reshard, and so the plan's hash, are unchanged);
5. the model's units are compiled (:func:`compile_units`).

The plan is priced, not made again, on the compiled times: a plan made on them would change the units,
which changes the compiled graphs. The timing adds, per rank, one compile of each unit of the replica.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import replace
from typing import Any

from torch import nn

from dpcomm.fsdp.groups import ROOT

__all__ = ["compile_units", "compiled_trace", "shard_compiled", "unit_times"]


def compile_units(model: nn.Module, backend: str = "inductor") -> None:
    """``module.compile(backend=...)`` on every ``fully_shard`` unit but the root, in place (torchtitan's
    per-block compile): the units, their FSDP2 hooks and the prefetch lists stay as :func:`shard` set them."""
    mods = dict(model.named_modules())
    for paths in model.dpcomm.groups.modules:
        for path in paths:
            if path != ROOT:
                mods[path].compile(backend=backend)


def shard_compiled(
    model: nn.Module,
    plan: Any,
    *,
    backend: str = "inductor",
    example: Any | None = None,
    loss_fn: Any = None,
    time_iters: int = 3,
    **shard_kwargs: Any,
) -> nn.Module:
    """:func:`dpcomm.fsdp.shard` then :func:`compile_units`, the plan priced on the compiled units' times
    (module docstring; without ``example``, or on ``meta``, nothing is timed). Returns ``model``."""
    from dpcomm.fsdp.planning import is_meta
    from dpcomm.fsdp.shard import shard
    from dpcomm.planner.autoplan import rank_mean
    from dpcomm.utils.user_run import on_every_rank

    replica = copy.deepcopy(model) if example is not None and not is_meta(model) else None
    shard(model, plan, example=example, loss_fn=loss_fn, **shard_kwargs)
    said = model.dpcomm
    if replica is not None and said.trace is not None:
        group = shard_kwargs.get("process_group")
        f, b = on_every_rank(
            lambda: unit_times(replica, said.groups.modules, said.plan.units, said.layer_params, example,
                               backend=backend, loss_fn=loss_fn, iters=time_iters),
            group, "dpcomm.fsdp.shard_compiled: timing the compiled units",
        )  # fmt: skip
        del replica
        n = len(f)
        fb = rank_mean(f + b, group)  # every rank prices the same times, as the eager profile's
        f, b = fb[:n], fb[n:]
        eager_time_s = said.plan.time_s
        said.trace = compiled_trace(said.trace, said.plan.units, f, b, backend)
        said.trace.extra["eager_time_s"] = eager_time_s
        said.plan = replace(said.plan, time_s=_price(model, said))
    compile_units(model, backend)
    return model


def compiled_trace(
    trace: Any, units: Any, forward_s: list[float], backward_s: list[float], backend: str
) -> Any:
    """``trace`` with each unit's layers given the unit's compiled times, split as the eager times split."""
    rows = list(trace.layers)
    eager_f, eager_b = [], []
    for k, (a, z) in enumerate(units):
        run = rows[a : z + 1]
        ef, eb = sum(x.forward_s for x in run), sum(x.backward_s for x in run)
        eager_f.append(ef)
        eager_b.append(eb)
        for i, x in enumerate(run):
            f = forward_s[k] * (x.forward_s / ef if ef > 0 else 1 / len(run))
            b = backward_s[k] * (x.backward_s / eb if eb > 0 else 1 / len(run))
            rows[a + i] = replace(x, forward_s=f, backward_s=b)
    extra = {**trace.extra, "measured_by": "dpcomm.fsdp.compiled", "backend": backend,
             "unit_forward_s": list(forward_s), "unit_backward_s": list(backward_s),
             "eager_unit_forward_s": eager_f, "eager_unit_backward_s": eager_b}  # fmt: skip
    return replace(trace, layers=tuple(rows), extra=extra)


class _Timed(nn.Module):
    """A unit's module between two marks (its start, and its end as ``after``'s), taken outside the
    compiled graph."""

    def __init__(self, inner: nn.Module, unit: int, after: int, marks: list[tuple[float, int]], clock: Any):
        super().__init__()
        self.inner, self.unit, self.after, self.marks, self.clock = inner, unit, after, marks, clock

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.marks.append((self.clock(), self.unit))
        out = self.inner(*args, **kwargs)
        self.marks.append((self.clock(), self.after))
        return out


def unit_times(
    replica: nn.Module,
    modules: Any,
    units: Any,
    layer_params: Any,
    example: Any,
    *,
    backend: str,
    loss_fn: Any = None,
    iters: int = 3,
    warmup: int = 2,
) -> tuple[list[float], list[float]]:
    """Median forward and backward seconds per unit of ``replica`` (unsharded, consumed) with its units'
    modules compiled by ``backend`` (module docstring, step 3). ``modules``: module paths per unit;
    ``units``: each unit's ``(first, last)`` layer; ``layer_params``: parameter names per layer."""
    from dpcomm.fsdp.planning import call_model, on_model_device
    from dpcomm.timing import now
    from dpcomm.trace.profiler import default_loss

    example = on_model_device(replica, example)
    device = next(replica.parameters()).device
    clock = lambda: now(device)  # noqa: E731  (on a GPU: once the queued kernels ran)
    unit_of = {n: k for k, (a, z) in enumerate(units) for names in layer_params[a : z + 1] for n in names}
    fwd: list[tuple[float, int]] = []
    bwd: list[tuple[float, int]] = []
    handles = []
    root = next((k for k, paths in enumerate(modules) if paths == (ROOT,)), None)
    paths = sorted(
        ((p, k) for k, ps in enumerate(modules) for p in ps if p != ROOT), key=lambda x: -x[0].count(".")
    )
    for path, k in paths:  # deepest first: a wrapped parent would hide its children's paths
        parent, _, leaf = path.rpartition(".")
        owner = replica.get_submodule(parent)
        inner = owner.get_submodule(leaf)
        inner.compile(backend=backend)
        # what runs after a unit and before the next (parameter-free operations) is the root unit's if
        # there is one (it holds the modules in between), else the unit's own (the profiler's rule)
        setattr(owner, leaf, _Timed(inner, k, k if root is None else root, fwd, clock))
    for n, p in replica.named_parameters():
        name = n.replace(".inner.", ".").removesuffix(".inner")
        k = unit_of.get(name)
        if k is not None and p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, k=k: bwd.append((clock(), k))))  # fmt: skip
    n_units = len(units)
    per_f: list[list[float]] = [[] for _ in range(n_units)]
    per_b: list[list[float]] = [[] for _ in range(n_units)]
    for it in range(warmup + iters):
        fwd.clear()
        bwd.clear()
        for p in replica.parameters():
            p.grad = None
        t0 = clock()
        loss = (loss_fn or default_loss)(call_model(replica, example))
        t1 = clock()
        loss.backward()
        t2 = clock()
        if it < warmup:
            continue
        f, b = [0.0] * n_units, [0.0] * n_units
        head = root if root is not None else (fwd[0][1] if fwd else 0)  # before the first unit: the root's
        marks = [(t0, head), *fwd, (t1, -1)]  # the loss goes with what ran last
        for (s, k), (e, _) in zip(marks, marks[1:], strict=False):
            f[k] += e - s
        last = t1
        for t, k in sorted(bwd):
            b[k] += t - last
            last = t
        if bwd:
            b[sorted(bwd)[-1][1]] += t2 - last  # the engine's tail: to the last unit whose gradient came
        for k in range(n_units):
            per_f[k].append(f[k])
            per_b[k].append(b[k])
    for h in handles:
        h.remove()
    return [statistics.median(x) for x in per_f], [statistics.median(x) for x in per_b]


def _price(model: nn.Module, said: Any) -> float:
    """The cost model's iteration time of ``said.plan`` on ``said.trace`` (as the planner priced it, FSDP2's
    fixed cost per unit included)."""
    import numpy as np

    from dpcomm.fsdp.planning import overlap_of
    from dpcomm.planner.fsdp import Modules, fsdp_time
    from dpcomm.planner.fsdp_precision import scaled_bytes

    if said.ag_cost is None:
        return float("nan")
    gather = said.precision.gather_bytes  # bytes per element as FSDP2 gathers them (mp_policy)
    size = {n: p.numel() * gather(p.element_size()) for n, p in model.named_parameters()}
    m = np.array([sum(size.get(n, 0) for n in names) for names in said.layer_params], dtype=float)
    mods, k = Modules.from_trace(said.trace).under(said.precision)
    f, b, _ = mods.arrays
    plan = said.plan
    t = fsdp_time(
        list(plan.units), f, b, m, said.ag_cost, scaled_bytes(said.rs_cost, k), depth=plan.depth,
        reshard=plan.reshard_after_forward, overlap=overlap_of(model), ar_cost=scaled_bytes(said.ar_cost, k),
        unit_s=plan.meta.get("unit_s", 0.0),
    )  # fmt: skip
    return float(t)
