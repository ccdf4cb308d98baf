"""Planning a planner name on the workers while they train, and ``dpcomm.DataParallel``, which takes one.

:class:`OnlinePlanner` is the runtime's plan driver (:mod:`dpcomm.runtime.driver`) for a planner name; its
phases (:class:`~dpcomm.runtime.records.Phase`) in order:

1. ``PROFILE``: the first ``profile_iters`` iterations run one all-reduce after backward (a safe ``single``
   plan) while the runtime times every layer (MG-WFBP Alg. 1 lines 1-7);
2. then, on every rank at the same step: per-layer medians averaged over ranks, the collective's cost
   measured and fitted (or priced on a modelled ``network``), the trace built, the plan made on the root,
   broadcast and checked by hash (:mod:`dpcomm.planner.autoplan`);
3. ``TRIAL`` (``mgwfbp``/``optimal`` in ``overlap`` mode on P > 1, with ``verify_iters`` > 0): the planned
   plan, ``single`` and DDP's default buckets run round-robin for ``verify_iters`` iterations each and the
   fastest, as the slowest rank saw it, is kept. The planners' cost model assumes communication overlaps
   computation for free; where it does not (CPU workers that also do the reductions), this measures instead;
4. ``STEADY``: the kept plan. With ``replan_every=K`` > 0, after every ``K`` steady iterations the
   planner goes back to 1. (``PROFILE`` with ``single``), measures and plans again, and switches only when
   the model predicts a gain above :data:`~dpcomm.train.replan.REPLAN_GAIN` (:mod:`dpcomm.train.replan`);
   otherwise the running plan comes back. No timed trial after a re-plan: the model decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner import autoplan
from dpcomm.planner.schedule import PlannerSchedule
from dpcomm.runtime import data_parallel as _runtime_dp
from dpcomm.runtime.broadcast import check_same_plan, groups_text
from dpcomm.runtime.driver import PlanHost
from dpcomm.runtime.records import IterRecord, Phase
from dpcomm.train import replan

__all__ = ["DataParallel", "OnlinePlanner"]


class OnlinePlanner:
    """Profile, plan on the root, optionally time the candidates; hands its host (a
    :class:`~dpcomm.runtime.driver.PlanHost`, e.g. the runtime's DataParallel) each plan in turn."""

    def __init__(
        self,
        schedule: PlannerSchedule,
        *,
        profile_iters: int = 3,
        verify_iters: int = 3,
        network: Any = None,
        replan_every: int = 0,
    ):
        if profile_iters < 1:
            raise UserError("broadcast_every and profile_iters must be >= 1")
        if verify_iters < 0:
            raise UserError(f"verify_iters must be >= 0, got {verify_iters}")
        if replan_every < 0:
            raise UserError(f"replan_every must be >= 0 (0: off), got {replan_every}")
        self.replan_every = replan_every
        self.replans: list[dict[str, Any]] = []
        """One dict per re-plan: ``iteration`` (the first on the plan kept), ``switched``, ``current_s``,
        ``new_s`` (predicted t_iter, seconds), ``plan`` (the plan kept, :meth:`Plan.to_dict`)."""
        self._kept: Plan | None = None  # the steady plan running
        self._steady = 0  # steady iterations since it was adopted
        self._replanning = False
        self.parsed = schedule
        self.schedule = schedule.text
        self.profile_iters = profile_iters
        self.verify_iters = verify_iters
        self.network = network
        self.trace = None
        """The measured :class:`~dpcomm.trace.format.Trace` the plan was made from."""
        self.cost = None
        """The all-reduce cost the plan was made with (fitted :class:`LinearCost` or the network model)."""
        self.cost_points: list[tuple[int, float]] = []
        self.half_points: dict[str, list[tuple[int, float]]] = {}
        """``dear``: measured ``(bytes, seconds)`` of the collective's reduce-scatter (``rs``) and
        all-gather (``ag``), behind the :class:`~dpcomm.planner.dear.SplitCost` planned with."""
        """Measured ``(bytes, seconds)`` all-reduce times behind :attr:`cost`."""
        self._samples: list[tuple[list[float], list[float]]] = []
        self._trial: autoplan.Trial | None = None

    def begin(self, dp: PlanHost) -> tuple[Plan, Phase]:
        L = len(dp.layer_names)
        dp.emit(f"profiling {self.profile_iters} iteration(s) before planning '{self.schedule}'")
        return Plan.from_sizes("single", [L], L), Phase.PROFILE

    def layer_times(self, f: list[float], b: list[float]) -> None:
        self._samples.append((f, b))

    def after_step(self, dp: PlanHost, record: IterRecord) -> tuple[Plan, Phase] | None:
        nxt = self._next(dp, record)
        if nxt is not None and nxt[1] is Phase.STEADY:
            self._kept, self._steady = nxt[0], 0
        return nxt

    def _next(self, dp: PlanHost, record: IterRecord) -> tuple[Plan, Phase] | None:
        if self._trial is not None:
            return self._trial_step(dp, record)
        if record.phase is Phase.STEADY:
            self._steady += 1
            if not replan.replan_due(self._steady, self.replan_every):
                return None
            self._samples, self._replanning = [], True
            L = len(dp.layer_names)
            dp.emit(
                f"re-planning after {self._steady} steady iteration(s): profiling {self.profile_iters} "
                f"iteration(s) from iteration {record.iteration + 1}"
            )
            return Plan.from_sizes("single", [L], L), Phase.PROFILE
        if len(self._samples) >= self.profile_iters:
            return self._replan(dp, record) if self._replanning else self._decide(dp)
        return None

    def _replan(self, dp: PlanHost, record: IterRecord) -> tuple[Plan, Phase]:
        """Measure and plan again; the root decides whether the new plan is worth a switch (every rank gets
        its decision with the plan, then the kept plan's hash is checked)."""
        self._replanning = False
        current = self._kept
        new = self._measure_and_plan(dp)
        box: list[Any] = [None]
        if dp.rank == dp.root:
            box[0] = replan.decide(self.trace, current, new, self.cost, dp.world_size)
        if dp.world_size > 1:
            src = dist.get_global_rank(dp.process_group, dp.root) if dp.process_group else dp.root
            dist.broadcast_object_list(box, src=src, group=dp.process_group)
        d: replan.Decision = box[0]
        keep = new if d.switch else current
        check_same_plan(keep, dp.process_group)
        at = record.iteration + 1
        self.replans.append({"iteration": at, "switched": d.switch, "current_s": d.current_s,
                             "new_s": d.new_s, "plan": keep.to_dict()})  # fmt: skip
        dp.emit(replan.message(at, d, current, new, groups_text))
        return keep, Phase.STEADY

    def _measure_and_plan(self, dp: PlanHost) -> Plan:
        """Per-layer medians over ranks, the all-reduce cost, the trace; the root's plan, hash-checked."""
        pg, world = dp.process_group, dp.world_size
        f, b = autoplan.median_layer_times(self._samples, pg)
        scratch = dp.scratch()  # the old buffer: freed before the new plan's buffers exist
        dtype_bytes = scratch.element_size()
        if self.network is not None:
            self.cost = autoplan.network_cost(self.network, world, dp.collective_name)
        else:
            self.cost_points = autoplan.measure_allreduce(dp.allreduce, scratch, pg)
            self.cost = autoplan.fit_linear(self.cost_points)
            if self.parsed.name == "dear":  # its halves as this collective runs them
                self.cost, self.half_points = autoplan.measure_halves(dp.allreduce, scratch, pg, self.cost)
        del scratch
        self.trace = autoplan.build_trace(
            type(dp.module).__name__, dp.layer_names, dp.layer_numels, f, b, dp.batch_size, dtype_bytes
        )
        plan = autoplan.plan_on_root(self.parsed, self.trace, self.cost, world, pg, dp.root)
        if DataParallel._tamper_plan is not None:
            plan = DataParallel._tamper_plan(plan, dp.rank)
        check_same_plan(plan, pg)
        points = [(m, round(t * 1e6, 1)) for m, t in self.cost_points]
        dp.emit(
            f"measured t_f={sum(f) * 1e3:.3f} ms t_b={sum(b) * 1e3:.3f} ms over {len(self._samples)} "
            f"iteration(s); all-reduce cost {self.cost}; points (B, us) {points}"
        )
        sha = plan.sha256()[:12]
        dp.emit(f"plan {plan.schedule}: {len(plan.groups)} group(s) {groups_text(plan)} sha256 {sha}")
        return plan

    def _decide(self, dp: PlanHost) -> tuple[Plan, Phase]:
        """Root plans from the measured trace and cost; every rank adopts it after the hash check."""
        world = dp.world_size
        plan = self._measure_and_plan(dp)
        candidates = autoplan.candidates(plan, self.trace, self.cost, world)
        if (
            self.verify_iters
            and world > 1
            and dp.mode == "overlap"
            and self.parsed.name in autoplan.MEASURED
            and len(candidates) > 1
        ):
            self._trial = autoplan.Trial(candidates, self.verify_iters)
            dp.emit(
                f"timing {len(candidates)} plans for {self.verify_iters} iteration(s) each: "
                + ", ".join(f"{c.schedule} {groups_text(c)}" for c in candidates)
            )
            return self._trial.current, Phase.TRIAL
        return plan, Phase.STEADY

    def _trial_step(self, dp: PlanHost, record: IterRecord) -> tuple[Plan, Phase]:
        """After a timed candidate's iteration: the next candidate, or (all timed) keep the fastest."""
        trial = self._trial
        trial.record(record.total_s)
        if not trial.complete:
            return trial.current, Phase.TRIAL
        best, medians = trial.choose(dp.process_group)
        self._trial = None
        dp.emit(
            "measured iteration (median, slowest rank): "
            + ", ".join(f"{c.schedule} {m * 1e3:.1f} ms" for c, m in zip(trial.plans, medians, strict=True))
            + f" -> keeping {best.schedule}"
        )
        check_same_plan(best, dp.process_group)
        return best, Phase.STEADY


class DataParallel(_runtime_dp.DataParallel):
    """:class:`dpcomm.runtime.data_parallel.DataParallel` that also takes a planner name, planned on the
    workers by an :class:`OnlinePlanner` (``dpcomm.DataParallel``)::

        dp = dpcomm.DataParallel(model, plan="mgwfbp", collective="ring")

    Args (beyond the runtime's):
        plan: a :class:`Plan`, a planner name (``wfbp``, ``single``, ``bucket:25MB``, ``mgwfbp``,
            ``optimal``) or a parsed :class:`PlannerSchedule`, decided after profiling.
        network: a :class:`~dpcomm.costmodel.network.Network` or preset name; for planner names, price the
            all-reduce with its model instead of timing the collective.
        profile_iters: iterations measured before a planner-name plan is decided (>= 1).
        verify_iters: for ``mgwfbp``/``optimal``, time the planned plan, ``single`` and DDP's default buckets
            for this many iterations each (round-robin, after profiling), keep the fastest (0: no timing).
        replan_every: for planner names, re-plan every this many steady iterations (0: never;
            :mod:`dpcomm.train.replan`).
    """

    _tamper_plan: ClassVar[Callable[[Plan, int], Plan] | None] = None
    """Test hook: applied to the received planner-name plan on every rank (forces a mismatch in tests)."""

    def __init__(
        self,
        module: nn.Module,
        plan: str | Plan | PlannerSchedule = "mgwfbp",
        collective: str | Any = "native",
        process_group: Any = None,
        *,
        network: Any = None,
        profile_iters: int = 3,
        verify_iters: int = 3,
        replan_every: int = 0,
        **kwargs: Any,
    ):
        if not isinstance(plan, Plan | str | PlannerSchedule) or (isinstance(plan, str) and not plan):
            raise UserError(f"plan must be a Plan or a planner name, got {plan!r}")
        planner = None
        if not isinstance(plan, Plan):
            parsed = PlannerSchedule.parse(plan) if isinstance(plan, str) else plan  # before communicating
            planner = OnlinePlanner(
                parsed,
                profile_iters=profile_iters,
                verify_iters=verify_iters,
                network=network,
                replan_every=replan_every,
            )
        super().__init__(module, planner or plan, collective, process_group, **kwargs)
        self.planner: OnlinePlanner | None = planner
        """The planner of a planner-name plan (None for a given Plan)."""

    @property
    def trace(self) -> Any:
        """The measured :class:`~dpcomm.trace.format.Trace` a planner-name plan was made from."""
        return self.planner.trace if self.planner is not None else None

    @property
    def cost(self) -> Any:
        """The all-reduce cost the plan was made with (fitted :class:`LinearCost` or the network model)."""
        return self.planner.cost if self.planner is not None else None

    @property
    def cost_points(self) -> list[tuple[int, float]]:
        """Measured ``(bytes, seconds)`` all-reduce times behind :attr:`cost`."""
        return self.planner.cost_points if self.planner is not None else []
