"""dpcomm collectives as DDP comm hooks: exact against DDP's own all-reduce on groups of 2 and 4 gloo workers.

Gradients are integer-valued (integer weights and inputs, loss = sum of outputs) and the group size is a
power of two, so the average (divide, then sum, as DDP does) is exact in float32 whatever the summation order:
any difference is a wrong sum, not rounding. Each collective runs inline in the hook, on the hook state's
thread, and inside PyTorch's ``fp16_compress_wrapper`` (composition with DDP's own wrappers).

One launch of 4 workers (starting workers costs more than the cases): every case on the whole world (the
default group), then on two groups of 2 at once (ranks 0-1 and 2-3; the group is DDP's and the hook state's).
"""

from __future__ import annotations

import pytest

from dpcomm.collectives import names
from dpcomm.errors import UserError
from dpcomm.launch import launch
from tests import _ddp_hook_workers as W

COLLECTIVES = [n for n in names() if n != "noop"]
MODES = W.MODES


def _algos(p: int) -> list[str]:
    return [n for n in COLLECTIVES if n != "bcube" or p == 4]  # BCube(n, k) needs P = n^k with k >= 2


@pytest.fixture(scope="module")
def launched():
    return launch(W.hook_cases, 4, {p: _algos(p) for p in (2, 4)})


@pytest.fixture(params=[2, 4], ids=lambda p: f"P{p}")
def results(request, launched):
    p = request.param
    return p, [res[p] for res in launched]


@pytest.mark.slow
def test_collective_hook_is_exact_against_ddp(results):
    p, out = results
    if p == 2:  # ranks 0-1 and 2-3: two groups of 2
        assert [res["group"] for res in out] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    for name in _algos(p):  # every collective the workers ran on this P (bcube on 4)
        for rank, res in enumerate(out):
            assert res["plan"] == [[2], [1], [0]]  # wfbp: one bucket per layer, last layer first
            for mode in MODES:
                r = res[f"{name}/{mode}"]
                assert "error" not in r, f"rank {rank} {name}/{mode}: {r.get('error')}"
                assert r["scale"] >= 1.0  # the gradients are not all zero
                assert r["calls"] >= 4  # two iterations of three buckets (the first may cut differently)
                assert r["diff"] == 0.0, f"rank {rank} {name}/{mode}: differs by {r['diff']}"


def test_unknown_collective_is_a_user_error():
    from dpcomm.ddp import collective_hook

    with pytest.raises(UserError, match="unknown collective"):
        collective_hook("nope")
