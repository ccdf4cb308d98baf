"""What decides the plan of a :class:`~dpcomm.runtime.data_parallel.DataParallel` while it trains.

The runtime runs plans; it does not make them. Given a :class:`~dpcomm.plan.Plan`, it runs that plan from the
first iteration. Given a *driver* instead (:class:`dpcomm.train.online.OnlinePlanner` plans a planner name
on the workers), it asks the driver which plan to run, and in which :class:`~dpcomm.runtime.records.Phase`,
at three points:

1. ``begin(dp)`` after the first forward (the learnable layers and their order are known): the first plan
   (e.g. ``single`` while profiling) and its phase;
2. ``layer_times(f, b)`` after each backward while the phase is ``PROFILE``: that iteration's per-layer
   forward and backward times, seconds (:func:`dpcomm.runtime.spans.layer_times`);
3. ``after_step(dp, record)`` after each ``step()`` until the phase is ``STEADY``: a new ``(plan, phase)`` to
   switch to from the next iteration, or None to keep the current one.

A driver may communicate in ``begin`` and ``after_step`` (every rank calls them at the same point), using the
wrapper's public surface: :attr:`~DataParallel.layer_names`, :attr:`~DataParallel.layer_numels`,
:attr:`~DataParallel.batch_size`, :meth:`~DataParallel.scratch`, :meth:`~DataParallel.allreduce`,
:meth:`~DataParallel.emit`, ``process_group``, ``rank``, ``world_size``, ``root``, ``mode``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dpcomm.plan import Plan
from dpcomm.runtime.records import IterRecord, Phase

if TYPE_CHECKING:
    from dpcomm.runtime.data_parallel import DataParallel

__all__ = ["PlanDriver"]


@runtime_checkable
class PlanDriver(Protocol):
    """Decides a DataParallel's plan while it trains (see the module docstring)."""

    schedule: str
    """What it plans (a planner name), for messages."""

    def begin(self, dp: DataParallel) -> tuple[Plan, Phase]:
        """After the first forward: the first plan to run and its phase."""
        ...

    def layer_times(self, f: list[float], b: list[float]) -> None:
        """One profiled iteration's forward and backward time per layer (forward order), seconds."""
        ...

    def after_step(self, dp: DataParallel, record: IterRecord) -> tuple[Plan, Phase] | None:
        """After a step that was not ``STEADY``: the plan and phase to switch to, or None to keep them."""
        ...
