"""Steps 1-3 of :func:`dpcomm.ddp.wrap` on the workers (its module docstring): profile the gradient units
(or take their sizes), price the all-reduce, plan on rank 0 and check the plan's hash on every rank; and
the units as DDP's mode and a compiled graph let them be cut (:func:`static_order`, :func:`merge_layers`,
:func:`compiled_units`), timed as the compiled model runs them (:func:`compiled_times`). Building DDP and
the timed trial are :mod:`dpcomm.ddp.wrap`'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.trace.format import Layer, Trace
from dpcomm.utils.user_run import first_param, on_every_rank

__all__ = [
    "TIMED",
    "agreed_trace",
    "check_unused",
    "compiled_times",
    "compiled_units",
    "merge_layers",
    "plan_on_workers",
    "sizes_trace",
    "static_order",
]

TIMED = ("mgwfbp", "optimal")
"""Planners whose plan depends on measured times (the others need only the layer sizes)."""


def sizes_trace(model: nn.Module, units: Any, name: str) -> Trace:
    """Sizes only: ``units`` (the agreed analysis's; the learnable layers in registration order if None).
    Parameters of mixed dtypes (bf16 and fp32, say): ``dtype_bytes`` is the greatest common divisor of their
    element sizes and ``params`` counts such words, so each unit's ``layer_bytes`` is its gradients' bytes
    (DDP all-reduces each dtype's gradients in its own dtype)."""
    import math

    from dpcomm.ddp.buckets import model_units
    from dpcomm.trace.units import unit_params

    units = list(units) if units is not None else model_units(model)
    owned = unit_params(model, units)
    sizes = {p.element_size() for ps in owned for p in ps}
    dtype_bytes = math.gcd(*sizes) if sizes else 4
    rows = tuple(
        Layer(
            name=u.name, params=sum(p.numel() * p.element_size() for p in ps) // dtype_bytes, forward_s=0.0,
            backward_s=0.0, param_names=u.param_names, unused=u.unused,
        )
        for u, ps in zip(units, owned, strict=True)
    )  # fmt: skip
    return Trace(model=name, batch_size=1, device="none", dtype_bytes=dtype_bytes, layers=rows)


def agreed_trace(model: nn.Module, local: Trace, units: Any, group: Any, measured_by: str) -> Trace:
    """This rank's profile ``local`` (its own example's units) as times of the agreed ``units``, averaged
    over ranks: each local unit's forward and backward time is shared among its parameters by size and
    summed per agreed unit (a unit this rank did not run costs it nothing)."""
    from dpcomm.planner.autoplan import rank_mean

    numel = {n: p.numel() for n, p in model.named_parameters()}
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    for x in local.layers:
        size = sum(numel[n] for n in x.param_names) or 1
        for n in x.param_names:
            fwd[n], bwd[n] = x.forward_s * numel[n] / size, x.backward_s * numel[n] / size
    f = [sum(fwd.get(n, 0.0) for n in u.param_names) for u in units]
    b = [sum(bwd.get(n, 0.0) for n in u.param_names) for u in units]
    fb = rank_mean(f + b, group)
    sized = sizes_trace(model, units, type(model).__name__)
    layers = tuple(replace(x, forward_s=fb[i], backward_s=fb[len(f) + i]) for i, x in enumerate(sized.layers))
    return replace(
        local, model=type(model).__name__, dtype_bytes=sized.dtype_bytes, layers=layers,
        extra={"measured_by": measured_by},
    )  # fmt: skip


def plan_on_workers(
    model: nn.Module,
    schedule: str,
    *,
    example: Any | None = None,
    loss_fn: Any = None,
    collective: str = "native",
    network: Any = None,
    profile_iters: int = 3,
    process_group: Any = None,
    static_graph: bool = False,
    coarsen: Any = None,
    retime: Any = None,
    analysis: Any = None,
) -> tuple[Plan, Trace, CommCost]:
    """Profile, price and plan on every rank of ``process_group`` (see module docstring); every rank gets
    the same plan, trace and cost. ``mgwfbp`` and ``optimal`` need ``example`` (one input batch).
    ``static_graph``: DDP will run with it, and its rebuilt buckets communicate the unused units last
    (:mod:`dpcomm.ddp.buckets`): they are planned there (:func:`static_order`). ``coarsen(trace) -> trace``:
    the units as they can be cut (a compiled graph's: :func:`dpcomm.ddp.compiled.graph_atoms`).
    ``retime(trace) -> trace``: the profiled units' times as the model runs them (a compiled model's:
    :func:`compiled_times`), applied before ``coarsen``; the plan is made on them. ``analysis``: the units
    every rank agreed on (:func:`dpcomm.trace.units.agree`; with ``example``, made here if not given)."""
    from dpcomm.collectives import get
    from dpcomm.costmodel.collective import ALGORITHMS
    from dpcomm.planner import autoplan
    from dpcomm.planner.schedule import PlannerSchedule
    from dpcomm.runtime.broadcast import check_same_plan

    world = dist.get_world_size(process_group)
    parsed = PlannerSchedule.parse(schedule)  # an unknown name is a one-line error before any work
    name = parsed.name
    if example is None:
        if name in TIMED:
            raise UserError(f"planner '{schedule}' needs the layers' times: pass example=<one input batch>")
        trace = sizes_trace(model, None, type(model).__name__)
    else:  # every rank profiles; the agreed units' times are averaged over ranks
        from dpcomm.trace.profiler import profile
        from dpcomm.trace.units import agree

        if analysis is None:
            analysis = agree(model, example, loss_fn, process_group, "dpcomm.ddp.wrap")
        device = first_param(model, "dpcomm.ddp.wrap").device
        local = on_every_rank(
            lambda: profile(model, example, iters=profile_iters, warmup=1, device=device, loss_fn=loss_fn,
                            units=analysis.units),
            process_group, "dpcomm.ddp.wrap: profiling the model on the example",
        )  # fmt: skip
        trace = agreed_trace(model, local, analysis.units, process_group, "dpcomm.ddp.wrap")
        if retime is not None:
            trace = retime(trace)
    if static_graph:
        trace = static_order(trace)
    if coarsen is not None:
        trace = coarsen(trace)
    if network is not None:
        cost: CommCost = autoplan.network_cost(
            network, world, collective if collective in ALGORITHMS else "ring"
        )
    else:
        algo = get(collective)
        device = next(model.parameters()).device
        scratch = torch.zeros(max(1, trace.total_params), device=device)
        points = autoplan.measure_allreduce(
            lambda t: algo.allreduce(t, group=process_group), scratch, process_group
        )
        cost = autoplan.fit_linear(points)
    plan = autoplan.plan_on_root(parsed, trace, cost, world, process_group, root=0)
    check_same_plan(plan, process_group)
    return plan, trace, cost


def merge_layers(trace: Trace, sizes: list[int]) -> Trace:
    """``trace`` with runs of ``sizes`` consecutive units merged into one (times and parameters summed; the
    first unit's name, ``+k`` for the k others)."""
    rows, at = [], 0
    for n in sizes:
        run = trace.layers[at : at + n]
        at += n
        rows.append(replace(
            run[0], name=run[0].name + (f"+{n - 1}" if n > 1 else ""), params=sum(x.params for x in run),
            forward_s=sum(x.forward_s for x in run), backward_s=sum(x.backward_s for x in run),
            param_names=tuple(q for x in run for q in x.param_names), unused=all(x.unused for x in run),
        ))  # fmt: skip
    return replace(trace, layers=tuple(rows))


def static_order(trace: Trace) -> Trace:
    """``trace`` with its unused units moved to the front of forward order, i.e. communicated last: where
    DDP's buckets rebuilt under ``static_graph=True`` put them (their gradients, zeros, are reduced with the
    last bucket), so that every cut of a plan over these units is one DDP makes."""
    unused = [x for x in trace.layers if x.unused]  # registration order, DDP's order for them
    if not unused:
        return trace
    return replace(trace, layers=tuple(unused[::-1]) + tuple(x for x in trace.layers if not x.unused))


def compiled_units(model: nn.Module, example: Any, trace: Trace, group: Any) -> Trace:
    """The trace's units merged where the compiled graph cannot be cut (:mod:`dpcomm.ddp.compiled`)."""
    from dpcomm.ddp.compiled import capture_graph, graph_atoms

    def atoms() -> list[int]:
        gm = capture_graph(model, example)
        return graph_atoms(gm, [x.param_names for x in trace.layers], model)

    sizes = on_every_rank(atoms, group, "dpcomm.ddp.wrap: tracing the compiled model")
    box = [sizes]  # rank 0's cuts on every rank: one layout whatever each rank's example
    dist.broadcast_object_list(
        box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group
    )
    return merge_layers(trace, box[0])


def compiled_times(
    model: nn.Module,
    compiled: nn.Module,
    example: Any,
    trace: Trace,
    *,
    loss_fn: Any = None,
    iters: int = 3,
    group: Any = None,
) -> Trace:
    """``trace`` (the eager profile of ``model``'s units) with its forward and backward times scaled to the
    compiled model's: every rank times one training pass of a compiled copy (:func:`dpcomm.ddp.compiled.
    time_compiled`: the same backend, no DDP, no communication), the medians are averaged over ranks, and
    each unit's forward (backward) time is multiplied by compiled / eager forward (backward) sum. A
    compiled graph has no layers to time inside it, so the eager profile says how its time splits over
    the units; what the plan's cuts need, the time until each group's gradients are ready, is then the
    compiled run's share up to that group. ``extra`` keeps both sums and the backend."""
    from dpcomm.ddp.compiled import backend_name, backend_of, time_compiled
    from dpcomm.planner.autoplan import rank_mean

    f, b = on_every_rank(
        lambda: time_compiled(model, compiled, example, loss_fn=loss_fn, iters=iters),
        group, "dpcomm.ddp.wrap: timing the compiled model",
    )  # fmt: skip
    f, b = rank_mean([f, b], group)
    eager_f = sum(x.forward_s for x in trace.layers)
    eager_b = sum(x.backward_s for x in trace.layers)
    sf = f / eager_f if eager_f > 0 else 1.0
    sb = b / eager_b if eager_b > 0 else 1.0
    layers = tuple(replace(x, forward_s=x.forward_s * sf, backward_s=x.backward_s * sb) for x in trace.layers)
    backend = backend_name(backend_of(compiled))
    extra = {**trace.extra, "measured_by": "dpcomm.ddp.compiled", "backend": backend, "compiled_forward_s": f,
             "compiled_backward_s": b, "eager_forward_s": eager_f, "eager_backward_s": eager_b}  # fmt: skip
    return replace(trace, layers=layers, extra=extra)


def check_unused(trace: Trace, walk: dict[str, bool], uneven: tuple[str, ...] = ()) -> None:
    """DDP without ``find_unused_parameters`` or ``static_graph`` fails in its second iteration on a model
    whose parameters get no gradient (on rank 0's example, or ``uneven``: on some rank's); say so now, naming
    them."""
    from dpcomm.trace.names import pattern

    unused = [n for x in trace.layers for n in x.param_names if x.unused or n in uneven]
    if unused and not any(walk.values()):
        every = [n for x in trace.layers for n in x.param_names]
        raise UserError(
            f"dpcomm.ddp.wrap: parameters {pattern(unused, every)} get no gradient on the example; DDP needs "
            "find_unused_parameters=True (or static_graph=True if they are never used)"
        )
