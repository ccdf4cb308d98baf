"""Several ``dpcomm train`` runs in one launch, for tests/test_fsdp.py, test_faults.py and test_train.py.

Starting workers costs more than the tests' few iterations (each of them imports torch, and its first
optimizer imports ``torch._dynamo``: about 3 CPU-seconds a worker), so runs that need no launch of their
own (no killed worker) share one: :func:`train_runs` runs them one after another on one process group, each
as ``train``/``compare_schedules`` runs it in a worker (``dpcomm.train.loop._train_rank``), after the checks
``train`` makes in the parent (:func:`dpcomm.train.checks.check`), made here by rank 0 so that a run can
resume from the checkpoint an earlier run of the same launch wrote.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["train_runs"]


def train_runs(runs: list[tuple[Any, ...]]) -> list[list[Any]]:
    """``[(TrainConfig, schedules or None for [cfg.schedule][, copy])]`` -> per run, one :class:`TrainResult`
    per schedule (in the parent: rank 0's results, as ``compare_schedules`` returns them). ``copy``: a folder
    to copy the run's checkpoint folder to when it ends (the checkpoint as it was before a later run of the
    launch resumes from it and overwrites it)."""
    from dpcomm.launch import LaunchOptions, launch
    from dpcomm.train.config import TrainResult

    first = runs[0][0]
    assert all(run[0].nproc == first.nproc and run[0].nnodes == 1 for run in runs), "one launch: one world"
    per_rank = launch(_worker, LaunchOptions.of(first), runs)
    return [[TrainResult(**r) for r in run] for run in per_rank[0]]


def _worker(runs: list[tuple[Any, ...]]) -> list[list[dict[str, Any]]]:
    import shutil

    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker
    from dpcomm.train.checks import check
    from dpcomm.train.loop import _threads, _train_rank

    rank, world = init_worker("gloo", timeout_s=max(run[0].timeout_s for run in runs))
    out = []
    try:
        for cfg, schedules, *copy in runs:
            # train()'s checks in the parent, made by rank 0 (they read the checkpoint an earlier run wrote)
            checked = check(cfg, schedules) if rank == 0 else None
            box = [(checked.schedules, checked.servers) if checked is not None else None]
            dist.broadcast_object_list(box, src=0)
            (parsed, servers), where = box[0], {"iteration": None}
            assert servers == 0, "server ranks need a launch of their own"
            torch.set_num_threads(_threads(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", cfg.nproc))))
            out.append(_train_rank(cfg, parsed, rank, world, servers, where))
            if copy and rank == 0:  # rank 0 wrote the checkpoint and is the one to read it next
                shutil.copytree(cfg.checkpoint, copy[0])
    finally:
        dist.destroy_process_group()
    return out
