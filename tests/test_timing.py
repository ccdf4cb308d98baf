"""The one timed-collective loop (:mod:`dpcomm.timing`). Budget: one launch of 3 gloo workers (seconds)."""

import pytest

from dpcomm.timing import BARRIERS, call_op, rank_input, time_calls


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
    from dpcomm.launch import launch
    from tests import _collective_workers

    sizes = [4, 4096, 1 << 16]
    out = launch(_collective_workers.timing, 3, sizes)
    assert all(o == out[0] for o in out)  # one answer, the same on every rank
    for key, secs in out[0].items():
        assert len(secs) == len(sizes) and all(0 < s < 5 for s in secs), key
