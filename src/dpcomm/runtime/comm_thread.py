"""The communication thread and its queue: MG-WFBP Algorithm 2, ``ASYNCHANDLECOMMUNICATION`` (lines 22-30).

Backward (the compute thread) pushes work onto a FIFO queue as gradients become ready; one communication
thread pops and runs each job to completion, in order, so collectives are issued in the same order on every
rank and overlap with the backward computation still running in the compute thread. The compute thread waits
for jobs before the optimizer step (the paper's ``WaitForLastCommunicationFinished``).

A job that raises (a peer died, a collective timed out) breaks the thread: that job and every later one fail
with :class:`CommFailure`, which the compute thread sees the next time it waits, instead of hanging.

A collective whose backend has its own progress threads (``native``: gloo and NCCL run asynchronous work)
needs no Python thread: :meth:`CommThread.start_async` records a job whose communication was already started
with ``async_op=True`` on the compute thread, as DDP's reducer does; waiting for it waits for the backend's
work handles and then runs the job's ``finish`` (e.g. writing averaged gradients back) on the waiting thread.
This keeps the Python thread, its queue hand-off and its share of the GIL out of backward's way.

On a GPU a job's collectives return once queued (NCCL) or once their copies are queued (gloo on CUDA
tensors), so a job ends (``t_end``) when its ``device`` has run what it queued (:func:`dpcomm.timing.now`);
an asynchronous job's end is read after its works are waited for and the device synchronized.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from dpcomm.errors import first_line
from dpcomm.timing import now, synchronize

__all__ = ["CommFailure", "CommJob", "CommThread"]


class CommFailure(RuntimeError):
    """A collective of the runtime failed (peer gone, timeout); one line naming the job and the cause."""


class CommJob:
    """One unit of communication: ``fn()`` run on the communication thread; ``wait()`` blocks until done."""

    __slots__ = (
        "label", "nbytes", "fn", "t_submit", "t_start", "t_end", "error", "_done", "works", "finish",
        "device",
    )  # fmt: skip

    def __init__(self, label: str, fn: Callable[[], None] | None, nbytes: int = 0):
        self.label = label
        self.nbytes = nbytes
        self.fn = fn
        self.t_submit = time.perf_counter()  # seconds; when the compute thread queued it
        self.t_start = 0.0  # time.perf_counter() when it started, seconds
        self.t_end = 0.0
        self.error: BaseException | None = None
        self._done = threading.Event()
        self.works: list[Any] | None = None
        """Backend work handles of a job started with :meth:`CommThread.start_async` (None: a thread job)."""
        self.finish: Callable[[], None] | None = None
        self.device: Any = None
        """Where the job's work runs (None: the CPU); its end is read once that device is done."""

    def done(self) -> bool:
        if self.works is not None and not self._done.is_set():
            return all(w.is_completed() for w in self.works)
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the job ran; raise :class:`CommFailure` if it (or an earlier job) failed."""
        if self.works is not None and not self._done.is_set():
            self._wait_works(timeout_s)
        if not self._done.wait(timeout_s):
            raise CommFailure(f"{self.label}: not finished after {timeout_s:g} s (a peer may be hung)")
        if self.error is not None:
            raise CommFailure(
                f"{self.label} failed: {first_line(self.error, with_type=True)}"
            ) from self.error

    def _wait_works(self, timeout_s: float | None) -> None:
        """An asynchronous job: wait for the backend, then run ``finish`` here (the waiting thread)."""
        try:
            for w in self.works:
                if timeout_s is None:
                    w.wait()
                elif not w.wait(datetime.timedelta(seconds=timeout_s)):
                    raise TimeoutError(f"not finished after {timeout_s:g} s (a peer may be hung)")
            self.t_end = max(self.t_end, self.t_start)  # stamped by the backend's completion callbacks
            if getattr(self.device, "type", "cpu") == "cuda":  # the callbacks fire once the work is queued
                self.t_end = now(self.device)
            if self.finish is not None:
                self.finish()
        except BaseException as exc:  # noqa: BLE001 - reported as CommFailure below
            self.error = exc
            self.t_end = time.perf_counter()
        self.works, self.finish = [], None
        self._done.set()


class CommThread:
    """A daemon thread running :class:`CommJob` s one at a time, in submission order."""

    def __init__(self, name: str = "dpcomm-comm", device: Any = None):
        self.device = device
        """Where the jobs' work runs (a ``torch.device``; None: the CPU)."""
        self._queue: queue.SimpleQueue[CommJob | None] = queue.SimpleQueue()
        self._broken: BaseException | None = None
        self._last: CommJob | None = None
        self._async: list[CommJob] = []
        self.finished: list[CommJob] = []
        """Jobs finished since :meth:`take_finished` was last called (for timing records)."""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, label: str, fn: Callable[[], None], nbytes: int = 0) -> CommJob:
        """Queue ``fn`` (MG-WFBP Alg. 2 line 21, ``Q.push``); returns its job to wait on."""
        job = CommJob(label, fn, nbytes)
        job.device = self.device
        self._last = job
        self._queue.put(job)
        return job

    def start_async(
        self, label: str, works: list[Any], nbytes: int, finish: Callable[[], None] | None, t_start: float
    ) -> CommJob:
        """Record a job already running on the backend's own threads (``works``: torch.distributed work
        handles of ``async_op=True`` calls started at ``t_start``); ``finish`` runs on the waiting thread."""
        job = CommJob(label, None, nbytes)
        job.t_start, job.device = t_start, self.device
        job.works, job.finish = works, finish

        def stamp(_fut: Any, job: CommJob = job) -> None:
            job.t_end = max(job.t_end, time.perf_counter())

        for w in works:
            w.get_future().add_done_callback(stamp)
        self._async.append(job)
        return job

    def wait_all(self, timeout_s: float | None = None) -> None:
        """Wait for every job submitted so far (thread jobs run in order, so the last one suffices; then the
        asynchronous ones, in the order they were started)."""
        if self._last is not None:
            self._last.wait(timeout_s)
        jobs, self._async = self._async, []
        for job in jobs:  # the first failure raises; the later jobs are dropped with it
            job.wait(timeout_s)
            with self._lock:
                self.finished.append(job)

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
        if getattr(self.device, "type", "cpu") == "cuda":  # the current device is per thread too
            torch.cuda.set_device(self.device)
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
                    synchronize(self.device)  # on a GPU: the job's queued work has run
                except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
                    job.error = self._broken = exc
            job.t_end = time.perf_counter()
            job.fn = None  # drop references to buffers
            with self._lock:
                self.finished.append(job)
            job._done.set()
