"""The default replica kind: dpcomm's runtime (:class:`~dpcomm.train.online.DataParallel`) running a planner's
plan, planned on the workers (MG-WFBP Alg. 1-2) or, when resuming, the checkpoint's plan."""

from __future__ import annotations

import time
from typing import Any

from dpcomm.models.loss import classification_loss
from dpcomm.plan import Plan
from dpcomm.planner.schedule import PlannerSchedule
from dpcomm.runtime.records import Phase, Span
from dpcomm.train.config import TrainConfig
from dpcomm.train.online import DataParallel
from dpcomm.train.replica import DEFAULT_KIND, ReplicaContext, ReplicaKind, register_kind
from dpcomm.train.setup import build_model, params_sha256

__all__ = ["RuntimeReplica", "check"]


def check(cfg: TrainConfig, schedule: str) -> PlannerSchedule:
    """A planner name, parsed (an unknown one is a UserError)."""
    return PlannerSchedule.parse(schedule)


class RuntimeReplica:
    """One planner schedule's replica on this rank (see :mod:`dpcomm.train.replica`)."""

    def __init__(self, ctx: ReplicaContext):
        cfg = ctx.cfg
        s = build_model(ctx)
        self.cfg, self.schedule, self.rank = cfg, ctx.schedule, ctx.rank
        self.model, self.optimizer, self._update, self.start = s.model, s.optimizer, s.update, s.start
        self.log: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.loss = float("nan")
        plan: Plan | PlannerSchedule = ctx.parsed
        profile_iters = cfg.profile_iters
        if ctx.state is not None:
            if ctx.state.get("plan") is not None:
                plan = Plan.from_dict(ctx.state["plan"])
            else:  # saved while profiling: profile only what is left, so the plan lands at the same iteration
                profile_iters = max(1, cfg.profile_iters - self.start)
        self.dp = DataParallel(
            self.model,
            plan=plan,
            collective=cfg.collective,
            mode=cfg.mode,
            profile_iters=profile_iters,
            verify_iters=cfg.verify_iters,
            replan_every=cfg.replan_every,
            log=self.log.append,
        )

    def iteration(self, x: Any, y: Any) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        self._update.reset()  # stays 0 where this rank does not step (lp-alg1/2 non-roots)
        loss = classification_loss(self.dp(x), y)
        loss.backward()
        self.dp.step(self.optimizer)
        # end_unix: wall clock at the end of the step, to line iterations up with outside events
        rec = self.dp.records[-1].to_dict()
        self.records.append({**rec, "update_s": self._update.last_s, "end_unix": time.time()})
        self.loss = float(loss.detach())
        return self.loss

    @property
    def plan(self) -> Plan | None:
        return self.dp.plan

    @property
    def settled(self) -> bool:
        return self.dp.phase is Phase.STEADY

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def spans(self) -> list[list[Span]]:
        return self.dp.spans

    def before_checkpoint(self) -> None:
        """Every rank, before rank 0 saves: a ``dear`` plan's sharded optimizer state into the optimizer."""
        self.dp.consolidate_optimizer()

    def finish(self) -> None:
        """``lp-alg1`` non-roots get the last update only in the next forward: fetch it now; a ``dear``
        plan's last parameters are all-gathered."""
        self.dp.flush()
        if self.cfg.mode == "lp-alg1":
            self.dp.sync_params()

    def params_sha256(self) -> str:
        return params_sha256(self.model)

    def result_fields(self) -> dict[str, Any]:
        dp = self.dp
        cost = None
        if dp.cost is not None:
            base = getattr(dp.cost, "allreduce", dp.cost)  # dear: its halves ride along (SplitCost)
            cost = {"a": getattr(base, "a", None), "b": getattr(base, "b", None),
                    "points": [list(p) for p in dp.cost_points]}  # fmt: skip
            if dp.planner.half_points:
                cost["halves"] = {k: [list(p) for p in v] for k, v in dp.planner.half_points.items()}
        return {
            "collective": self.cfg.collective,
            "trace": dp.trace.to_dict() if dp.trace is not None else None,
            "cost": cost,
            "grad_buffer_bytes": dp.grad_buffer_bytes,
        }

    def close(self) -> None:
        self.dp.close()


register_kind(ReplicaKind(name=DEFAULT_KIND, build=RuntimeReplica, check=check, summary="dpcomm runtime"))
