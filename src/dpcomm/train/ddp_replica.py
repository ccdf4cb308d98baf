"""The baseline replica kind ``ddp``: PyTorch's own DistributedDataParallel with its default buckets (25 MB,
first bucket 1 MB).

The exposed communication is measured with a comm hook that is PyTorch's default all-reduce hook plus a
timestamp: the time from the last bucket becoming ready (end of backward computation) to ``backward()``
returning.

``--compiled-autograd`` (``--compile inductor``): ``torch._dynamo.config.optimize_ddp = "python_reducer"``
before DDP is built, ``DistributedDataParallel(torch.compile(model))`` with DDP's defaults, and every
backward under ``torch._dynamo.compiled_autograd._enable(torch.compile(backend="inductor"))``: one compiled
graph with DDP's all-reduces in it, fused by inductor's greedy pass (1 MB, then 25 MB buckets;
docs/compile.md). A comm hook would run per parameter there, so none is registered; the backward's end of
computation is inside the graph, so a record's ``backward_s`` is the whole backward, its all-reduces
included, and ``exposed_comm_s`` is 0 (``"compiled_autograd": True`` in the record says so).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dpcomm.errors import UserError
from dpcomm.models.loss import classification_loss
from dpcomm.plan import Plan
from dpcomm.runtime.records import Phase, Span
from dpcomm.timing import now
from dpcomm.train.config import SCHEDULE_DDP, TrainConfig
from dpcomm.train.replica import ReplicaContext
from dpcomm.train.setup import build_model, params_sha256

__all__ = ["DDPReplica", "DDPTimedReplica", "check", "compiled", "compiled_autograd"]

_KEEP_SPANS = 50  # iterations whose timeline is kept for --chrome-trace


def compiled_autograd(cfg: Any) -> Any:
    """The compiler compiled autograd hands each backward graph to (``torch.compile`` with ``cfg.compile``,
    inductor), after setting ``optimize_ddp = "python_reducer"`` (DDP reads it when built); None unless
    ``--compiled-autograd``."""
    if not getattr(cfg, "compiled_autograd", False):
        return None
    torch._dynamo.config.optimize_ddp = "python_reducer"
    return torch.compile(backend=cfg.compile)


def compiled(model: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """``torch.compile(model, backend=cfg.compile)``, or ``model`` itself when ``--compile`` is not given."""
    return model if cfg.compile is None else torch.compile(model, backend=cfg.compile)


def check(cfg: TrainConfig, schedule: str) -> None:
    """``ddp`` takes no argument and runs only in ``overlap`` mode with torch's own all-reduce."""
    if schedule.strip() != SCHEDULE_DDP:
        raise UserError(f"schedule 'ddp' takes no argument, got {schedule!r}")
    if cfg.mode != "overlap":
        raise UserError(f"--schedule ddp runs PyTorch's DDP; --mode {cfg.mode} needs a dpcomm schedule")
    if cfg.collective != "native":
        raise UserError(
            f"--schedule ddp is PyTorch's all-reduce; --collective {cfg.collective} needs a dpcomm schedule"
        )


class DDPTimedReplica:
    """What every DDP-backed replica shares: the model, optimizer, records and spans, and one timed step.

    A subclass sets ``wrapper`` (the DistributedDataParallel) and calls :meth:`_step`; ``ready_s`` is the
    ``time.perf_counter()`` at which the last bucket was handed over (the end of backward computation).
    """

    def __init__(self, ctx: ReplicaContext):
        s = build_model(ctx)
        self.cfg, self.schedule, self.rank, self.world = ctx.cfg, ctx.schedule, ctx.rank, ctx.world
        self.model, self.optimizer, self._update, self.start = s.model, s.optimizer, s.update, s.start
        self.log: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.loss = float("nan")
        self._spans: list[list[Span]] = []
        self.wrapper: Any = None
        self.ready_s = 0.0
        self._mode = torch._dynamo.config.optimize_ddp if ctx.cfg.compiled_autograd else None
        self._backward = compiled_autograd(ctx.cfg)  # compiled autograd's compiler, or None
        self.compiled_allreduces: int | None = None

    def _step(self, x: Any, y: Any, phase: Phase, plan: str) -> float:
        """Forward, loss, backward and step of ``wrapper``, timed; one record and one timeline entry."""
        self.optimizer.zero_grad(set_to_none=True)
        self._update.reset()
        dev = x.device if x.device.type == "cuda" else None  # --device cuda: each time after the GPU's work
        t0 = now(dev)
        out = self.wrapper(x)
        t1 = now(dev)
        loss = classification_loss(out, y)
        if self._backward is None:
            loss.backward()
        else:  # one compiled graph, DDP's all-reduces traced in, fused by inductor: compute ends inside it
            with torch._dynamo.compiled_autograd._enable(self._backward):
                loss.backward()
        t2 = now(dev)
        self.optimizer.step()
        t3 = now(dev)
        ready = t2 if self._backward is not None else min(max(self.ready_s, t1), t2)
        self.records.append(
            {"iteration": len(self.records), "forward_s": t1 - t0, "backward_s": ready - t1,
             "exposed_comm_s": t2 - ready, "step_s": t3 - t2, "total_s": t3 - t0, "comm_s": None,
             "phase": phase, "plan": plan, "update_s": self._update.last_s, "end_unix": time.time()}
        )  # fmt: skip
        if self._backward is not None:
            self.records[-1]["compiled_autograd"] = True
        wall = time.time() - time.perf_counter()
        rows = [("forward", "compute", t0, t1), ("backward", "compute", t1, ready),
                ("exposed all-reduce wait", "comm", ready, t2), ("step", "compute", t2, t3)]  # fmt: skip
        self._spans.append([Span(name=n, row=r, start=a + wall, end=b + wall) for n, r, a, b in rows])
        del self._spans[:-_KEEP_SPANS]
        self.loss = float(loss.detach())
        return self.loss

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def _restore_mode(self) -> None:
        """``optimize_ddp`` as it was before this replica (``--compiled-autograd``)."""
        if self._mode is not None:
            torch._dynamo.config.optimize_ddp = self._mode

    def spans(self) -> list[list[Span]]:
        return [list(s) for s in self._spans]

    def finish(self) -> None:
        pass

    def params_sha256(self) -> str:
        return params_sha256(self.model)


class DDPReplica(DDPTimedReplica):
    """PyTorch DDP on this rank (see :mod:`dpcomm.train.replica`)."""

    def __init__(self, ctx: ReplicaContext):
        super().__init__(ctx)
        self.wrapper = DistributedDataParallel(compiled(self.model, self.cfg))  # default buckets: 25 MB, 1 MB
        if self._backward is not None:  # python reducer: a comm hook would run per parameter, not per bucket
            self.log.append(
                f"[rank {self.rank}] DistributedDataParallel(torch.compile(model)), default buckets, under "
                "compiled autograd: inductor's greedy fusion of the all-reduces (first 1 MB, then 25 MB)"
            )
            return
        world = ctx.world

        def hook(_state, bucket):  # no annotations: DDP insists they be GradBucket/Future if present
            # PyTorch's default allreduce_hook (divide by P, all-reduce, return the buffer) plus a timestamp:
            # the last bucket handed over marks the end of backward computation.
            self.ready_s = time.perf_counter()
            buf = bucket.buffer().div_(world)
            return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

        self.wrapper.register_comm_hook(None, hook)
        self.log.append(
            f"[rank {self.rank}] DistributedDataParallel with default buckets (25 MB, first 1 MB)"
        )

    def iteration(self, x: Any, y: Any) -> float:
        if self._backward is None or self.records:
            return self._step(x, y, Phase.STEADY, SCHEDULE_DDP)
        counters = torch._dynamo.utils.counters  # dynamo may replace its Counters while compiling: read anew
        counters["inductor"].pop("ddp_buckets", None)  # set by inductor's greedy fusion as it compiles
        loss = self._step(x, y, Phase.STEADY, SCHEDULE_DDP)
        self.compiled_allreduces = counters["inductor"].get("ddp_buckets")
        self.log.append(
            f"[rank {self.rank}] compiled backward: {self.compiled_allreduces} fused all-reduces "
            "(inductor's greedy buckets)"
        )
        return loss

    @property
    def plan(self) -> Plan | None:
        return None

    @property
    def settled(self) -> bool:
        return True  # DDP's buckets are fixed from the start

    def result_fields(self) -> dict[str, Any]:
        out = {"collective": "native", "grad_buffer_bytes": self._bucket_bytes()}  # DDP: torch's own
        if self._backward is not None:
            out["compiled_allreduces"] = self.compiled_allreduces
        return out

    def _bucket_bytes(self) -> int | None:
        sizes = self.wrapper._get_ddp_logging_data().get("bucket_sizes")  # "1051688, 12050944" (bytes)
        try:
            return sum(int(s) for s in str(sizes).split(",") if s.strip())
        except ValueError:
            return None

    def close(self) -> None:
        self._restore_mode()
