"""``dpcomm train`` as a library: launch the workers, run every replica's iterations, checkpoint, finish.

``train(TrainConfig(...))`` checks everything a user can get wrong *before* any worker starts
(:mod:`dpcomm.train.checks`), then starts the workers through :func:`dpcomm.launch.launch` (torch's elastic
agent: c10d rendezvous on 127.0.0.1, or a static one at ``master_addr`` across machines, as ``torchrun``
does). Every worker runs:

1. build one replica per schedule (:mod:`dpcomm.train.replica`: the zoo model seeded with ``seed``, momentum
   SGD, and the kind's communication: dpcomm's runtime with a planner's plan, or PyTorch DDP);
2. per iteration ``i``: reseed torch from ``(seed, rank, i)`` (dropout masks), take this rank's batch
   (:class:`dpcomm.runtime.data.TrainData`, a function of ``(seed, epoch, i)``), run each replica's
   iteration; rank 0 saves a checkpoint of the first replica every ``checkpoint_every`` iterations and at
   the end;
3. finish: every rank's loss, parameter hash, test accuracy, Chrome trace and rank 0's timings.

Because data order and randomness depend only on ``(seed, rank, iteration)``, and the checkpoint holds the
model, the optimizer and the plan that was kept, a resumed run ends with bitwise the same parameters as the
interrupted run would have, for every schedule. ``mgwfbp``/``optimal`` pick their plan from timings (two
fresh runs may differ): a periodic checkpoint that falls while the plan is still being profiled or timed
waits until it is kept (:attr:`Replica.settled`), so it always carries the plan. Only a run's *last*
checkpoint can precede that (a run shorter than its planning); resuming it plans afresh.

:func:`compare_schedules` trains one replica per schedule in the *same* workers, interleaved iteration by
iteration on the same batches, so the schedules see the same machine load: the demo and the benchmark use it.

Rank roles: a kind may declare server ranks (a parameter server's dedicated servers,
:attr:`~dpcomm.train.replica.ReplicaKind.servers`). The run then has ``W = nproc * nnodes`` workers and ``S``
servers after them (ranks ``W..W+S-1``, started by the last node); servers take no batch, and the loss,
hashes and throughput are the workers'. A failing server is named as one.

Test hooks: ``DPCOMM_TEST_KILL="RANK:ITER"`` in the environment makes that rank ``os._exit(17)`` at the start
of that iteration, ``DPCOMM_TEST_STALL="RANK:ITER"`` makes it sleep there instead (alive and silent: the
others' timeouts end the run). The tests use them to check that the others fail cleanly instead of hanging.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import re
import sys
import time
from typing import Any

from dpcomm.errors import UserError, first_line
from dpcomm.train.checks import check
from dpcomm.train.config import (
    TrainConfig,
    TrainResult,
    autocast_context,
    compat,
    data_args,
    torch_dtype,
    total_iterations,
)
from dpcomm.train.replica import Replica

__all__ = ["compare_schedules", "train"]

_KILL_ENV = "DPCOMM_TEST_KILL"
_STALL_ENV = "DPCOMM_TEST_STALL"
_KILL_EXIT = 17


def train(cfg: TrainConfig) -> TrainResult:
    """Check, launch the workers, train ``cfg.schedule``; returns the run's :class:`TrainResult`."""
    checked = check(cfg)
    result = _launch(cfg, checked.schedules, checked.servers)[0]
    if cfg.records_json and cfg.node_rank == 0:  # rank 0 runs on node 0
        from dpcomm.utils.io import atomic_write_json

        saved = {"schedule": result.schedule, "log": result.log, "records": result.records,
                 "plan": result.plan, "trace": result.trace, "cost": result.cost}  # fmt: skip
        if result.compiled_allreduces is not None:  # --compiled-autograd: what the compiled backward ran
            saved |= {"compiled_allreduces": result.compiled_allreduces,
                      "compiled_buckets": result.compiled_buckets}  # fmt: skip
        atomic_write_json(cfg.records_json, saved)
    return result


def compare_schedules(cfg: TrainConfig, schedules: list[str]) -> list[TrainResult]:
    """Train one replica per schedule in the same workers, interleaved per iteration on the same batches.

    Checkpoints are not written (``cfg.checkpoint`` must be unset); results in the order given.
    """
    if not schedules:
        raise UserError("no schedules to compare")
    if cfg.checkpoint or cfg.resume:
        raise UserError("checkpoints are for single-schedule runs (dpcomm train), not comparisons")
    checked = check(cfg, list(schedules))
    return _launch(cfg, checked.schedules, checked.servers)


def _launch(cfg: TrainConfig, schedules: list[tuple[str, Any]], servers: int = 0) -> list[TrainResult]:
    from dpcomm.launch import LaunchOptions, WorkerFailure, launch

    opts = LaunchOptions.of(cfg)
    if servers and cfg.node_rank == cfg.nnodes - 1:  # the servers start on the last node, after its workers
        opts = dataclasses.replace(opts, nproc=cfg.nproc + servers)
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")  # "Terminating process ..." warnings
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)
    try:
        per_rank = launch(_worker, opts, cfg, schedules, servers)
    except WorkerFailure as exc:
        raise exc.named(lambda r: _role(r, cfg.world_size), _waited_on_a_waiter(exc.failures)) from None
    finally:
        spawn_log.setLevel(level)
    return [TrainResult(**r) for r in per_rank[0]]


_FROM_RANK = re.compile(r"from rank (\d+)")


def _waited_on_a_waiter(failures: dict[int, str]) -> Any:
    """Which failures are not the cause: a rank that stopped because a peer did (``_worker``'s line), or one
    whose wait timed out on a peer that was itself waiting on another (a worker's pull from a server that
    waited for a stalled worker's request: the server's message names the stalled rank)."""

    def secondary(msg: str) -> bool:
        peer = _FROM_RANK.search(msg)
        return " stopped" in msg or (
            peer is not None and _FROM_RANK.search(failures.get(int(peer.group(1)), "")) is not None
        )

    return secondary


def _role(rank: int, workers: int) -> str:
    return "worker" if rank < workers else "server"


# ----------------------------------------------------------------------------- the workers


def _worker(cfg: TrainConfig, schedules: list[tuple[str, Any]], servers: int = 0) -> list[dict[str, Any]]:
    """One rank: train every schedule's replica, interleaved (a server rank serves them); returns one
    result dict per schedule."""
    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker

    rank, world = init_worker(timeout_s=cfg.timeout_s, device=cfg.device)  # cuda: LOCAL_RANK's GPU, NCCL
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.nproc))
    torch.set_num_threads(_threads(cfg, local))
    where = {"iteration": None}
    try:
        return _train_rank(cfg, schedules, rank, world, servers, where)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - turn a lost peer / timeout into one clear line
        it = where["iteration"]
        at = f" at iteration {it}" if it is not None else ""
        who = f"{_role(rank, world - servers)} rank {rank} of {world}"
        raise RuntimeError(f"{who} stopped{at}: {first_line(exc, with_type=True)}") from None
    finally:
        if "torch.distributed.fsdp" in sys.modules:  # FSDP2's states (cycles) go before the group, not at
            gc.collect()  # the interpreter's teardown (docs/fsdp.md, "Ending the job")
        if dist.is_initialized():
            dist.destroy_process_group()


def _threads(cfg: TrainConfig, local: int) -> int:
    """Torch threads per worker: ``--threads``, else ``$OMP_NUM_THREADS`` (as torchrun and ``testbed launch``
    set it when several workers share the cores), else the cores split among this machine's workers."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if cfg.threads:
        return cfg.threads
    if omp.isdigit() and int(omp) >= 1:
        return int(omp)
    return max(1, (os.cpu_count() or 1) // local)


def _train_rank(
    cfg: TrainConfig,
    schedules: list[tuple[str, Any]],
    rank: int,
    world: int,
    servers: int,
    where: dict[str, Any],
) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from dpcomm.runtime.data import TrainData, derive_seed
    from dpcomm.train.replica import ReplicaContext, make_replica
    from dpcomm.train.report import Progress

    state = None
    if cfg.resume:  # rank 0 reads the file (other nodes may not have it) and shares it
        from dpcomm.runtime.checkpoint import load_checkpoint

        box = [load_checkpoint(cfg.checkpoint) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        state = box[0]
    worker = rank < world - servers
    data = TrainData(cfg.data, **data_args(cfg, rank)) if worker else None  # servers take no batch
    total = total_iterations(cfg)
    replicas = [
        make_replica(
            ReplicaContext(
                cfg=cfg, schedule=s, parsed=p, rank=rank, world=world, state=state, servers=servers
            )
        )
        for s, p in schedules
    ]
    start = replicas[0].start
    kill, stall = _test_point(_KILL_ENV, rank), _test_point(_STALL_ENV, rank)
    from dpcomm.devices import worker_device

    dtype, device = torch_dtype(cfg), worker_device(cfg.device)
    due = False  # a periodic checkpoint is owed (it waits until the plan is kept)
    bar = Progress(cfg, [s for s, _ in schedules], start, total) if rank == 0 else None
    try:
        for it in range(start, total):
            where["iteration"] = it
            if kill == it:
                os._exit(_KILL_EXIT)
            if stall == it:
                time.sleep(3600)
            x, y = data.batch(it) if data is not None else (None, None)
            if x is not None:  # --dtype: the inputs in the parameters' dtype (token ids stay int64)
                x = x.to(device, dtype if x.is_floating_point() else x.dtype)
                y = y.to(device)
            for rep in replicas:
                torch.manual_seed(derive_seed(cfg.seed, rank, it))  # dropout: same masks for every schedule
                with autocast_context(cfg):  # --autocast: planning's profile passes and the training pass
                    rep.iteration(x, y)
            if cfg.checkpoint:  # every rank decides alike: a sharded optimizer is gathered by all of them
                due = due or bool(cfg.checkpoint_every and (it + 1) % cfg.checkpoint_every == 0)
                if it + 1 == total or (due and replicas[0].settled):
                    getattr(replicas[0], "before_checkpoint", lambda: None)()
                    if rank == 0:
                        _save(cfg, replicas[0], it + 1, data)
                    due = False
            if bar is not None:
                bar.update(it + 1, replicas)
        where["iteration"] = None
    finally:
        if bar is not None:
            bar.close()
    from dpcomm.train.finish import finish

    multi = len(replicas) > 1
    return [finish(cfg, rep, data, rank, world - servers, start, total, multi) for rep in replicas]


def _test_point(env: str, rank: int) -> int | None:
    """The iteration ``RANK:ITER`` in ``$env`` names for this rank, or None."""
    spec = os.environ.get(env, "")
    if not spec:
        return None
    r, _, it = spec.partition(":")
    return int(it) if int(r) == rank else None


def _save(cfg: TrainConfig, rep: Replica, iteration: int, data: Any) -> None:
    from dpcomm.runtime.checkpoint import save_checkpoint

    plan = rep.plan
    state = {
        "iteration": iteration,
        "config": compat(cfg),
        "model": rep.model.state_dict(),
        "optimizer": rep.optimizer.state_dict(),
        "plan": plan.to_dict() if plan is not None else None,
        # data order is a function of (seed, epoch, iteration): this is the whole sampler state
        "sampler": {
            "seed": cfg.seed,
            "epoch": data.epoch_of(iteration),
            "batches_per_epoch": data.batches_per_epoch,
        },  # fmt: skip
        "loss": rep.loss,
    }
    extra = rep.checkpoint_state()
    if extra:
        state["replica"] = extra
    save_checkpoint(cfg.checkpoint, state)
