"""Per-iteration timing records of the runtime; their spans and Chrome trace are :mod:`dpcomm.timeline`'s.

Names follow MG-WFBP Section III: ``t_f`` (forward), ``t_b`` (backward), and the *exposed* (non-overlapped)
communication ``t_c^no``, the part of communication the compute thread waits for; ``t_iter`` = total.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from dpcomm.timeline import Span, chrome_trace_events, write_chrome_trace_file

__all__ = ["IterRecord", "Phase", "Span", "chrome_trace_events", "write_chrome_trace_file"]


class Phase(StrEnum):
    """What an iteration was for: measuring before a plan exists, timing candidate plans, or training."""

    PROFILE = "profile"
    """A safe plan runs while every layer is timed (MG-WFBP Alg. 1 lines 1-7, "benchmarks")."""
    TRIAL = "trial"
    """One of several candidate plans runs, timed against the others."""
    STEADY = "steady"
    """The kept plan runs (what the reported medians are taken over)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IterRecord:
    """What one synchronous iteration (forward(s), backward(s), step) cost on this rank, seconds."""

    iteration: int
    """Count of ``step()`` calls before this one (0-based)."""
    forward_s: float
    """Forward time (summed over micro-batches under ``no_sync``)."""
    backward_s: float
    """Backward time, from the output's gradient to the last parameter gradient."""
    exposed_comm_s: float
    """Time the compute thread waited for communication (not hidden behind compute)."""
    step_s: float
    """Time inside ``step()``: waiting for communication, optimizer step, and the mode's broadcasts."""
    total_s: float
    """From the first forward after the previous step to the end of this step."""
    comm_s: float
    """Busy time of the communication thread in this iteration (overlapped or not)."""
    phase: Phase
    """What the iteration was for (profiling, a timed candidate, or the kept plan)."""
    plan: str
    """Label (``Plan.schedule``) of the plan the iteration ran: ``single`` while profiling, the candidate's
    label in a trial."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
