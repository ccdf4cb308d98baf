"""A planner schedule parsed once: the name and (for ``bucket``) the size, ready to plan a trace.

``PlannerSchedule.parse("bucket:25MB")`` checks the text with the planners' own rules (a one-line
:class:`~dpcomm.errors.UserError` naming the choices) and keeps what it found, so planning later on the
workers does not parse it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.trace.format import Trace

__all__ = ["PlannerSchedule"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerSchedule:
    """One planner schedule: ``wfbp``, ``single``, ``bucket:SIZE``, ``bucket:auto``, ``mgwfbp`` or
    ``optimal``."""

    text: str
    """As written (the plan's label: ``bucket:25MB``)."""
    name: str
    """The planner (``bucket`` for ``bucket:25MB``)."""
    size_bytes: int | None = None
    """``bucket``'s threshold, bytes (None for ``bucket:auto``: the planner finds it)."""

    @classmethod
    def parse(cls, text: str) -> PlannerSchedule:
        """Check and parse one schedule; several (``wfbp,single``) or an unknown one is a UserError."""
        from dpcomm.planner import parse_bucket_size, parse_schedules

        names = parse_schedules(text)
        if len(names) != 1:
            raise UserError(f"one schedule per run, got {text!r}")
        name, sep, arg = names[0].partition(":")
        name = name.strip().lower()
        auto = arg.strip().lower() == "auto"  # bucket:auto, the best single size: found when planned
        return cls(
            text=names[0], name=name, size_bytes=parse_bucket_size(arg.strip()) if sep and not auto else None
        )

    def plan(self, trace: Trace, cost: CommCost, nodes: int) -> Plan:
        """The planner's plan of ``trace`` on ``nodes`` workers with the all-reduce ``cost``."""
        from dpcomm.planner import SCHEDULES, plan_bucket

        if self.name == "bucket" and self.size_bytes is None:
            from dpcomm.planner.bucket_auto import plan_bucket_auto

            return plan_bucket_auto(trace, cost, nodes)
        if self.name == "bucket":
            arg = self.text.partition(":")[2].strip()
            return plan_bucket(trace, cost, nodes, size_bytes=self.size_bytes, name=f"bucket:{arg}")
        return SCHEDULES[self.name](trace, cost, nodes)
