"""``dpcomm.ddp.wrap``: stock ``DistributedDataParallel`` running a dpcomm plan (and optionally a dpcomm
collective), for a user's own torchrun script::

    model = dpcomm.ddp.wrap(model, "mgwfbp", example=x)     # after dist.init_process_group(...)

With a :class:`~dpcomm.plan.Plan` the buckets are set from it (:func:`dpcomm.ddp.bucket_caps`). With a
planner name the plan is decided on the workers themselves, as ``dpcomm.DataParallel`` does it (MG-WFBP
Alg. 1 lines 1-7, "benchmarks in the first several iterations"), but before DDP exists, on one input batch:

1. every rank times each learnable layer's forward and backward (:func:`dpcomm.trace.profiler.profile`,
   on the bare module: no communication) and the per-layer medians are averaged over ranks;
2. the all-reduce is priced: measured at a few sizes and fitted to ``T(M) = a + b*M`` (MG-WFBP Eq. 9), or
   taken from a modelled ``network``;
3. rank 0 plans and broadcasts the plan; every rank checks its hash;
4. for ``mgwfbp`` and ``optimal``, the model is not trusted where it may be wrong (on CPU workers that also
   do the reductions, each message also takes CPU time from backward): DDP is built with the planned plan,
   ``single`` and DDP's default buckets in turn, one at a time (each torn down before the next is built),
   and each is timed on the example batch (``verify_iters`` forward/backward passes after two untimed
   ones, no optimizer step; buffers restored) and the fastest,
   as the slowest rank saw it, is kept, as ``dpcomm.DataParallel`` does
   (:class:`dpcomm.planner.autoplan.Trial`); of those within 2% of the fastest, DDP's default buckets if
   they are one (what the user had is kept unless a plan is measurably faster), else the fewest buckets.

Plans index the model's gradient units (:mod:`dpcomm.trace.units`; for a CNN, its learnable layers): the
profile of step 1 is a ``dpcomm-trace/2`` of units (without ``example``, a planner that needs sizes only
gets the learnable layers in registration order). Tied, frozen and unused parameters are handled there (a
tied one at its last ready point, frozen ones left out, unused ones as units of their own);
``find_unused_parameters`` and ``static_graph`` among the DDP keyword arguments tell
:func:`dpcomm.ddp.bucket_caps` which order DDP cuts its buckets in.

Buckets equal the plan from the second iteration on (DDP rebuilds them in gradient-ready order after the
first; with ``find_unused_parameters=True`` they are the construction-time buckets from the start; see
:mod:`dpcomm.ddp.buckets`); a DDP kept from the timed trial has rebuilt them already.
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dpcomm.costmodel.base import CommCost
from dpcomm.ddp.buckets import BucketCaps, bucket_caps, build_ddp
from dpcomm.ddp.hooks import HookState, collective_hook
from dpcomm.ddp.planning import (
    TIMED,
    check_unused,
    compiled_times,
    compiled_units,
    plan_on_workers,
)
from dpcomm.ddp.trial import timed_trial, walk_kwargs
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.trace.format import Trace
from dpcomm.trace.units import Analysis, agree
from dpcomm.utils.user_run import (
    check_same_layout,
    check_same_weights,
    first_param,
    nothing_left,
    on_every_rank,
    untouched,
)

_log = logging.getLogger("dpcomm.ddp")

__all__ = ["Wrapped", "plan_on_workers", "wrap"]


@dataclass(slots=True, kw_only=True)
class Wrapped:
    """What :func:`wrap` decided, kept on the DDP module as ``ddp.dpcomm``; ``str()`` of it says so."""

    plan: Plan
    """The plan DDP runs: the planned one (or its nearest expressible coarsening), or the trial's winner."""
    caps: BucketCaps
    """The caps DDP was built with, and how its plan relates to the requested one."""
    trace: Trace | None = None
    """The workers' layer times (planner names only)."""
    cost: CommCost | None = None
    """The all-reduce cost the planner used (planner names only)."""
    collective: str = "native"
    """Who all-reduces the buckets: DDP itself (``native``) or a dpcomm collective as a comm hook."""
    hook_state: HookState | None = None
    """The hook's state when the collective runs on its own thread."""
    trial: dict[str, float] | None = None
    """Median forward+backward seconds per candidate plan in the timed trial (slowest rank), if one ran."""
    planned: Plan | None = None
    """The planner's plan, kept when the trial chose another (``plan`` is then the winner)."""
    predicted: dict[str, float] | None = None
    """The cost model's iteration time (seconds) per candidate, as :func:`dpcomm.sim.simulate` prices it."""
    ddp_options: dict[str, Any] | None = None
    """The DDP keyword arguments the user passed."""
    compiled_splits: list[list[list[str]]] = field(default_factory=list)
    """Per graph dynamo compiled for this DDP, its subgraphs' parameters (:mod:`dpcomm.ddp.compiled`)."""
    compiled_notes: list[str] = field(default_factory=list)
    """What a compile mode runs instead of the plan, said once."""
    compiled_buckets: list[list[list[str]]] = field(default_factory=list)
    """Compiled autograd: per backward graph inductor compiled, its fused all-reduces' parameters
    (:mod:`dpcomm.ddp.compiled_autograd`)."""
    nodes: int = 1
    """The ranks the plan was made for."""
    device: str = "cpu"
    """Where the model trains (its parameters' device type): FSDP2's overlap and fixed cost per unit in the
    verdict (:meth:`verdict`)."""

    def verdict(self) -> str | None:
        """One line: which of DDP with the ``optimal`` plan, ``dear`` and FSDP2 is fastest in the model for
        this job (:func:`dpcomm.sim.verdict.for_allreduce` of the trace and cost planned with, computed at
        the first call); None where none were (a plan given) or the trace has no times."""
        if self._verdict is None:
            got = None
            if self.trace is not None and self.cost is not None:
                from dpcomm.sim.verdict import for_allreduce

                got = for_allreduce(self.trace, self.cost, self.nodes, device=self.device)
            self._verdict = "" if got is None else got.text()
        return self._verdict or None

    def headline(self) -> str:
        """The first line of ``str()``: the DDP options, the plan run, its buckets and why."""
        options = ", ".join(f"{k}={v}" for k, v in (self.ddp_options or {}).items())
        why = "as given" if self.planned is None or self.trace is None else "planned, not timed"
        if self.trial:
            fastest = min(self.trial.values())
            mine = self.trial.get(self.plan.schedule, fastest)
            why = "fastest in the timed trial"
            if self.plan.schedule == "ddp-buckets":
                why = "DDP's own buckets: no plan was measurably (> 2%) faster in the timed trial"
            elif mine > fastest:
                why = "within 2% of the fastest in the timed trial, with the fewest buckets"
        buckets = len(self.caps.param_groups)  # a bucket per dtype of each group (ddp/dtypes)
        return f"dpcomm.ddp.wrap: DDP({options}) runs plan '{self.plan.schedule}', {buckets} buckets ({why})"

    def __str__(self) -> str:
        from dpcomm.trace.names import pattern

        names = [n for ns in self.caps.param_groups for n in ns]
        names = self._names or sorted(names)
        lines = [self.headline()] + [f"  {v}" for v in [self.verdict()] if v]
        if self.trial:
            lines.append(
                "  candidates: trial median forward+backward (slowest rank) | model's iteration time"
            )
            for name, t in self.trial.items():
                model = (self.predicted or {}).get(name)
                mark = "  <- kept" if name == self.plan.schedule else ""
                priced = f"{model * 1e3:9.3f} ms" if model is not None else "        -"
                lines.append(f"    {name:<14}{t * 1e3:9.3f} ms | {priced}{mark}")
        if self.planned is not None and self.planned.groups != self.plan.groups:
            lines.append(f"  rejected: '{self.planned.schedule}', {len(self.planned.groups)} buckets")
        lines.append("  buckets in communication order:")
        for k, group in enumerate(self.caps.param_groups):
            lines.append(f"    {k}: {pattern(group, names)}")
        if self.caps.note:
            lines.append(f"  note: {self.caps.note}")
        return "\n".join(lines)

    _names: tuple[str, ...] = ()
    """The model's trainable parameter names (registration order), to name groups."""
    _verdict: str | None = None
    """:meth:`verdict`'s line once computed (``""``: none)."""


@nothing_left()
def wrap(
    model: nn.Module,
    plan: Plan | str,
    *,
    example: Any | None = None,
    loss_fn: Any = None,
    collective: str = "native",
    collective_options: dict[str, Any] | None = None,
    overlap: bool = True,
    network: Any = None,
    profile_iters: int = 3,
    verify_iters: int = 3,
    process_group: Any = None,
    **ddp_kwargs: Any,
) -> DistributedDataParallel:
    """``DistributedDataParallel(model, ...)`` whose buckets are ``plan``'s groups.

    ``plan``: a :class:`Plan` or a planner name (``wfbp``, ``single``, ``bucket:25MB``, ``mgwfbp``,
    ``optimal``; the last two need ``example``). ``example``: one input batch as forward takes it (a tensor,
    a tuple, a dict of keyword arguments or :class:`~dpcomm.utils.user_run.Inputs`), used to find the
    gradient units and their ready order (rank 0's, for every rank: :func:`dpcomm.trace.units.agree`) and
    to time them; the buckets are checked alike on every rank before DDP is built. ``collective``:
    ``native`` (DDP's own all-reduce) or a dpcomm collective registered as a comm hook
    (:func:`collective_hook`; on its own thread when ``overlap``). ``network``: price the all-reduce with a
    modelled network instead of measuring it. ``verify_iters``: timed passes per candidate in the trial
    (``mgwfbp``/``optimal`` with ``example``; 0: keep the planned plan untimed). Other keyword arguments go
    to DDP. What was decided is ``ddp.dpcomm`` (:class:`Wrapped`).

    A compiled model (``torch.compile(model)``) is planned on the module inside, on its units' eager times
    scaled to a compiled copy's forward and backward (:func:`dpcomm.ddp.planning.compiled_times`), and its
    graph split at the plan's cuts (:mod:`dpcomm.ddp.compiled`); under compiled autograd
    (``optimize_ddp="python_reducer"``) the plan's groups become inductor's fused all-reduces instead of
    DDP's buckets (:mod:`dpcomm.ddp.compiled_autograd`), planned on the eager profile. Neither is timed
    against the alternatives.

    The model, its gradients, buffers and training flags, and the random state are left as plain
    ``DistributedDataParallel(model, **ddp_kwargs)`` leaves them (:mod:`dpcomm.utils.user_run`); the DDP
    returned is built fresh, after whatever the trial ran.
    """
    if not dist.is_initialized():
        raise UserError("dpcomm.ddp.wrap needs torch.distributed initialised (dist.init_process_group(...))")
    clash = {"bucket_cap_mb", "bucket_cap_mb_list"} & set(ddp_kwargs)
    if clash:
        raise UserError(
            f"dpcomm.ddp.wrap sets the buckets from the plan; do not pass {', '.join(sorted(clash))}"
        )
    first_param(model, "dpcomm.ddp.wrap")
    compiled, model = model, getattr(model, "_orig_mod", model)  # torch.compile(model): plan on the module
    reducer = _python_reducer()  # compiled autograd: inductor fuses the all-reduces (ddp/compiled_autograd)
    if reducer and (collective != "native" or collective_options):
        raise UserError(
            "dpcomm.ddp.wrap: under compiled autograd (optimize_ddp='python_reducer') DDP calls a comm hook "
            f"per parameter, not per bucket: collective '{collective}' cannot run there; use 'native'"
        )
    if (compiled is not model or reducer) and verify_iters > 0:
        verify_iters = 0  # each candidate would compile again, and dynamo would keep its graphs for the next
        if dist.get_rank(process_group) == 0:
            _log.info("dpcomm.ddp.wrap: a compiled model: its plan is not timed against the alternatives")
    check_same_weights(model, process_group, "dpcomm.ddp.wrap")
    trace = cost = timed = predicted = None
    planned = plan if isinstance(plan, Plan) else None
    world = dist.get_world_size(process_group)
    walk = walk_kwargs(ddp_kwargs)
    with untouched(model):
        analysis = None  # one analysis of the model, rank 0's, for every step below (trace/units.agree)
        if example is not None:
            analysis = agree(model, example, loss_fn, process_group, "dpcomm.ddp.wrap")
            _say_uneven(analysis, process_group)
        if isinstance(plan, str):
            coarsen = retime = None
            if compiled is not model and example is not None and not reducer:  # cut where dynamo's graph can,
                coarsen = lambda t: compiled_units(model, example, t, process_group)  # noqa: E731
                retime = lambda t: compiled_times(  # noqa: E731  (and time the units as compiled)
                    model, compiled, example, t, loss_fn=loss_fn, iters=profile_iters, group=process_group
                )
            plan, trace, cost = plan_on_workers(
                model, plan, example=example, loss_fn=loss_fn, collective=collective, network=network,
                profile_iters=profile_iters, process_group=process_group, static_graph=walk["static_graph"],
                coarsen=coarsen, retime=retime, analysis=analysis,
            )  # fmt: skip
            planned = plan
            check_unused(trace, walk, analysis.uneven if analysis else ())
        caps = on_every_rank(
            lambda: bucket_caps(
                plan, model, trace=trace, cost=cost, nodes=world, warn=False, assign=True, analysis=analysis,
                **walk,
            ), process_group, "dpcomm.ddp.wrap: matching the plan to the model",
        )  # fmt: skip
        if (
            trace is not None
            and example is not None
            and verify_iters > 0
            and caps.requested.schedule.lower() in TIMED
            and collective == "native"
        ):
            caps, timed, predicted = timed_trial(
                model, caps, trace, cost, example, loss_fn, verify_iters, process_group, ddp_kwargs, analysis
            )
        layout = [*caps.param_groups, (caps.walk, *(f"{c:.9g}" for c in caps.bucket_cap_mb_list))]
        check_same_layout(model, layout, process_group, "dpcomm.ddp.wrap")
    buckets: list[list[list[str]]] = []
    notes: list[str] = []
    if "torch._dynamo" in sys.modules:  # the model may be compiled: dynamo must split at the plan's cuts
        from dpcomm.ddp.compiled import install

        install()
    if reducer:  # DDP refuses bucket_cap_mb_list here: its hooks carry the plan to inductor's fusion instead
        from dpcomm.ddp import compiled_autograd

        ddp = DistributedDataParallel(compiled, process_group=process_group, **ddp_kwargs)
        compiled_autograd.install()
        compiled_autograd.plan_hooks(ddp, caps.param_groups, buckets)
        notes += [n for n in [compiled_autograd.conflict()] if n]
    else:
        ddp = build_ddp(compiled, caps, process_group, **ddp_kwargs)  # fresh: nothing of the trial in it
    state = None
    if collective != "native" or collective_options:
        hook = collective_hook(collective, **(collective_options or {}))
        state = HookState(process_group=process_group) if overlap else None
        ddp.register_comm_hook(state if overlap else process_group, hook)
    ddp.dpcomm = Wrapped(
        plan=caps.plan,
        caps=caps,
        trace=trace,
        cost=cost,
        collective=collective,
        hook_state=state,
        trial=timed,
        planned=planned,
        predicted=predicted,
        ddp_options=dict(ddp_kwargs),
        _names=tuple(n for n, p in model.named_parameters() if p.requires_grad),
        nodes=world,
        device=next(model.parameters()).device.type,
        compiled_buckets=buckets,
        compiled_notes=notes,
    )
    if dist.get_rank(process_group) == 0:
        if caps.note:
            warnings.warn(f"dpcomm: {caps.note}", stacklevel=2)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        _log.info(ddp.dpcomm.headline())  # the verdict (planning dear and FSDP2) only when asked
    return ddp


def _say_uneven(analysis: Analysis, group: Any) -> None:
    """One line on rank 0 where the ranks' examples use different parameters (the layout is rank 0's)."""
    if analysis.uneven and dist.get_rank(group) == 0:
        from dpcomm.trace.names import pattern

        every = [n for u in analysis.units for n in u.param_names]
        _log.info(
            "dpcomm: the ranks' examples give gradients to different parameters (%s); every rank runs "
            "rank 0's layout", pattern(list(analysis.uneven), every),
        )  # fmt: skip


def _python_reducer() -> bool:
    """DDP will run its python reducer (``optimize_ddp = "python_reducer"``), for compiled autograd."""
    if "torch._dynamo" not in sys.modules:  # never imported: the mode cannot have been set
        return False
    from dpcomm.ddp.compiled import python_reducer_active

    return python_reducer_active()
