"""Train with a parameter server: ``train_ps(PsTrainConfig(...))`` starts ``W`` workers (and ``S`` dedicated
servers) on this machine and runs :class:`dpcomm.ps.rank.PsRank` for every iteration.

Data, seeds and checkpoints follow ``dpcomm train``: worker ``w`` takes batch ``w`` of the global batch
(:class:`dpcomm.runtime.data.TrainData` with ``W`` ranks, so the data split is the all-reduce run's), torch
is reseeded from ``(seed, rank, iteration)`` before each iteration, and rank 0 writes one checkpoint file
(``model`` and ``optimizer`` in ``state_dict`` form, current as of the servers; see :mod:`dpcomm.ps.rank`).
Test hooks: ``DPCOMM_TEST_KILL="RANK:ITER"`` makes that rank ``os._exit(17)`` at the start of ``ITER``;
``DPCOMM_TEST_STALL="RANK:ITER"`` makes it sleep there instead (alive, silent: the others' timeouts).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dpcomm.errors import UserError
from dpcomm.ps.spec import PsSpec

__all__ = ["PsTrainConfig", "train_ps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PsTrainConfig:
    """One parameter-server training run."""

    spec: PsSpec = field(default_factory=PsSpec)
    """Placement, pull method, push grouping, sparsification."""
    model: str = "lenet5"
    """Zoo name."""
    data: str = "digits"
    """``digits`` or ``synthetic``."""
    workers: int = 3
    """W, data-parallel workers (the run starts ``W + S`` processes with dedicated servers)."""
    iters: int = 10
    """Iterations, counted from 0 even when resuming."""
    batch_size: int = 16
    """Samples per worker per iteration."""
    lr: float = 0.05
    """SGD learning rate (applied by the servers)."""
    momentum: float = 0.9
    """SGD momentum (the servers keep the buffers)."""
    weight_decay: float = 0.0
    """SGD weight decay."""
    seed: int = 0
    """Seeds the model, the data order and dropout."""
    checkpoint: str | None = None
    """Folder for ``checkpoint.pt`` (rank 0 writes it every ``checkpoint_every`` iterations and last)."""
    checkpoint_every: int = 0
    """Iterations between checkpoints; 0: only at the end."""
    resume: bool = False
    """Continue from the checkpoint in ``checkpoint``."""
    timeout_s: float = 60.0
    """A message waited on longer than this fails the run (gloo timeout)."""
    threads: int = 1
    """Torch threads per process."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UserError(f"workers must be >= 1, got {self.workers}")
        if self.iters < 1 or self.batch_size < 1:
            raise UserError("--iters and --batch-size must be >= 1")
        if (
            not (math.isfinite(self.lr) and self.lr > 0)
            or not 0 <= self.momentum < 1
            or self.weight_decay < 0
        ):
            raise UserError("need lr > 0, 0 <= momentum < 1, weight decay >= 0")
        if self.resume and not self.checkpoint:
            raise UserError("--resume needs --checkpoint DIR")

    def ckpt_at(self, it: int) -> bool:
        """Whether a checkpoint is written after iteration ``it`` (the same answer on every rank)."""
        if not self.checkpoint:
            return False
        return it + 1 == self.iters or bool(self.checkpoint_every and (it + 1) % self.checkpoint_every == 0)


def _test_hook(env: str, rank: int) -> int | None:
    """The iteration ``RANK:ITER`` in ``env`` names for this rank, or None."""
    victim, _, at = os.environ.get(env, "").partition(":")
    return int(at) if victim and int(victim) == rank else None


def train_ps(cfg: PsTrainConfig) -> list[dict[str, Any]]:
    """Run the training; one result dict per rank (workers first)."""
    from dpcomm.launch import launch

    return launch(_rank_main, cfg.workers + cfg.spec.servers, cfg)


def _rank_main(cfg: PsTrainConfig) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker
    from dpcomm.models import get_model, input_shape
    from dpcomm.ps.rank import PsRank
    from dpcomm.runtime.checkpoint import load_checkpoint, save_checkpoint
    from dpcomm.runtime.data import TrainData, derive_seed

    rank, world = init_worker("gloo", timeout_s=cfg.timeout_s)
    torch.set_num_threads(cfg.threads)
    W = cfg.workers
    state = None
    if cfg.resume:
        box = [load_checkpoint(cfg.checkpoint) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        state = box[0]
        if state is None:
            raise UserError(f"no checkpoint to resume in {cfg.checkpoint}")
    torch.manual_seed(cfg.seed)
    classes = 10 if cfg.data == "digits" else None
    model = get_model(cfg.model, classes)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["iteration"])
    data = None
    if rank < W:
        data = TrainData(
            cfg.data,
            input_shape=input_shape(cfg.model),
            num_classes=10 if classes else 1000,
            batch_size=cfg.batch_size,
            world_size=W,
            rank=rank,
            seed=cfg.seed,
        )
    logs: list[str] = []
    sample = data.batch(start)[0] if data is not None else None  # every worker times its forward
    ps = PsRank(
        model,
        opt,
        cfg.spec,
        rank=rank,
        workers=W,
        start=start,
        ckpt_at=cfg.ckpt_at,
        sample=sample,
        log=logs.append,
        stop=cfg.iters,
        resumed=(state or {}).get("replica"),
    )
    kill, stall = _test_hook("DPCOMM_TEST_KILL", rank), _test_hook("DPCOMM_TEST_STALL", rank)
    losses = []
    for it in range(start, cfg.iters):
        if it == kill:
            os._exit(17)
        if it == stall:
            time.sleep(3600)
        x, y = data.batch(it) if data is not None else (None, None)
        torch.manual_seed(derive_seed(cfg.seed, rank, it))
        losses.append(ps.iteration(x, y))
        if rank == 0 and cfg.ckpt_at(it):
            save_checkpoint(
                cfg.checkpoint,
                {
                    "iteration": it + 1,
                    "config": {
                        "model": cfg.model,
                        "data": cfg.data,
                        "seed": cfg.seed,
                        "batch_size": cfg.batch_size,
                        "world_size": W,
                    },
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "plan": None,
                    "replica": ps.checkpoint_state(),
                    "loss": ps.loss,
                },
            )
    ps.finish()
    ps.close()
    accuracy = None
    if rank == 0 and data is not None and cfg.data == "digits":
        model.eval()
        right = total = 0
        with torch.no_grad():
            for xb, yb in data.test_batches():
                right += int((model(xb).argmax(1) == yb).sum())
                total += len(yb)
        accuracy = right / total
    return {
        "rank": rank,
        "role": "worker" if rank < W else "server",
        "params_sha256": ps.params_sha256(),
        "params": [p.detach().clone() for p in model.parameters()] if rank < W else None,
        "losses": losses,
        "records": ps.records,
        "pull_plan": ps.pull_plan.to_dict(),
        "pull_time_s": ps.pull_plan.time_s,
        "test_accuracy": accuracy,
        "log": logs,
    }
