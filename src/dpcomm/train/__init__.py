"""Training above the runtime: the config, the replica kinds, the loop, online planning and the reports.

``train(TrainConfig(...))`` is ``dpcomm train`` as a library. Modules:

- :mod:`~dpcomm.train.config`: :class:`TrainConfig` (one field per flag) and :class:`TrainResult`;
- :mod:`~dpcomm.train.checks`: everything a user can get wrong, checked before any worker starts;
- :mod:`~dpcomm.train.replica`: the :class:`Replica` protocol and the registry of kinds;
- :mod:`~dpcomm.train.dp_replica` (dpcomm's runtime) and :mod:`~dpcomm.train.ddp_replica` (PyTorch DDP);
- :mod:`~dpcomm.train.loop`: launch, iterations, checkpoints, the per-rank results;
- :mod:`~dpcomm.train.online` and :mod:`~dpcomm.planner.autoplan`: a planner name planned on the workers
  (profile, trace, plan on the root, timed trial);
- :mod:`~dpcomm.train.report`: progress bar, summary table, the simulator's prediction.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SCHEDULE_DDP",
    "Replica",
    "ReplicaContext",
    "ReplicaKind",
    "TrainConfig",
    "TrainResult",
    "compare_schedules",
    "predict",
    "register_kind",
    "summary_table",
    "total_iterations",
    "train",
    "validate",
]

_WHERE = {
    "SCHEDULE_DDP": "dpcomm.train.config",
    "TrainConfig": "dpcomm.train.config",
    "TrainResult": "dpcomm.train.config",
    "total_iterations": "dpcomm.train.config",
    "validate": "dpcomm.train.checks",
    "Replica": "dpcomm.train.replica",
    "ReplicaContext": "dpcomm.train.replica",
    "ReplicaKind": "dpcomm.train.replica",
    "register_kind": "dpcomm.train.replica",
    "train": "dpcomm.train.loop",
    "compare_schedules": "dpcomm.train.loop",
    "predict": "dpcomm.train.report",
    "summary_table": "dpcomm.train.report",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the config (the CLI's parser) does not import torch.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'dpcomm.train' has no attribute {name!r}")
