"""A span: one interval on one row of an iteration's timeline, simulated or measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ROWS", "Span"]

ROWS = ("compute", "comm")
"""The two rows of an S-SGD timeline (MG-WFBP Fig. 2): computation, and communication beside it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One interval on a row of the timeline; times in seconds (simulated: from the iteration's start;
    measured: wall clock, ``time.time()`` scale)."""

    name: str
    row: str
    """``compute`` or ``comm``."""
    start: float
    end: float
    args: dict[str, Any] = field(default_factory=dict)
    """Free-form details (layer indices, bytes); the Chrome trace shows them."""
    cat: str = ""
    """Category: ``forward``, ``backward``, ``step``, ``comm`` ... ('' : from the name)."""

    @property
    def kind(self) -> str:
        """``cat``, else the name's first word (``forward``, ``backward``, ``step``, ``allreduce``)."""
        return self.cat or self.name.split(" ", 1)[0]
