"""The replica kind ``ddp`` with a planner: ``--schedule ddp:mgwfbp`` (``ddp:optimal``, ``ddp:wfbp``,
``ddp:single``, ``ddp:bucket:SIZE``) is stock PyTorch DDP whose buckets are the planner's plan
(:func:`dpcomm.ddp.wrap`); plain ``ddp`` stays DDP with its default buckets (:mod:`dpcomm.train.ddp_replica`).

The training layer adapts :mod:`dpcomm.ddp` to its loop here: ``dpcomm.train`` -> ``dpcomm.ddp``, one way only
(:func:`dpcomm.train.replica._builtin` imports this module). It registers kind ``ddp``, checking the schedule
and handing plain ``ddp`` to the baseline replica. With a planner, the first iteration's batch is the example
``wrap`` profiles the layers on (so the layers are timed on the data actually trained); planning, the timed
trial of candidate plans (``mgwfbp``/``optimal``) and that first iteration are one ``profile`` record, the
rest are steady. ``--collective`` other than ``native`` runs as a dpcomm comm hook on its own thread. When
resuming, the checkpoint's plan is rebuilt as it was (no new planning).

``--replan-every K`` (``ddp:PLANNER`` only): after every ``K`` steady iterations, before the next one, the
layers are profiled again on that iteration's batch and the all-reduce measured
(:func:`dpcomm.ddp.wrap.plan_on_workers`), rank 0 plans and decides as dpcomm's runtime does
(:mod:`dpcomm.train.replan`), and on a switch a new DDP module is built around the same parameters with the
new plan's bucket caps (the optimizer and its state stay). That iteration is a ``profile`` record.

``--compiled-autograd`` (``--compile inductor``, :mod:`dpcomm.train.ddp_replica`): the plan is made as
``wrap`` makes it under compiled autograd, on the eager profile, but with its times scaled to a compiled
copy's forward and backward (:func:`dpcomm.ddp.planning.compiled_times`, as for compiled DDP: one more
compile per rank, which inductor's FX graph cache keeps); ``wrap`` then builds DDP with the plan's groups
marked for ``fuse_by_plan``, and each backward runs under compiled autograd. ``ddp.dpcomm.compiled_buckets``
(the all-reduces of the compiled backward, read back from its graph) is reported as ``compiled_buckets``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner.schedule import PlannerSchedule
from dpcomm.runtime.records import Phase
from dpcomm.train.config import SCHEDULE_DDP, TrainConfig
from dpcomm.train.ddp_replica import DDPReplica, DDPTimedReplica, compiled
from dpcomm.train.ddp_replica import check as check_baseline
from dpcomm.train.replan import replan_due
from dpcomm.train.replica import ReplicaContext, ReplicaKind, register_kind

__all__ = ["DDPPlanReplica", "build", "check"]


def check(cfg: TrainConfig, schedule: str) -> PlannerSchedule | None:
    """``ddp`` (the baseline's rules) or ``ddp:PLANNER`` (a planner schedule; overlap mode only)."""
    name, sep, planner = schedule.strip().partition(":")
    if not sep and cfg.replan_every:
        raise UserError("--replan-every needs a plan to re-make: use ddp:PLANNER (e.g. ddp:mgwfbp), not ddp")
    if not sep:
        return check_baseline(cfg, schedule)
    if cfg.mode != "overlap":
        raise UserError(
            f"--schedule {schedule} runs PyTorch's DDP; --mode {cfg.mode} needs a dpcomm schedule"
        )
    if not planner.strip():
        raise UserError("schedule 'ddp:' needs a planner, e.g. ddp:mgwfbp or ddp:optimal")
    return PlannerSchedule.parse(planner)


def build(ctx: ReplicaContext) -> Any:
    return DDPReplica(ctx) if ctx.parsed is None else DDPPlanReplica(ctx)


class DDPPlanReplica(DDPTimedReplica):
    """DDP with a dpcomm plan on this rank (see :mod:`dpcomm.train.replica`)."""

    def __init__(self, ctx: ReplicaContext):
        super().__init__(ctx)
        self._parsed: PlannerSchedule = ctx.parsed
        saved = (ctx.state or {}).get("plan")
        self._resume_plan = Plan.from_dict(saved) if saved is not None else None
        self._steady = 0  # steady iterations since the plan in use was adopted
        self.overlap_per_byte_s: float | None = None  # --probe-overlap's measure
        stamp = self._stamp
        for p in self.model.parameters():  # the last gradient accumulated marks the end of backward compute
            if p.requires_grad and self._backward is None:  # compiled autograd would trace the hook
                p.register_post_accumulate_grad_hook(stamp)

    def _stamp(self, _p: Any) -> None:
        self.ready_s = time.perf_counter()

    def _build(self, x: Any) -> None:
        from dpcomm.ddp import wrap

        cfg = self.cfg
        t0 = time.perf_counter()
        if self._backward is not None and self._resume_plan is None:
            self.wrapper = self._wrap_compiled_autograd(x)
        else:
            self.wrapper = wrap(
                compiled(self.model, cfg), self._resume_plan or self._parsed.text, example=x,
                collective=cfg.collective, profile_iters=cfg.profile_iters, verify_iters=cfg.verify_iters,
            )  # fmt: skip
        w = self.wrapper.dpcomm
        sizes = "+".join(str(len(g)) for g in w.plan.groups)
        trial = ""
        if w.trial:
            trial = "; timed " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in w.trial.items())
        self.log.append(
            f"[rank {self.rank}] DDP with plan '{w.plan.schedule}' ({len(w.plan.groups)} buckets, layers "
            f"{sizes}) from ddp:{self._parsed.text}, decided in {time.perf_counter() - t0:.1f} s{trial}"
        )
        if w.caps.note:
            self.log.append(f"[rank {self.rank}] {w.caps.note}")
        if cfg.probe_overlap and w.cost is not None:
            self._probe_overlap(x)

    def _probe_overlap(self, x: Any) -> None:
        """``--probe-overlap``: backward's slowdown per byte all-reduced beside it, for the prediction."""
        from dpcomm.ddp.overlap_probe import probe_slowdown
        from dpcomm.train.setup import grad_bytes

        t0 = time.perf_counter()
        slow = probe_slowdown(self.model, x, self.wrapper.dpcomm.cost, grad_bytes(self.model))
        self.overlap_per_byte_s = None if slow is None else slow.per_byte_s
        said = "no room beside backward" if slow is None else f"{slow.per_byte_s * 1e9:.2f} ns/byte"
        self.log.append(
            f"[rank {self.rank}] backward beside all-reduces: {said} ({time.perf_counter() - t0:.1f} s)"
        )

    def _wrap_compiled_autograd(self, x: Any) -> Any:
        """``wrap`` under compiled autograd, its plan made on the eager profile scaled to a compiled copy's
        times (``wrap`` itself plans on the eager profile in this mode); the trace and cost kept on
        ``ddp.dpcomm``, as ``wrap`` keeps them, for ``predicted_t_iter_s``."""
        from dpcomm.ddp import wrap
        from dpcomm.ddp.planning import compiled_times, plan_on_workers
        from dpcomm.utils.user_run import untouched

        cfg, model = self.cfg, self.model
        net = compiled(model, cfg)
        with untouched(model):
            plan, trace, cost = plan_on_workers(
                model, self._parsed.text, example=x, collective=cfg.collective,
                profile_iters=cfg.profile_iters,
                retime=lambda t: compiled_times(model, net, x, t, iters=cfg.profile_iters),
            )  # fmt: skip
        ddp = wrap(net, plan, example=x, collective=cfg.collective, verify_iters=0)
        ddp.dpcomm.trace, ddp.dpcomm.cost = trace, cost
        ms = {k: v * 1e3 for k, v in trace.extra.items() if k.endswith("_s") and isinstance(v, float)}
        self.log.append(
            f"[rank {self.rank}] planned on the eager profile scaled to the {trace.extra.get('backend')}-"
            f"compiled copy's forward {ms.get('compiled_forward_s', 0):.1f} ms and backward "
            f"{ms.get('compiled_backward_s', 0):.1f} ms (eager {ms.get('eager_forward_s', 0):.1f} and "
            f"{ms.get('eager_backward_s', 0):.1f} ms); its groups: the compiled backward's all-reduces"
        )
        return ddp

    def _replan(self, x: Any) -> None:
        """Profile and measure again, plan on rank 0; on a predicted gain, a new DDP with the new caps."""
        import torch.distributed as dist

        from dpcomm.ddp import wrap
        from dpcomm.ddp.planning import plan_on_workers
        from dpcomm.runtime.broadcast import check_same_plan, groups_text
        from dpcomm.train import replan

        cfg, at = self.cfg, len(self.records)
        t0 = time.perf_counter()
        new, trace, cost = plan_on_workers(
            self.model,
            self._parsed.text,
            example=x,
            collective=cfg.collective,
            profile_iters=cfg.profile_iters,
        )
        current = self.wrapper.dpcomm.plan
        box: list[Any] = [replan.decide(trace, current, new, cost, self.world) if self.rank == 0 else None]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0)
        d = box[0]
        if d.switch:
            old = self.wrapper
            self.wrapper = wrap(self.model, new, example=x, collective=cfg.collective, verify_iters=0)
            self.wrapper.dpcomm.trace, self.wrapper.dpcomm.cost = trace, cost
            if old.dpcomm.hook_state is not None:
                old.dpcomm.hook_state.close()
            del old
        check_same_plan(self.wrapper.dpcomm.plan, None)
        took = f" (re-plan took {time.perf_counter() - t0:.1f} s)"
        self.log.append(f"[rank {self.rank}] " + replan.message(at, d, current, new, groups_text) + took)

    def iteration(self, x: Any, y: Any) -> float:
        first = self.wrapper is None
        again = not first and replan_due(self._steady, self.cfg.replan_every)
        if first or again:  # planning runs forward passes (dropout draws): this iteration's stay the loop's
            rng = torch.get_rng_state()
            self._build(x) if first else self._replan(x)
            torch.set_rng_state(rng)
            self._steady = 0
        phase = Phase.PROFILE if first or again else Phase.STEADY
        self._steady += phase is Phase.STEADY
        loss = self._step(x, y, phase, self.wrapper.dpcomm.plan.schedule)
        if first and self._backward is not None:
            fused = self.wrapper.dpcomm.compiled_buckets
            groups = len(self.wrapper.dpcomm.caps.param_groups)
            none = "" if fused else " (none read back from the graph)"
            self.log.append(
                f"[rank {self.rank}] compiled backward: {len(fused[-1]) if fused else 0} fused all-reduces "
                f"for {groups} plan groups{none}"
            )
        return loss

    @property
    def plan(self) -> Plan | None:
        return self.wrapper.dpcomm.plan if self.wrapper is not None else self._resume_plan

    @property
    def settled(self) -> bool:
        """The plan is kept once DDP is built (the trial runs inside the first iteration)."""
        return self.wrapper is not None

    def result_fields(self) -> dict[str, Any]:
        w = self.wrapper.dpcomm if self.wrapper is not None else None
        cost = None
        if w is not None and w.cost is not None:
            cost = {"a": getattr(w.cost, "a", None), "b": getattr(w.cost, "b", None), "points": []}
            if self.overlap_per_byte_s is not None:
                cost["overlap_per_byte_s"] = self.overlap_per_byte_s
        return {
            "collective": self.cfg.collective,
            "trace": w.trace.to_dict() if w is not None and w.trace is not None else None,
            "cost": cost,
            "grad_buffer_bytes": sum(int(c * (1 << 20)) for c in w.caps.bucket_cap_mb_list) if w else None,
            **self._compiled_fields(w),
        }

    def _compiled_fields(self, w: Any) -> dict[str, Any]:
        """``--compiled-autograd``: the all-reduces of the last backward graph compiled (their parameters)."""
        if self._backward is None or w is None:
            return {}
        last = [list(b) for b in w.compiled_buckets[-1]] if w.compiled_buckets else []
        return {"compiled_buckets": last, "compiled_allreduces": len(last)}

    def close(self) -> None:
        if self.wrapper is not None and self.wrapper.dpcomm.hook_state is not None:
            self.wrapper.dpcomm.hook_state.close()
        self._restore_mode()


register_kind(
    ReplicaKind(
        name=SCHEDULE_DDP, build=build, check=check, summary="PyTorch DDP (ddp:PLANNER: a dpcomm plan)"
    )
)
