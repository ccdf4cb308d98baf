"""The communication thread and its queue: MG-WFBP Algorithm 2, ``ASYNCHANDLECOMMUNICATION`` (lines 22-30).

Backward (the compute thread) pushes work onto a FIFO queue as gradients become ready; one communication
thread pops and runs each job to completion, in order, so collectives are issued in the same order on every
rank and overlap with the backward computation still running in the compute thread. The compute thread waits
for jobs before the optimizer step (the paper's ``WaitForLastCommunicationFinished``).

A job that raises (a peer died, a collective timed out) breaks the thread: that job and every later one fail
with :class:`CommFailure`, which the compute thread sees the next time it waits, instead of hanging.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

__all__ = ["CommFailure", "CommJob", "CommThread"]


class CommFailure(RuntimeError):
    """A collective of the runtime failed (peer gone, timeout); one line naming the job and the cause."""


class CommJob:
    """One unit of communication: ``fn()`` run on the communication thread; ``wait()`` blocks until done."""

    __slots__ = ("label", "nbytes", "fn", "t_submit", "t_start", "t_end", "error", "_done")

    def __init__(self, label: str, fn: Callable[[], None], nbytes: int = 0):
        self.label = label
        self.nbytes = nbytes
        self.fn = fn
        self.t_submit = time.perf_counter()  # seconds; when the compute thread queued it
        self.t_start = 0.0  # time.perf_counter() when it started, seconds
        self.t_end = 0.0
        self.error: BaseException | None = None
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the job ran; raise :class:`CommFailure` if it (or an earlier job) failed."""
        if not self._done.wait(timeout_s):
            raise CommFailure(f"{self.label}: not finished after {timeout_s:g} s (a peer may be hung)")
        if self.error is not None:
            raise CommFailure(f"{self.label} failed: {_one_line(self.error)}") from self.error


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else text}"


class CommThread:
    """A daemon thread running :class:`CommJob` s one at a time, in submission order."""

    def __init__(self, name: str = "dpcomm-comm"):
        self._queue: queue.SimpleQueue[CommJob | None] = queue.SimpleQueue()
        self._broken: BaseException | None = None
        self._last: CommJob | None = None
        self.finished: list[CommJob] = []
        """Jobs finished since :meth:`take_finished` was last called (for timing records)."""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, label: str, fn: Callable[[], None], nbytes: int = 0) -> CommJob:
        """Queue ``fn`` (MG-WFBP Alg. 2 line 21, ``Q.push``); returns its job to wait on."""
        job = CommJob(label, fn, nbytes)
        self._last = job
        self._queue.put(job)
        return job

    def wait_all(self, timeout_s: float | None = None) -> None:
        """Wait for every job submitted so far (jobs run in order, so the last one suffices)."""
        if self._last is not None:
            self._last.wait(timeout_s)

    def take_finished(self) -> list[CommJob]:
        with self._lock:
            out, self.finished = self.finished, []
        return out

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after the jobs already queued (FIFO) have run, and wait for that, so no job writes ``.grad``
        or calls a collective after ``close()`` returns (e.g. racing a ``destroy_process_group``). A job stuck
        on a dead peer ends by the process group's own timeout; ``timeout_s`` bounds the wait regardless."""
        if self._thread.is_alive():
            self._queue.put(None)
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout_s)

    def _run(self) -> None:
        import torch

        # Jobs write parameters in place (broadcasts); grad mode is per thread, so turn it off here.
        torch.set_grad_enabled(False)
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.t_start = time.perf_counter()
            if self._broken is not None:
                job.error = self._broken
            else:
                try:
                    job.fn()
                except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
                    job.error = self._broken = exc
            job.t_end = time.perf_counter()
            job.fn = None  # drop references to buffers
            with self._lock:
                self.finished.append(job)
            job._done.set()
