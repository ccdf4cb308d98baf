"""The one timed-collective loop (:mod:`dpcomm.timing`). Budget: a group of 3 gloo workers in the launch
tests/test_collectives.py's matrix runs in (seconds); the asynchronous stand-ins sleep about 1 s in all, in
one process (a one-rank gloo group where a barrier is needed)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from dpcomm import timing
from dpcomm.timing import BARRIERS, call_op, rank_input, time_calls

WORK_S = 0.05
"""Seconds each stand-in's work takes after its call returned."""


class _Stream:
    """A stand-in for a backend's stream: work queued on it runs later, in order, on one other thread (as
    NCCL's collectives run on its CUDA stream, gloo's on its worker threads)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1)
        self.finished = 0

    def enqueue(self, seconds: float):
        def work() -> None:
            threading.Event().wait(seconds)
            self.finished += 1

        return self._pool.submit(work)

    def drain(self) -> None:
        self._pool.submit(lambda: None).result()

    def close(self) -> None:
        self._pool.shutdown()


class _Work:
    """What ``dist.all_reduce(..., async_op=True)`` returns: ``wait()`` blocks until the work is done."""

    def __init__(self, fut):
        self._fut = fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def wait(self, timeout=None) -> bool:
        self._fut.result()
        return True


def _torch_future(stream: _Stream, seconds: float) -> torch.futures.Future:
    """A ``torch.futures.Future`` (what ``Work.get_future()`` and DDP's comm hooks return) completed there."""
    fut: torch.futures.Future = torch.futures.Future()
    stream.enqueue(seconds).add_done_callback(lambda _f: fut.set_result(None))
    return fut


@pytest.fixture
def stream():
    s = _Stream()
    yield s
    s.close()


def test_an_asynchronous_call_is_timed_until_its_work_is_done(stream):
    # the call returns at once with a handle, as an async_op=True collective does; its work takes WORK_S on
    # another thread. The old loop read the clock when the call returned and saw about 0 s.
    times = time_calls(lambda: _Work(stream.enqueue(WORK_S)), 3, barrier="none")
    assert stream.finished == 3 and all(t >= WORK_S for t in times), times
    # torch futures, and a list of handles (a bucket's collectives started together), are waited for too
    times = time_calls(
        lambda: [_torch_future(stream, WORK_S), _Work(stream.enqueue(WORK_S))], 2, barrier="none"
    )
    assert stream.finished == 7 and all(t >= 2 * WORK_S for t in times), times


def test_the_barrier_modes_count_every_calls_work(stream, one_rank):
    # back to back ("once"): the loop ends when the last call's work is done, so the mean covers all of it
    times = time_calls(lambda: _Work(stream.enqueue(WORK_S)), 4, barrier="once")
    assert stream.finished == 4 and times == [times[0]] * 4 and times[0] >= WORK_S, times
    times = time_calls(lambda: _Work(stream.enqueue(WORK_S)), 2, barrier="each")
    assert stream.finished == 6 and all(t >= WORK_S for t in times), times


def test_work_queued_on_the_device_is_timed_until_the_device_is_synchronized(stream, monkeypatch):
    # a GPU call returns None once its kernels are queued (NCCL's blocking all_reduce included): only a
    # device synchronize sees the end. torch.cuda.synchronize is replaced by draining the stand-in stream.
    synced = []

    def fake_synchronize(device=None):
        synced.append(torch.device(device))
        stream.drain()

    monkeypatch.setattr(torch.cuda, "synchronize", fake_synchronize)
    stream.enqueue(0.3)  # queued before the loop (an input's copy): drained before the clock starts
    times = time_calls(lambda: stream.enqueue(WORK_S) and None, 2, barrier="none", device="cuda:0")
    assert stream.finished == 3 and all(WORK_S <= t < 0.3 for t in times), times
    assert synced == [torch.device("cuda:0")] * 4  # before and after each call
    synced.clear()
    assert time_calls(lambda: None, 1, barrier="none", device="cpu") and synced == []  # the CPU: no sync


def test_the_allreduce_cost_measurement_counts_asynchronous_work(stream, one_rank):
    from dpcomm.planner.autoplan import measure_allreduce

    def allreduce(t):  # seconds grow with the bytes, as a collective's do
        return _Work(stream.enqueue(WORK_S * t.numel() / 64))

    points = measure_allreduce(allreduce, torch.zeros(64), None, reps=1)
    assert [b for b, _ in points] == [4, 16, 64, 256]
    assert points[-1][1] >= WORK_S and points[0][1] >= WORK_S / 64, points


def test_wait_synchronize_now_and_the_groups_device(one_rank):
    timing.wait(None)
    timing.wait(torch.ones(2))  # a tensor is a result, not a handle
    timing.synchronize(None)
    timing.synchronize("cpu")
    a = timing.now()
    assert timing.now("cpu") >= a
    assert timing.group_device() == torch.device("cpu")  # gloo
    assert rank_input(3, 1, torch.float32, "cpu").device == torch.device("cpu")


class _Recorder:
    def __init__(self):
        self.calls = []

    def allreduce(self, t, *, group=None):
        self.calls.append(("allreduce", None))

    def broadcast(self, t, *, root=0, group=None):
        self.calls.append(("broadcast", root))

    def reduce(self, t, *, root=0, group=None):
        self.calls.append(("reduce", root))


def test_call_op_dispatches_and_rejects_unknown_ops():
    rec = _Recorder()
    for op in ("allreduce", "broadcast", "reduce"):
        call_op(rec, op, rank_input(3, 0), root=2)
    assert rec.calls == [("allreduce", None), ("broadcast", 2), ("reduce", 2)]
    with pytest.raises(ValueError, match="op must be one of"):
        call_op(rec, "gather", rank_input(3, 0))


def test_time_calls_without_a_barrier_and_bad_options():
    seen = []
    times = time_calls(lambda: seen.append(1), 4, barrier="none")
    assert len(times) == 4 and len(seen) == 4 and all(t >= 0 for t in times)
    with pytest.raises(ValueError, match="barrier"):
        time_calls(lambda: None, 1, barrier="sometimes")
    with pytest.raises(ValueError, match="iters"):
        time_calls(lambda: None, 0)
    assert BARRIERS == ("each", "once", "none")


def test_rank_input_sums_exactly():
    import torch

    for dtype in (torch.bfloat16, torch.float16, torch.int32):
        total = sum(rank_input(10, r, dtype).double() for r in range(8))
        assert torch.equal(total, sum(rank_input(10, r, torch.float64) for r in range(8)))


@pytest.mark.slow
def test_every_rank_gets_the_slowest_ranks_time_per_size():
    from tests import _collective_workers

    sizes = _collective_workers.TIMING_SIZES  # 4, 4096 and 65,536 elements
    # on a group of 3 ranks of the launch tests/test_collectives.py's matrix runs in
    out = [r["timing"] for r in _collective_workers.shared_launch() if "timing" in r]
    assert len(out) == 3 and all(o == out[0] for o in out)  # one answer, the same on every rank
    for key, secs in out[0].items():
        assert len(secs) == len(sizes) and all(0 < s < 5 for s in secs), key


class _Queue(torch.nn.Module):
    """No parameters: its forward queues WORK_S of "kernels" on the stand-in stream and returns at once."""

    def __init__(self, stream: _Stream):
        super().__init__()
        self.stream = stream

    def forward(self, x):
        self.stream.enqueue(WORK_S)
        return x


def test_the_runtimes_times_wait_for_the_device(stream, one_rank, monkeypatch):
    # dpcomm.DataParallel on a "GPU" whose forward only queues work: the profiled layer times and the
    # iteration's total_s (what the trial compares plans by) must count the queued work. The device is the
    # stand-in stream: torch.cuda.synchronize drains it, and the wrapper is told its device is cuda:0.
    from dpcomm.train.online import DataParallel

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: stream.drain())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _Queue(stream), torch.nn.Linear(4, 1))
    dp = DataParallel(model, plan="mgwfbp", profile_iters=1, verify_iters=0)
    cuda = torch.device("cuda:0")
    dp._timeline.device = dp._sync_grads.comm.device = cuda
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for _ in range(2):  # one profiled iteration, then the plan's
            dp(torch.ones(2, 4)).sum().backward()
            dp.step(opt)
    finally:
        dp.close()
    f = [layer.forward_s for layer in dp.trace.layers]
    assert f[0] >= WORK_S > f[1], f  # the first Linear's forward runs until the next layer's start
    assert [r.phase.name for r in dp.records] == ["PROFILE", "STEADY"]
    assert all(r.total_s >= WORK_S for r in dp.records), dp.records
    assert stream.finished == 2


def test_a_communication_job_ends_when_its_device_work_has_run(stream, monkeypatch):
    from dpcomm.runtime.comm_thread import CommThread

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: stream.drain())
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    comm = CommThread(device=torch.device("cuda:0"))
    try:
        job = comm.submit("queued all-reduce", lambda: stream.enqueue(WORK_S) and None, 4)
        job.wait(10)
    finally:
        comm.close()
    assert job.error is None and job.t_end - job.t_start >= WORK_S


def test_the_parameter_servers_iteration_times_wait_for_the_device(stream, one_rank, monkeypatch):
    # one co-located worker and server; its model's forward only queues work on the stand-in "GPU"
    from dpcomm.ps.rank import PsRank
    from dpcomm.ps.spec import PsSpec

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: stream.drain())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _Queue(stream), torch.nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.ones(2, 4), torch.tensor([0, 2])
    ps = PsRank(model, opt, PsSpec(pull="all"), rank=0, workers=1, sample=x, stop=1)
    ps.device = torch.device("cuda:0")
    try:
        ps.iteration(x, y)
        ps.finish()
    finally:
        ps.close()
    rec = ps.records[-1]
    assert rec["forward_s"] >= WORK_S and rec["total_s"] >= WORK_S, rec
