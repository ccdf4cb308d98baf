"""The parameter server as a kind of replica for the training layer (:mod:`dpcomm.train.replica`).

Schedule text ``ps:METHOD[,servers=S][,push=wfbp|single][,sparsify=topk:R]`` (:mod:`dpcomm.ps.spec`):
``dpcomm train --ps --pull ibatch --sparsify topk:0.01`` is the schedule ``ps:ibatch,sparsify=topk:0.01``.
Inside the training loop every rank is a worker, so the loop runs the co-located placement; dedicated
servers (``servers=S``) need ``S`` ranks that train nothing, which :func:`dpcomm.ps.runner.train_ps`
provides (``check`` says so in one line).

Importing this module registers the kind ``ps`` when the training layer is present.
"""

from __future__ import annotations

from typing import Any

from dpcomm.errors import UserError
from dpcomm.ps.spec import PsSpec, parse_ps_schedule

__all__ = ["PsReplica", "check"]


def check(cfg: Any, schedule: str) -> PsSpec:
    """The parsed schedule, or a one-line :class:`UserError` (runs in the parent, before any worker)."""
    if getattr(cfg, "replan_every", 0):
        raise UserError(f"--replan-every runs with dpcomm's runtime schedules (e.g. mgwfbp), not {schedule}")
    spec = parse_ps_schedule(schedule)
    if spec.servers:
        raise UserError(
            f"{schedule}: dedicated servers run through dpcomm.ps.runner.train_ps; in a training run with "
            "other schedules every rank is a worker, so use the co-located placement (no servers=)"
        )
    return spec


class PsReplica:
    """One rank's parameter-server replica (co-located: this rank is a worker and serves one shard)."""

    def __init__(self, ctx: Any) -> None:
        import torch

        from dpcomm.models import input_shape
        from dpcomm.ps.rank import PsRank
        from dpcomm.train.config import total_iterations
        from dpcomm.train.setup import build_model
        from dpcomm.utils.groups import group_timeout

        cfg = ctx.cfg
        spec: PsSpec = ctx.parsed if isinstance(ctx.parsed, PsSpec) else check(cfg, ctx.schedule)
        setup = build_model(ctx)
        self.schedule, self.model, self.optimizer, self.start = (
            ctx.schedule,
            setup.model,
            setup.optimizer,
            setup.start,
        )
        self.log: list[str] = []
        total = total_iterations(cfg)
        every = getattr(cfg, "checkpoint_every", 0)

        def ckpt_at(it: int) -> bool:  # the loop's own test: rank 0 saves after these iterations
            return bool(cfg.checkpoint) and (it + 1 == total or bool(every and (it + 1) % every == 0))

        # every worker times its forward on a sample (all at once); a generator of its own leaves the run's
        # random draws alone
        sample = torch.randn(
            cfg.batch_size, *input_shape(cfg.model), generator=torch.Generator().manual_seed(0)
        )
        # A process group of its own: replicas of several schedules run interleaved in one loop, and another
        # parameter server's messages (same tags) must never land in this one's posted receives.
        group = torch.distributed.new_group(list(range(ctx.world)), timeout=group_timeout())  # the run's
        self._ps = PsRank(
            self.model,
            self.optimizer,
            spec,
            rank=ctx.rank,
            workers=ctx.world,
            start=self.start,
            ckpt_at=ckpt_at,
            sample=sample,
            log=self.log.append,
            stop=total,
            group=group,
            resumed=(ctx.state or {}).get("replica"),
        )
        self.records = self._ps.records
        self.loss = float("nan")

    def iteration(self, x: Any, y: Any) -> float:
        self.loss = self._ps.iteration(x, y)
        return self.loss

    @property
    def plan(self) -> None:
        return None  # gradients are pushed per layer, not by a gradient plan; the pull plan is replica state

    @property
    def settled(self) -> bool:
        return True  # nothing here waits on timings: checkpoints are written when due

    def checkpoint_state(self) -> dict[str, Any]:
        return self._ps.checkpoint_state()

    def spans(self) -> list[list[Any]]:
        return []

    def finish(self) -> None:
        self._ps.finish()

    def params_sha256(self) -> str:
        return self._ps.params_sha256()

    def result_fields(self) -> dict[str, Any]:
        spec = self._ps.spec
        how = " on request" if spec.pulls == "request" else ""
        return {"collective": f"ps ({spec.placement}, {spec.pull} pulls{how})"}

    def close(self) -> None:
        self._ps.close()


def _register() -> None:
    try:
        from dpcomm.train.replica import ReplicaKind, register_kind
    except ImportError:  # no training layer in this tree
        return
    register_kind(
        ReplicaKind(
            name="ps",
            build=PsReplica,
            check=check,
            summary="parameter server (iBatch pulls): ps:all|layer|ibatch|optimal",
        )
    )


_register()
