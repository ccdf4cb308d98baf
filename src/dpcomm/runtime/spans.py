"""Timing of real iterations: the timestamps of the iteration in progress, the kept timeline of spans, and the
per-layer forward/backward times a profiled iteration yields.

Names follow MG-WFBP Section III and Table I: ``t_f^(l)`` and ``t_b^(l)`` per layer, ``t_f``/``t_b`` per
iteration, the exposed (non-overlapped) communication. Clock: ``time.perf_counter()`` seconds inside an
iteration; spans are shifted to the wall clock (``time.time()`` scale) so that ranks line up in a trace.

On a GPU a call returns once its kernels are queued, so the host clock is read after the device has run
them (:func:`dpcomm.timing.now`, a synchronize) where a number must mean device time: the iteration's start
(its first forward) and end (after ``step()``), so ``total_s`` and the trials that compare plans by it are
device times; while profiling, every layer's mark (its forward start, its gradient's arrival), so the
per-layer ``t_f^(l)``, ``t_b^(l)`` are device times too, at the price of a synchronize per layer in those
few iterations; and the end of every communication job (:mod:`dpcomm.runtime.comm_thread`). Outside
profiling the forward/backward split of an iteration is read without synchronizing (a synchronize per
layer would stall the queue), so on a GPU it says when the host queued the work, and ``exposed_comm_s``
runs from the host's end of backward to the device's end of communication (an upper bound: it includes
the device's tail of backward). On the CPU every reading is a plain ``time.perf_counter()``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.runtime.comm_thread import CommJob
from dpcomm.runtime.records import IterRecord, Phase, Span, write_chrome_trace_file
from dpcomm.timing import now as device_now

__all__ = ["IterTimes", "Timeline", "layer_times"]


@dataclass(slots=True)
class IterTimes:
    """Timestamps of the iteration in progress (``time.perf_counter()`` seconds)."""

    t0: float | None = None
    """First forward of the iteration."""
    forward_s: float = 0.0
    backward_s: float = 0.0
    exposed_s: float = 0.0
    """Time the compute thread waited for communication."""
    bwd_start: float | None = None
    bwd_last: float | None = None
    spans: list[Span] = field(default_factory=list)
    pre: dict[int, float] = field(default_factory=dict)
    """Owner index -> first forward pre-hook time (layer timing while profiling)."""
    ready: dict[int, float] = field(default_factory=dict)
    """Layer -> time its last gradient arrived."""
    fwd_start: float = 0.0
    fwd_end: float = 0.0


def layer_times(
    pre: list[float | None], fwd_end: float, ready: list[float | None], bwd_start: float
) -> tuple[list[float], list[float]]:
    """``(f, b)`` per layer (forward order) from one iteration's timestamps, seconds.

    ``pre[l]``: when layer ``l``'s forward started (None: not called); ``ready[l]``: when its last gradient
    arrived; ``bwd_start``: when the gradient of the model's output arrived (backward began). ``f_l`` is the
    time from layer ``l``'s forward start to the next layer's, ``b_l`` the time between layer ``l+1``'s
    gradients being ready and layer ``l``'s (MG-WFBP Table I: t_f^(l), t_b^(l)).
    """
    n = len(pre)
    called = sorted((t, l) for l, t in enumerate(pre) if t is not None)
    f = [0.0] * n
    for k, (t, l) in enumerate(called):
        nxt = called[k + 1][0] if k + 1 < len(called) else fwd_end
        f[l] = max(0.0, nxt - t)
    b = [0.0] * n
    prev = bwd_start
    for l in range(n - 1, -1, -1):
        if ready[l] is not None:
            b[l] = max(0.0, ready[l] - prev)
            prev = max(prev, ready[l])
    return f, b


class Timeline:
    """The compute and communication spans of the last ``keep`` iterations of one rank."""

    def __init__(self, keep: int, device: torch.device | None = None):
        self.wall0 = time.time() - time.perf_counter()
        """Add to a ``perf_counter()`` time to get wall-clock seconds."""
        self.device = device
        """Where the replica computes (None: the CPU): :meth:`now` waits for it."""
        self._kept: deque[list[Span]] = deque(maxlen=max(1, keep))

    def now(self, sync: bool = True) -> float:
        """``perf_counter()`` seconds, after the device ran the work queued so far when ``sync`` (module
        docstring: where a number must be device time)."""
        return device_now(self.device) if sync else time.perf_counter()

    def span(self, it: IterTimes, name: str, row: str, start: float, end: float) -> None:
        """Record ``[start, end]`` (perf_counter seconds) on ``row`` of the iteration in progress."""
        it.spans.append(Span(name=name, row=row, start=start + self.wall0, end=end + self.wall0))

    def comm_jobs(self, it: IterTimes, jobs: list[CommJob]) -> float:
        """Record finished communication jobs on the ``comm`` row; returns their busy time, seconds."""
        busy = 0.0
        for job in jobs:
            busy += job.t_end - job.t_start
            it.spans.append(
                Span(
                    name=job.label,
                    row="comm",
                    start=job.t_start + self.wall0,
                    end=job.t_end + self.wall0,
                    args={"bytes": job.nbytes, "queued": job.t_submit + self.wall0},
                )
            )
        return busy

    def close_backward(self, it: IterTimes) -> bool:
        """Fold the last backward's span into the iteration; True if there was one (its timestamps are
        still set: the caller clears ``bwd_start``, ``bwd_last`` and ``ready``)."""
        if it.bwd_start is None or it.bwd_last is None or it.bwd_last < it.bwd_start:
            return False
        it.backward_s += it.bwd_last - it.bwd_start
        self.span(it, "backward", "compute", it.bwd_start, it.bwd_last)
        return True

    def finish(
        self, it: IterTimes, iteration: int, t_step: float, jobs: list[CommJob], phase: Phase, plan: str
    ) -> IterRecord:
        """The iteration is over at ``step()``'s end, once the device ran its work: its record; its spans are
        kept (the oldest go)."""
        now = self.now()
        self.span(it, "step", "compute", t_step, now)
        comm_s = self.comm_jobs(it, jobs)
        self._kept.append(it.spans)
        return IterRecord(
            iteration=iteration,
            forward_s=it.forward_s,
            backward_s=it.backward_s,
            exposed_comm_s=it.exposed_s,
            step_s=now - t_step,
            total_s=now - (it.t0 if it.t0 is not None else t_step),
            comm_s=comm_s,
            phase=phase,
            plan=plan,
        )

    @property
    def iterations(self) -> list[list[Span]]:
        """Per kept iteration, its spans."""
        return [list(its) for its in self._kept]

    def write_chrome_trace(
        self, path: str | Path, rank: int, world: int, group: Any, gather: bool = True
    ) -> Path | None:
        """Write the kept spans as a Chrome trace: gathered from every rank of ``group`` into one file on
        rank 0 (a collective call; other ranks return None), or ``gather=False``: this rank's alone, in
        ``path`` with ``.rank<r>`` before the suffix when ``world > 1``."""
        spans = [s for its in self._kept for s in its]
        path = Path(path)
        if not gather:
            mine = path.with_name(f"{path.stem}.rank{rank}{path.suffix}") if world > 1 else path
            return write_chrome_trace_file(mine, {rank: spans})
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, spans, group=group)
        if rank != 0:
            return None
        return write_chrome_trace_file(path, dict(enumerate(everyone)))
