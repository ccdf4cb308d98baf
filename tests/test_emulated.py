"""The emulated model (``dpcomm.trace.emulated``): the trace's layers and sizes, its times, checked against
the profiler (the reference that measures every real model)."""

import time

import pytest
import torch

from dpcomm.errors import UserError
from dpcomm.models import layer_params, learnable_layers
from dpcomm.trace import emulated, find_trace
from dpcomm.trace.emulated import emulated_model
from dpcomm.trace.format import Layer, Trace, save_trace
from dpcomm.trace.profiler import profile


def _trace() -> Trace:
    sizes, fwd, bwd = [30, 0, 500, 7], [0.002, 0.001, 0.004, 0.003], [0.003, 0.002, 0.006, 0.001]
    layers = [
        Layer(name=f"l{i}", params=p, forward_s=f, backward_s=b)
        for i, (p, f, b) in enumerate(zip(sizes, fwd, bwd, strict=True))
    ]
    return Trace(model="toy", batch_size=4, device="cpu", dtype_bytes=4, layers=tuple(layers))


def test_one_learnable_layer_per_trace_layer_with_its_parameters():
    shipped = find_trace("resnet20-cpu-b32")
    model = emulated_model("emulated:resnet20-cpu-b32", num_classes=7)
    layers = learnable_layers(model, torch.zeros(2, 1))
    assert len(layers) == len(shipped.layers) == 39
    sizes = [sum(p.numel() for p in ps) for ps in layer_params(model, layers)]
    assert sizes == [max(1, l.params) for l in shipped.layers]
    assert sum(sizes) == 269_722  # ResNet-20's parameters travel as they would
    out = model(torch.zeros(5, 3, 32, 32))  # any input: only its batch size is read
    assert out.shape == (5, 7) and out.requires_grad


def test_a_trace_file_and_errors(tmp_path):
    path = save_trace(_trace(), tmp_path / "toy.json")
    model = emulated_model(str(path))
    assert [l.weight.numel() for l in model.layers] == [30, 1, 500, 7]  # a layer of 0 keeps one element
    with pytest.raises(UserError, match="no such trace"):
        emulated_model("emulated:nope-cpu-b1")


def test_backward_gives_every_parameter_a_zero_gradient_in_reverse_order():
    model = emulated_model(_trace())
    seen = []
    for i, layer in enumerate(model.layers):
        layer.weight.register_post_accumulate_grad_hook(lambda _p, i=i: seen.append(i))
    torch.nn.functional.cross_entropy(model(torch.zeros(3, 1)), torch.tensor([0, 1, 2])).backward()
    assert seen == [3, 2, 1, 0]  # as backward produces them: pushes go out on the trace's timeline
    assert all(torch.equal(l.weight.grad, torch.zeros_like(l.weight)) for l in model.layers)


def test_the_profiler_measures_the_trace_it_was_built_from():
    trace = _trace()
    got = profile(emulated_model(trace), torch.zeros(4, 1), iters=5, warmup=1)
    assert [l.params for l in got.layers] == [30, 1, 500, 7]
    for key in ("forward_s", "backward_s"):
        want = sum(getattr(l, key) for l in trace.layers)
        measured = sum(getattr(l, key) for l in got.layers)
        # sleeps never end early and each is cut by what the ones before overshot; the slack above is for
        # a loaded machine and autograd's own work between the layers
        assert 0.9 * want <= measured <= 1.5 * want + 0.003, (key, want, measured)
    fwd = [l.forward_s for l in got.layers]
    assert fwd.index(max(fwd)) == 2  # the layers keep their own times, not just the sum


def test_sleeps_carry_their_overshoot():
    # 100 sleeps of 0.2 ms: time.sleep alone took 28-29 ms on the 2-core VM (80-90 us over each), these
    # 20.2 ms: each is cut by what the ones before overshot, so only the last one's overshoot remains
    emulated._debt.s = 0.0
    t0 = time.perf_counter()
    for _ in range(100):
        emulated._sleep(0.0002, time.perf_counter())
    took = time.perf_counter() - t0
    assert 0.02 <= took <= 0.0235, took
