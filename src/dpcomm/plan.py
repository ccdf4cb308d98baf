"""A communication plan: plain data that the planners make and the simulator and the runtime both read.

A plan partitions the learnable layers ``0..L-1`` (forward order) into groups that are contiguous in layer
order. ``groups`` is in *communication order*: the group holding layer ``L-1`` (ready first in backward)
comes first, and the layers inside a group are listed in ascending order. Each group is one all-reduce of
the concatenated gradients of its layers (MG-WFBP: a "merged-gradient" group), or, for a ``dear`` plan, one
reduce-scatter in backward and one all-gather of its parameters in the next forward.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Plan", "SHARDED_SCHEDULES"]

SHARDED_SCHEDULES = frozenset({"dear"})
"""Plans whose groups are reduce-scattered in backward and all-gathered in the next forward (DeAR,
:mod:`dpcomm.planner.dear`) instead of all-reduced."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Groups of learnable layers, each all-reduced as one message, in communication order."""

    schedule: str
    """The planner that made it (``wfbp``, ``single``, ``bucket:25MB``, ``mgwfbp``, ``optimal``)."""
    num_layers: int
    """L, the number of learnable layers of the model."""
    groups: tuple[tuple[int, ...], ...]
    """Layer indices per group, communication order (see module docstring)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form facts about how it was made (nodes, cost, planning time); not part of the plan's identity."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(tuple(int(i) for i in g) for g in self.groups))
        expect = self.num_layers - 1
        for g in self.groups:
            if not g:
                raise ValueError("a plan group cannot be empty")
            if list(g) != list(range(g[0], g[0] + len(g))):
                raise ValueError(f"plan group {list(g)} is not a contiguous ascending run of layers")
            if g[-1] != expect:
                raise ValueError(f"plan groups must cover layers {self.num_layers - 1}..0 in backward order")
            expect = g[0] - 1
        if expect != -1:
            raise ValueError(f"plan groups must cover all {self.num_layers} layers")

    @property
    def sharded(self) -> bool:
        """Whether the groups are reduce-scattered and all-gathered (:data:`SHARDED_SCHEDULES`)."""
        return self.schedule in SHARDED_SCHEDULES

    def to_dict(self) -> dict[str, Any]:
        groups = [list(g) for g in self.groups]
        return {"schedule": self.schedule, "num_layers": self.num_layers, "groups": groups}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Plan:
        return cls(schedule=obj["schedule"], num_layers=obj["num_layers"], groups=obj["groups"])

    @classmethod
    def from_sizes(cls, schedule: str, sizes_backward: list[int], num_layers: int, **meta: Any) -> Plan:
        """Build from group sizes listed in communication order (``[3, 1]`` on L=4: groups (1,2,3), (0,))."""
        groups, top = [], num_layers
        for n in sizes_backward:
            groups.append(tuple(range(top - n, top)))
            top -= n
        return cls(schedule=schedule, num_layers=num_layers, groups=tuple(groups), meta=dict(meta))

    def sha256(self) -> str:
        """Identity of the plan (schedule and groups) for cross-rank agreement checks."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()
