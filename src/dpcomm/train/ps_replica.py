"""The parameter server as a kind of replica of the training loop (:mod:`dpcomm.train.replica`).

Schedule text ``ps:METHOD[,servers=S][,push=wfbp|single][,sparsify=topk:R][,pulls=send|request]``
(:mod:`dpcomm.ps.spec`): ``dpcomm train --ps --pull ibatch --ps-servers 2`` is ``ps:ibatch,servers=2``.
Co-located (no ``servers=``), every rank is a worker and serves one shard. Dedicated (``servers=S``), the
kind declares ``S`` server ranks (:attr:`~dpcomm.train.replica.ReplicaKind.servers`): the loop starts
``W + S`` processes, the last ``S`` train nothing and run only the server's part of each iteration
(:class:`dpcomm.ps.rank.PsRank`). Everything else -- checks before any worker starts, checkpoints, resume,
records, the Chrome trace, the JSON result, multi-node -- is the loop's, the same for both placements.
"""

from __future__ import annotations

from typing import Any

from dpcomm.errors import UserError
from dpcomm.ps.spec import PsSpec, parse_ps_schedule
from dpcomm.runtime.records import Span
from dpcomm.train.config import TrainConfig, total_iterations
from dpcomm.train.replica import ReplicaContext, ReplicaKind, register_kind
from dpcomm.train.setup import build_model, params_sha256

__all__ = ["PsReplica", "check"]

_KEEP_SPANS = 50  # iterations whose timeline is kept for --chrome-trace


def check(cfg: TrainConfig, schedule: str) -> PsSpec:
    """The parsed schedule, or a one-line :class:`UserError` (runs in the parent, before any worker)."""
    if cfg.dtype not in ("float32", "fp32"):
        raise UserError(
            f"{schedule}: the parameter server moves float32 parameters; drop --dtype {cfg.dtype}"
        )
    if cfg.replan_every:
        raise UserError(f"--replan-every runs with dpcomm's runtime schedules (e.g. mgwfbp), not {schedule}")
    return parse_ps_schedule(schedule)


def servers(spec: PsSpec) -> int:
    """Server ranks beyond the workers: ``S`` with dedicated servers, 0 co-located."""
    return spec.servers


class PsReplica:
    """One rank's parameter-server replica: a worker (co-located: also a server) or a dedicated server."""

    def __init__(self, ctx: ReplicaContext) -> None:
        import torch

        from dpcomm.models import example_input
        from dpcomm.ps.rank import PsRank
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
        self.role = "worker" if ctx.rank < ctx.workers else "server"
        self.log: list[str] = []
        total = total_iterations(cfg)
        every = cfg.checkpoint_every

        def ckpt_at(it: int) -> bool:  # the loop's own test: rank 0 saves after these iterations
            return bool(cfg.checkpoint) and (it + 1 == total or bool(every and (it + 1) % every == 0))

        # every worker times its forward on a sample (all at once); a generator of its own leaves the run's
        # random draws alone; a dedicated server computes nothing
        sample = None
        if self.role == "worker":
            sample = example_input(cfg.model, cfg.batch_size, generator=torch.Generator().manual_seed(0))
        # A process group of its own: replicas of several schedules run interleaved in one loop, and another
        # parameter server's messages (same tags) must never land in this one's posted receives.
        group = torch.distributed.new_group(list(range(ctx.world)), timeout=group_timeout())  # the run's
        self._ps = PsRank(
            self.model,
            self.optimizer,
            spec,
            rank=ctx.rank,
            workers=ctx.workers,
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

    def spans(self) -> list[list[Span]]:
        """The last iterations' timeline from the records: a worker's forward (its pull waits inside) and
        backward on ``compute``, then the wait for its pushes, its server's update and the next pulls'
        posting on ``comm``; a dedicated server's part of the iteration on ``comm``."""
        out = []
        for r in self.records[-_KEEP_SPANS:]:
            t0 = r["start_unix"]
            f_end = t0 + r["forward_s"]
            b_end = f_end + r["backward_s"]
            if self.role == "server":
                rows = [
                    Span(
                        name="serve (sum pushes, update, pulls)", row="comm", start=t0, end=t0 + r["total_s"]
                    )
                ]
            else:
                rows = [
                    Span(name="forward", row="compute", start=t0, end=f_end,
                         args={"pull_wait_s": r["pull_wait_s"]}),
                    Span(name="backward", row="compute", start=f_end, end=b_end),
                    Span(name="push, update, pull", row="comm", start=b_end, end=t0 + r["total_s"]),
                ]  # fmt: skip
            out.append(rows)
        return out

    def finish(self) -> None:
        self._ps.finish()

    def params_sha256(self) -> str:
        return params_sha256(self.model)

    def result_fields(self) -> dict[str, Any]:
        spec = self._ps.spec
        how = " on request" if spec.pulls == "request" else ""
        where = f"{spec.servers} dedicated servers" if spec.servers else "colocated"
        pulls = self._ps.pull_plan
        # the pull plan run and what it was planned from (dpcomm.validate prices the iteration with them)
        cost = {"pull_batches": [list(b) for b in pulls.batches],
                **{k: pulls.meta[k] for k in ("Ts_s", "beta_s_per_byte") if k in pulls.meta}}  # fmt: skip
        return {"collective": f"ps ({where}, {spec.pull} pulls{how})", "cost": cost}

    def close(self) -> None:
        self._ps.close()


register_kind(
    ReplicaKind(
        name="ps",
        build=PsReplica,
        check=check,
        summary="parameter server (iBatch pulls): ps:all|layer|ibatch|optimal[,servers=S]",
        servers=servers,
    )
)
