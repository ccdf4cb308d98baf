"""The end of a run on every rank: make replicas current, agree on loss and parameter hashes, test accuracy,
the Chrome trace, and rank 0's medians over the steady iterations (one result dict per replica).

Loss, hashes and throughput are the *workers'* (ranks ``0..workers-1``); server ranks (a parameter server's
dedicated servers) take part in the collectives and add their spans to the Chrome trace, nothing else."""

from __future__ import annotations

import os
import re
import resource
import statistics
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.timeline import Process, write_chrome_trace
from dpcomm.train.config import TrainConfig
from dpcomm.train.replica import Replica
from dpcomm.train.report import exposed_share, steady
from dpcomm.train.setup import grad_bytes

__all__ = ["finish", "trace_path"]


def finish(
    cfg: TrainConfig, rep: Replica, data: Any, rank: int, workers: int, start: int, total: int, multi: bool
) -> dict[str, Any]:
    """:class:`~dpcomm.train.config.TrainResult` fields of ``rep`` (a collective call: every rank, servers
    included; ``workers``: ranks that train)."""
    rep.finish()
    world = dist.get_world_size()
    worker = rank < workers
    loss = torch.tensor([rep.loss if worker else 0.0], dtype=torch.float64)
    dist.all_reduce(loss)
    shas: list[Any] = [None] * world
    dist.all_gather_object(shas, rep.params_sha256() if worker else None)
    shas = shas[:workers]
    accuracy = [None]
    if cfg.data == "digits":
        if rank == 0:
            accuracy[0] = _test_accuracy(rep.model, data)
        dist.broadcast_object_list(accuracy, src=0)
    written = None
    if cfg.chrome_trace:
        written = _write_trace(trace_path(cfg.chrome_trace, rep.schedule, multi), rep, rank, world, workers)
    kept = steady(rep.records)
    t_iter = statistics.median(r["total_s"] for r in kept)
    plan = rep.plan
    fields = {"trace": None, "cost": None, "grad_buffer_bytes": None, **rep.result_fields()}
    rep.close()
    return {
        "nproc": workers,
        "schedule": rep.schedule,
        "mode": cfg.mode,
        "model": cfg.model,
        "data": cfg.data,
        "batch_size": cfg.batch_size,
        "start_iteration": start,
        "iterations": total,
        "t_iter_s": t_iter,
        "forward_s": statistics.median(r["forward_s"] for r in kept),
        "backward_s": statistics.median(r["backward_s"] for r in kept),
        "exposed_comm_s": statistics.median(r["exposed_comm_s"] for r in kept),
        "exposed_share": exposed_share(kept),
        "update_s": statistics.median(r["update_s"] for r in kept),
        "throughput_samples_s": cfg.batch_size * workers / t_iter,
        "loss_final": float(loss.item() / workers),
        "params_sha256": shas,
        "test_accuracy": accuracy[0],
        "plan": plan.to_dict() if plan is not None else None,
        "grad_bytes": grad_bytes(rep.model),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "log": rep.log,
        "records": rep.records,
        "chrome_trace": written,
        **fields,
    }


def _test_accuracy(model: Any, data: Any) -> float:
    was = model.training
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        p = next(model.parameters())  # --dtype, --device: the inputs where the parameters are
        for x, y in data.test_batches():
            x = x.to(p.device, p.dtype if x.is_floating_point() else x.dtype)
            correct += int((model(x).argmax(1).cpu() == y).sum())
            seen += len(y)
    model.train(was)
    return correct / max(1, seen)


def trace_path(path: str, schedule: str, multi: bool) -> str:
    """``out.json`` for one schedule; ``out.<schedule>.json`` per schedule when several run together."""
    if not multi:
        return path
    base, ext = os.path.splitext(path)
    return f"{base}.{re.sub(r'[^A-Za-z0-9_-]+', '_', schedule)}{ext or '.json'}"


def _write_trace(path: str, rep: Replica, rank: int, world: int, workers: int) -> str | None:
    """Every rank's spans gathered into one Chrome trace on rank 0 (a process per rank; servers named)."""
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, [s for it in rep.spans() for s in it])
    procs = [
        Process(pid=r, name=f"{'rank' if r < workers else 'server rank'} {r}", spans=spans)
        for r, spans in enumerate(everyone)
    ]
    out = write_chrome_trace(path, procs) if rank == 0 else None
    return str(out) if out is not None else None
