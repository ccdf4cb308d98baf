"""The fitted slowdown of backward by communication (dpcomm.sim.slowdown): recovered from exact data, and
added where each group is issued."""

import pytest

from dpcomm.plan import Plan
from dpcomm.sim.slowdown import fit_slowdown, slowed_trace
from dpcomm.trace.format import Layer, Trace


def _trace():
    layers = [
        Layer(name=f"l{i}", params=p, forward_s=0.001, backward_s=0.002)
        for i, p in enumerate((10, 20, 30, 40))
    ]
    return Trace(model="toy", batch_size=1, device="cpu", dtype_bytes=4, layers=layers)


def test_fit_recovers_the_per_message_and_per_byte_terms():
    s_msg, s_byte, M = 0.5e-3, 2e-9, 400_000
    runs = [(g, M, s_msg * g + s_byte * M) for g in (1, 4, 9, 39)]
    fit = fit_slowdown(runs)
    assert fit.per_msg_s == pytest.approx(s_msg, rel=1e-9) and fit.per_byte_s == pytest.approx(
        s_byte, rel=1e-9
    )
    assert fit_slowdown(runs[:1]) is None  # one plan shape: nothing separates the terms
    assert fit_slowdown([(1, M, 0.0), (2, M + 1, 0.0)]) is None  # different models' bytes are not pooled


def test_slowed_trace_charges_each_group_to_the_layer_that_issues_it():
    trace = _trace()
    plan = Plan(schedule="x", num_layers=4, groups=((2, 3), (0, 1)))
    fit = fit_slowdown([(1, 400, 1e-3 + 400e-6), (2, 400, 2e-3 + 400e-6)])  # 1 ms a message, 1 us a byte
    slow = slowed_trace(trace, plan, fit)
    extra = [round(b.backward_s - a.backward_s, 9) for a, b in zip(trace.layers, slow.layers, strict=True)]
    # group (2, 3): 70 params x 4 bytes at layer 2; group (0, 1): 30 x 4 at layer 0
    assert extra == [round(1e-3 + 120e-6, 9), 0.0, round(1e-3 + 280e-6, 9), 0.0]
    assert slow.t_f == trace.t_f
