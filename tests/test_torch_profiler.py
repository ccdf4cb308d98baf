"""``dpcomm profile --from-torch-profiler``: a dpcomm trace from a torch.profiler Chrome trace of a zoo model.

The trace is recorded here, from ResNet-20 (nested modules, a module reused in forward), exactly as a user
would record it. The profiler's own totals are read back from the raw JSON in this file (independently of
the module under test) and the per-layer sums must equal them.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dpcomm.cli.main import main
from dpcomm.errors import UserError
from dpcomm.models import example_input, get_model
from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.trace import load_trace
from dpcomm.trace.torch_profiler import from_chrome_trace

MODEL, BATCH, ITERS = "resnet20", 2, 2


def _record(path, with_stack=True):
    torch.manual_seed(0)
    model, x = get_model(MODEL), example_input(MODEL, BATCH)
    model(x).sum().backward()  # warm-up outside the profile
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack, with_modules=True
    ) as p:
        for _ in range(ITERS):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), torch.zeros(BATCH, dtype=torch.long)).backward()
    p.export_chrome_trace(str(path))
    return model, x


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "resnet20.json"
    model, x = _record(path)
    return path, model, x


def _totals(path, model_class):
    """Mean forward (the model's module events) and backward (first to last backward function after each
    forward) from the raw events, microseconds -> seconds."""
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    fwd = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == f"nn.Module: {model_class}_0")
    bwd_ev = [e for e in ev if str(e.get("name", "")).startswith("autograd::engine::evaluate_function")]
    f, b = [], []
    for i, (s, t) in enumerate(fwd):
        nxt = fwd[i + 1][0] if i + 1 < len(fwd) else float("inf")
        mine = [e for e in bwd_ev if t <= e["ts"] < nxt]
        f.append((t - s) * 1e-6)
        b.append((max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) * 1e-6)
    return f, b


def test_per_layer_sums_equal_the_profilers_totals(recorded):
    path, model, x = recorded
    trace = from_chrome_trace(path, model, x, model_name=MODEL)
    owned = layer_params(model, learnable_layers(model, x))
    assert trace.num_layers == len(owned) == 39
    assert [layer.params for layer in trace.layers] == [sum(p.numel() for p in ps) for ps in owned]
    f, b = _totals(path, type(model).__name__)
    assert len(f) == ITERS
    assert trace.t_f == pytest.approx(statistics.fmean(f), rel=1e-9)
    assert trace.t_b == pytest.approx(statistics.fmean(b), rel=1e-9)
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in trace.layers)
    skipped = from_chrome_trace(path, model, x, skip=1)
    assert skipped.extra["iterations"] == ITERS - 1
    assert skipped.t_f == pytest.approx(statistics.fmean(f[1:]), rel=1e-9)


def test_layers_own_their_module_time(recorded):
    """A layer's forward share includes its own module's (mean) duration: the partition starts at its call."""
    path, model, x = recorded
    trace = from_chrome_trace(path, model, x)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "python_function"]
    conv1 = [e["dur"] * 1e-6 for e in ev if e["name"] == "nn.Module: Conv2d_0"]  # the stem, called first
    assert trace.layers[0].name == "conv1" and len(conv1) == ITERS
    assert trace.layers[0].forward_s >= statistics.fmean(conv1)


def test_cli_writes_a_trace_a_planner_reads(recorded, tmp_path, capsys):
    path, _, _ = recorded
    out = tmp_path / "t.json"
    assert main(["profile", "--from-torch-profiler", str(path), "--model", MODEL, "-o", str(out)]) == 0
    trace = load_trace(out)
    assert (
        trace.batch_size == BATCH and trace.model == MODEL and trace.extra["measured_by"] == "torch.profiler"
    )
    assert "profiler's own totals" in capsys.readouterr().out
    assert main(["plan", "--trace", str(out), "--schedule", "mgwfbp", "--nodes", "4"]) == 0


def test_wrong_model_or_no_module_events_is_one_line(recorded, tmp_path, capsys):
    path, _, _ = recorded
    assert main(["profile", "--from-torch-profiler", str(path), "--model", "lenet5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpcomm: error:") and "LeNet5" in err and "\n" not in err
    bare = tmp_path / "bare.json"
    model, x = _record(bare, with_stack=False)
    with pytest.raises(UserError, match="with_stack=True"):
        from_chrome_trace(bare, model, x)


def test_a_transformers_trace_is_its_gradient_units(tmp_path):
    # gpt2-tiny's output layer is tied to its token embedding: one unit holds the weight, once, named as the
    # model names it, so bucket_caps can find it; the rows add up to the layer-level times
    from dpcomm.trace.units import gradient_units

    torch.manual_seed(0)
    model, x = get_model("gpt2-tiny"), example_input("gpt2-tiny", 2)
    path = tmp_path / "gpt.json"
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, with_modules=True) as p:
        for _ in range(2):
            model.zero_grad()
            model(x).float().mean().backward()
    p.export_chrome_trace(str(path))
    trace = from_chrome_trace(str(path), model, x, model_name="gpt2-tiny")
    units = gradient_units(model, x)
    assert [layer.param_names for layer in trace.layers] == [u.param_names for u in units]
    names = [n for layer in trace.layers for n in layer.param_names]
    assert len(names) == len(set(names)) and "wte.weight" in names and "lm_head.weight" not in names
    assert trace.total_params == sum(p.numel() for p in model.parameters())
    assert trace.to_dict()["format"] == "dpcomm-trace/2"
    assert all(layer.forward_s >= 0 and layer.backward_s >= 0 for layer in trace.layers)
