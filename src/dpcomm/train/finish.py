"""The end of a run on every rank: make replicas current, agree on loss and parameter hashes, test accuracy,
the Chrome trace, and rank 0's medians over the steady iterations (one result dict per replica)."""

from __future__ import annotations

import os
import re
import resource
import statistics
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.runtime.records import write_chrome_trace_file
from dpcomm.train.config import TrainConfig
from dpcomm.train.replica import Replica
from dpcomm.train.report import exposed_share, steady
from dpcomm.train.setup import grad_bytes

__all__ = ["finish", "trace_path"]


def finish(
    cfg: TrainConfig, rep: Replica, data: Any, rank: int, world: int, start: int, total: int, multi: bool
) -> dict[str, Any]:
    """:class:`~dpcomm.train.config.TrainResult` fields of ``rep`` (a collective call: every rank)."""
    rep.finish()
    loss = torch.tensor([rep.loss], dtype=torch.float64)
    dist.all_reduce(loss)
    shas: list[Any] = [None] * world
    dist.all_gather_object(shas, rep.params_sha256())
    accuracy = [None]
    if cfg.data == "digits":
        if rank == 0:
            accuracy[0] = _test_accuracy(rep.model, data)
        dist.broadcast_object_list(accuracy, src=0)
    written = None
    if cfg.chrome_trace:
        written = _write_trace(trace_path(cfg.chrome_trace, rep.schedule, multi), rep, rank, world)
    kept = steady(rep.records)
    t_iter = statistics.median(r["total_s"] for r in kept)
    plan = rep.plan
    fields = {"trace": None, "cost": None, "grad_buffer_bytes": None, **rep.result_fields()}
    rep.close()
    return {
        "nproc": world,
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
        "throughput_samples_s": cfg.batch_size * world / t_iter,
        "loss_final": float(loss.item() / world),
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
        for x, y in data.test_batches():
            correct += int((model(x).argmax(1) == y).sum())
            seen += len(y)
    model.train(was)
    return correct / max(1, seen)


def trace_path(path: str, schedule: str, multi: bool) -> str:
    """``out.json`` for one schedule; ``out.<schedule>.json`` per schedule when several run together."""
    if not multi:
        return path
    base, ext = os.path.splitext(path)
    return f"{base}.{re.sub(r'[^A-Za-z0-9_-]+', '_', schedule)}{ext or '.json'}"


def _write_trace(path: str, rep: Replica, rank: int, world: int) -> str | None:
    """Every rank's spans gathered into one Chrome trace on rank 0 (a process per rank)."""
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, [s for it in rep.spans() for s in it])
    out = write_chrome_trace_file(path, dict(enumerate(everyone))) if rank == 0 else None
    return str(out) if out is not None else None
