"""What every replica kind builds the same way: the seeded zoo model, momentum SGD, the update timer, and the
checkpoint's model and optimizer state when resuming (point 1 of :mod:`dpcomm.train.replica`)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dpcomm.train.replica import ReplicaContext

__all__ = ["Setup", "UpdateTimer", "build_model", "params_sha256", "grad_bytes"]


class UpdateTimer:
    """Times ``optimizer.step()`` (the model update) with the optimizer's own step hooks, seconds."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self._t0 = 0.0
        self.last_s = 0.0
        """Duration of the last ``step()``; :meth:`reset` sets it to 0 (a rank that does not step keeps 0)."""
        optimizer.register_step_pre_hook(self._pre)
        optimizer.register_step_post_hook(self._post)

    def _pre(self, *_: Any) -> None:
        self._t0 = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self.last_s = time.perf_counter() - self._t0

    def reset(self) -> None:
        self.last_s = 0.0


@dataclass(slots=True, kw_only=True)
class Setup:
    """A replica's model, optimizer and update timer, and where it starts."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    update: UpdateTimer
    start: int
    """First iteration (the checkpoint's when resuming)."""
    log: list[str] = field(default_factory=list)


def build_model(ctx: ReplicaContext) -> Setup:
    """``torch.manual_seed(seed)``, the zoo model (10 classes on digits), SGD with the config's lr and
    momentum; the checkpoint's model and optimizer state loaded when resuming."""
    from dpcomm.devices import worker_device
    from dpcomm.models import get_model
    from dpcomm.train.config import torch_dtype

    cfg = ctx.cfg
    torch.manual_seed(cfg.seed)
    model = get_model(cfg.model, 10 if cfg.data == "digits" else None)
    model = model.to(worker_device(cfg.device), torch_dtype(cfg))  # --device cuda: this rank's GPU
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    update = UpdateTimer(optimizer)
    start = 0
    if ctx.state is not None:
        model.load_state_dict(ctx.state["model"])
        optimizer.load_state_dict(ctx.state["optimizer"])
        start = int(ctx.state["iteration"])
    return Setup(model=model, optimizer=optimizer, update=update, start=start)


def params_sha256(model: nn.Module) -> str:
    """sha256 over every parameter's name and bytes (equal across ranks when replicas agree bitwise)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().contiguous().view(-1).view(dtype=torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def grad_bytes(model: nn.Module) -> int:
    """Bytes of the model's gradients (one copy)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
