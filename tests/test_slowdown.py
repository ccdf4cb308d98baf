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


def _overlap_case():
    from dpcomm.costmodel.base import LinearCost

    trace = _trace()  # 4 layers, backward 2 ms each, 400 bytes in all
    return trace, LinearCost(1e-3, 1e-5)  # 1 ms + 10 us a byte: comm is comparable to backward


def test_overlap_slowed_is_the_simulator_without_a_cost_and_charges_only_bytes_in_flight():
    from dpcomm.sim import simulate
    from dpcomm.sim.slowdown import overlap_slowed

    trace, cost = _overlap_case()
    wfbp = Plan(schedule="wfbp", num_layers=4, groups=((3,), (2,), (1,), (0,)))
    single = Plan(schedule="single", num_layers=4, groups=((0, 1, 2, 3),))
    for plan in (wfbp, single):
        assert overlap_slowed(trace, plan, cost, 2, 0.0).t_iter_s == pytest.approx(
            simulate(trace, plan, cost, 2).t_iter_s, rel=1e-12
        )
    # one group, sent when backward ends: nothing is in flight beside backward, so nothing is charged
    assert overlap_slowed(trace, single, cost, 2, 1e-4).t_iter_s == pytest.approx(
        simulate(trace, single, cost, 2).t_iter_s, rel=1e-12
    )
    # wfbp: the first groups' bytes go while layers 2..0 compute; backward grows by the charged bytes only
    base = simulate(trace, wfbp, cost, 2)
    slow = overlap_slowed(trace, wfbp, cost, 2, 1e-5)
    assert slow.t_b_s > base.t_b_s
    assert slow.t_b_s - base.t_b_s <= 1e-5 * (160 + 120 + 80) + 1e-12  # layers 3..1's bytes, not layer 0's
    assert slow.t_iter_s > base.t_iter_s


@pytest.mark.slow  # a process group in this process and timed training passes: not a pure function
def test_probe_slowdown_leaves_the_model_and_random_state_as_they_were():
    import torch
    import torch.distributed as dist
    from torch import nn

    from dpcomm.costmodel.base import LinearCost
    from dpcomm.ddp.overlap_probe import probe_slowdown

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.Dropout(0.5), nn.ReLU(), nn.Linear(512, 64))
    x = torch.randn(32, 64)
    before = [p.detach().clone() for p in model.parameters()]
    model[0].weight.grad = torch.ones_like(model[0].weight)  # a gradient the caller accumulated
    rng = torch.get_rng_state()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        nbytes = sum(p.numel() for p in model.parameters()) * 4
        slow = probe_slowdown(model, x, LinearCost(0.0, 1e-12), nbytes, reps=2)
        assert slow is not None and slow.per_byte_s >= 0.0 and slow.runs == 2 and slow.per_msg_s == 0.0
        assert probe_slowdown(model, x, LinearCost(10.0, 1e-12), nbytes) is None  # no room: 8 x 10 s
    finally:
        dist.destroy_process_group()
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert all(p.grad is None for p in list(model.parameters())[1:])
