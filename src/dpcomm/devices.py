"""Where dpcomm's workers compute: the CPU (gloo) or one GPU per process (NCCL), as ``torchrun`` places them.

:func:`check_device` is the one check, in the parent before any worker starts (``dpcomm train --device``,
``dpcomm bench --device``): one line when this machine cannot (no CUDA, fewer GPUs than ``--nproc``).
:func:`worker_device` is a worker's own device: the GPU numbered by its ``LOCAL_RANK``
(:func:`dpcomm.launch.init_worker` makes it current before the process group).
"""

from __future__ import annotations

import os
from typing import Any

from dpcomm.errors import UserError

__all__ = ["DEVICES", "check_device", "worker_device"]

DEVICES = ("cpu", "cuda")
"""Where workers run: ``cpu`` (gloo) or ``cuda`` (one process per GPU, NCCL)."""


def check_device(device: str, nproc: int = 1) -> None:
    """A :class:`UserError` in one line unless ``nproc`` workers of this machine can each have a ``device``
    of their own: ``cpu`` always; ``cuda`` needs CUDA and at least ``nproc`` GPUs (one process per GPU)."""
    if device not in DEVICES:
        raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False)")
    if nproc > torch.cuda.device_count():
        raise UserError(
            f"--device cuda runs one process per GPU: --nproc {nproc} needs {nproc} GPUs, this machine has "
            f"{torch.cuda.device_count()}"
        )


def worker_device(device: str = "cpu") -> Any:
    """This worker's ``torch.device``: the CPU, or for ``cuda`` the GPU numbered by its ``LOCAL_RANK``
    (the launcher's and torchrun's local rank; 0 outside a launch)."""
    import torch

    if device == "cpu":
        return torch.device("cpu")
    check_device(device)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local >= torch.cuda.device_count():
        raise UserError(f"local rank {local} has no GPU of its own ({torch.cuda.device_count()} visible)")
    return torch.device("cuda", local)
