"""What decides the plan of a :class:`~dpcomm.runtime.data_parallel.DataParallel` while it trains.

The runtime runs plans; it does not make them. Given a :class:`~dpcomm.plan.Plan`, it runs that plan from the
first iteration. Given a *driver* instead (:class:`dpcomm.train.online.OnlinePlanner` plans a planner name
on the workers), it asks the driver which plan to run, and in which :class:`~dpcomm.runtime.records.Phase`,
at three points:

1. ``begin(dp)`` after the first forward (the learnable layers and their order are known): the first plan
   (e.g. ``single`` while profiling) and its phase;
2. ``layer_times(f, b)`` after each backward while the phase is ``PROFILE``: that iteration's per-layer
   forward and backward times, seconds (:func:`dpcomm.runtime.spans.layer_times`);
3. ``after_step(dp, record)`` after every ``step()``: a new ``(plan, phase)`` to switch to from the next
   iteration, or None to keep the current one. In ``STEADY`` a driver may go back to ``PROFILE`` (online
   re-planning: the layers are timed again) and on to a new plan.

A driver may communicate in ``begin`` and ``after_step`` (every rank calls them at the same point), using
only the host's surface listed in :class:`PlanHost` (which ``DataParallel`` is). Another wrapper that wants
the same online planning (e.g. PyTorch DDP with a dpcomm plan) implements :class:`PlanHost` and calls the
three methods at the same points.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from dpcomm.plan import Plan
from dpcomm.runtime.records import IterRecord, Phase

__all__ = ["PlanDriver", "PlanHost"]


class PlanHost(Protocol):
    """What a driver may use of the wrapper it plans for (``DataParallel`` has all of it)."""

    module: nn.Module
    rank: int
    """Rank in ``process_group``."""
    world_size: int
    root: int
    """Group rank that plans (and owns the authoritative parameters)."""
    mode: str
    """``overlap`` or an LP mode (``lp-alg1..3``)."""
    process_group: Any
    collective_name: str

    @property
    def layer_names(self) -> list[str]:
        """Learnable layers' names, forward order (known after the first forward)."""
        ...

    @property
    def layer_numels(self) -> list[int]:
        """Parameters per learnable layer, forward order."""
        ...

    @property
    def batch_size(self) -> int:
        """Samples per forward on this rank."""
        ...

    def scratch(self) -> torch.Tensor:
        """A flat buffer (the largest gradient buffer in use) to time messages with; overwritten."""
        ...

    def allreduce(self, t: torch.Tensor) -> None:
        """Sum ``t`` over the group with the wrapper's collective (no-op on one rank)."""
        ...

    def emit(self, msg: str) -> None:
        """One message for the user (``[rank R] msg``)."""
        ...


@runtime_checkable
class PlanDriver(Protocol):
    """Decides a DataParallel's plan while it trains (see the module docstring)."""

    schedule: str
    """What it plans (a planner name), for messages."""

    def begin(self, dp: PlanHost) -> tuple[Plan, Phase]:
        """After the first forward: the first plan to run and its phase."""
        ...

    def layer_times(self, f: list[float], b: list[float]) -> None:
        """One profiled iteration's forward and backward time per layer (forward order), seconds."""
        ...

    def after_step(self, dp: PlanHost, record: IterRecord) -> tuple[Plan, Phase] | None:
        """After every step: the plan and phase to switch to, or None to keep them."""
        ...
