"""The layer-wise profiler, the analytic traces, the shipped traces and ``dpcomm profile``.

Timing checks use one torch thread and the thread-CPU timer: on this shared 2-core machine wall-clock times
swing by 3x with other processes' load, while a thread's CPU time does not count the time it is descheduled.
Budget: ~25 s.
"""

import pytest
import torch
from torch import nn

import dpcomm
from dpcomm.cli.main import main
from dpcomm.errors import UserError
from dpcomm.models import count_params, example_input, get_model, learnable_layers, model_names
from dpcomm.trace import find_trace, load_trace, save_trace, shipped_traces, trace_path
from dpcomm.trace.analytic import DevicePreset, analytic_trace, layer_costs, trace_from_costs
from dpcomm.trace.profiler import _Clock, _partition, profile, time_iteration


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lenet_trace():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = get_model("lenet5"), example_input("lenet5", 16)
    # Settle the allocator first: the first iterations of a fresh model page memory in, which the thread
    # timer counts, and a median of 10 over a cold start was seen 30% off in a full-suite run.
    time_iteration(model, x, iters=3, warmup=2, timer="thread")
    # Up to three attempts: in a full-suite run one pass was seen 50% off (backward 11.9 ms against 8.0 ms
    # hook-free, an order-dependent disturbance from earlier tests), passing alone and on a re-run. A lost or
    # double-counted layer is systematic and fails every attempt; noise does not.
    for _ in range(3):
        trace = profile(model, x, iters=10, warmup=3, model_name="lenet5", timer="thread")
        independent = time_iteration(model, x, iters=10, warmup=3, timer="thread")
        if _within(trace.t_f, trace.extra["iteration_forward_s"], 0.25) and _within(
            trace.t_b, trace.extra["iteration_backward_s"], 0.25
        ):
            break
    torch.set_num_threads(before)
    return trace, independent


def _within(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * abs(b)


def test_lenet_trace_layers_params_and_positive_times(lenet_trace):
    trace, _ = lenet_trace
    assert [layer.name for layer in trace.layers] == ["conv1", "conv2", "fc1", "fc2"]
    assert [layer.params for layer in trace.layers] == [832, 51_264, 3_212_288, 10_250]
    assert trace.batch_size == 16 and trace.device == "cpu" and trace.dtype_bytes == 4
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in trace.layers)
    # conv1 on 16x1x28x28: 16*32*28*28 outputs x 25 multiply-adds x 2, plus the bias adds.
    assert trace.layers[0].extra["flops"] == 16 * 32 * 28 * 28 * (2 * 25 + 1)
    assert trace.extra["timer"] == "thread" and trace.extra["threads"] == 1


def test_per_layer_sums_match_an_independent_whole_iteration(lenet_trace):
    # Per-layer times partition the instrumented iteration exactly, so what is left is the hooks' cost
    # (4 layers: microseconds) and noise. Against hook-free iterations interleaved with the instrumented ones
    # (same moments, same machine load) the sums agree within 25% per pass. Against a separate timing run
    # afterwards, medians of 10 CPU-time samples drifted by up to 30% on this shared machine, so that check is
    # a 50% bound: loose for noise, still failing for a lost or double-counted layer (a 2x error).
    trace, (fwd, bwd) = lenet_trace
    assert trace.t_f == pytest.approx(trace.extra["iteration_forward_s"], rel=0.25)
    assert trace.t_b == pytest.approx(trace.extra["iteration_backward_s"], rel=0.25)
    assert trace.t_f == pytest.approx(fwd, rel=0.5)
    assert trace.t_b == pytest.approx(bwd, rel=0.5)


def test_trace_round_trips(lenet_trace, tmp_path):
    trace, _ = lenet_trace
    save_trace(trace, tmp_path / "t.json")
    assert load_trace(tmp_path / "t.json") == trace


def test_heavy_layer_gets_the_time(one_thread):
    # A cheap layer (batch norm, ~0.1% of the FLOPs) between two matrix products: the partition must not hand
    # their time to it, in either pass.
    model = nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 512))
    trace = profile(model, torch.randn(256, 512), iters=6, warmup=1, timer="thread")
    f = [layer.forward_s for layer in trace.layers]
    b = [layer.backward_s for layer in trace.layers]
    assert f[0] > f[1] < f[2] and b[0] > b[1] < b[2]
    assert trace.model == "Sequential" and trace.total_params == sum(p.numel() for p in model.parameters())


def test_partition_is_exact_on_synthetic_marks():
    clock = _Clock(torch.device("cpu"))
    marks = [(0, 1.0), (1, 3.0), (0, 4.0), (2, 6.0)]  # layer 0 runs twice (shared module)
    # forward: [0,3) -> 0 (head included), [3,4) -> 1, [4,6) -> 0, [6,10] -> 2
    assert _partition(clock, 0.0, marks, 10.0, 3, opens=True) == [5.0, 1.0, 4.0]
    # backward: (0,1] -> 0, (1,3] -> 1, (3,4] -> 0, (4,6] -> 2, tail (6,10] -> 2
    assert _partition(clock, 0.0, marks, 10.0, 3, opens=False) == [2.0, 2.0, 6.0]
    assert _partition(clock, 0.0, [], 10.0, 2, opens=True) == [0.0, 0.0]


def test_wall_timer_and_package_entry_point(one_thread):
    assert dpcomm.profile is profile
    trace = dpcomm.profile(get_model("lenet5"), example_input("lenet5", 8), iters=3, warmup=1)
    assert trace.extra["timer"] == "wall" and all(layer.backward_s > 0 for layer in trace.layers)
    whole = trace.extra["iteration_forward_s"] + trace.extra["iteration_backward_s"]
    assert 0.3 < (trace.t_f + trace.t_b) / whole < 3  # loose: wall time here moves with the machine's load


def test_profile_rejects_bad_arguments():
    model, x = get_model("lenet5"), example_input("lenet5", 2)
    with pytest.raises(UserError, match="iters"):
        profile(model, x, iters=0)
    with pytest.raises(UserError, match="timer"):
        profile(model, x, timer="sundial")
    with pytest.raises(UserError, match="model forward failed"):
        profile(model, torch.randn(2, 3, 28, 28), iters=1)
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="cuda"):
            profile(model, x, device="cuda")


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


def test_analytic_flops_by_hand():
    costs = layer_costs(_Tiny(), torch.randn(2, 3, 8, 8))
    conv_out, fc_out = 2 * 4 * 8 * 8, 2 * 10
    conv = 2 * conv_out * 3 * 9 + conv_out  # 27,648 multiply-add FLOPs + 512 bias adds
    bn = 5 * conv_out  # normalise + affine, 5 FLOPs per element
    fc = 2 * fc_out * 256 + fc_out
    assert [(c.name, c.fwd_flops, c.bwd_flops) for c in costs] == [
        ("conv", conv, conv),  # the input needs no gradient: weight gradient only, 1x
        ("bn", bn, 2 * bn),
        ("fc", fc, 2 * fc),
    ]
    assert costs[0].fwd_bytes == (2 * 3 * 64 + conv_out + 4 * 27 + 4) * 4
    preset = DevicePreset(
        name="gflop", peak_flops=1e9, efficiency=1.0, mem_bw=1e18, mem_efficiency=1.0, source="t"
    )
    trace = trace_from_costs(costs, preset, model="tiny", batch_size=2)
    assert trace.device == "analytic:gflop"
    assert [layer.forward_s for layer in trace.layers] == pytest.approx([conv / 1e9, bn / 1e9, fc / 1e9])
    slow_memory = DevicePreset(
        name="m", peak_flops=1e18, efficiency=1.0, mem_bw=1e6, mem_efficiency=0.5, source="t"
    )
    assert trace_from_costs(costs, slow_memory, model="t", batch_size=2).layers[0].forward_s == pytest.approx(
        costs[0].fwd_bytes / 0.5e6
    )


def test_analytic_zoo_traces():
    t = analytic_trace("resnet50", 32, "k80")
    assert t.device == "analytic:k80" and t.num_layers == 107 and t.total_params == 25_557_032
    conv_fc = sum(layer.extra["flops"] for layer in t.layers if layer.extra["type"] != "BatchNorm2d")
    assert conv_fc / 32 == pytest.approx(2 * 4.09e9, rel=0.01)  # ResNet-50: 4.09 G multiply-adds per image
    assert t.t_f + t.t_b == pytest.approx(32 / 49.5, rel=0.1)  # the K80 calibration point
    assert analytic_trace("alexnet", 64, "analytic:h100").device == "analytic:h100"
    with pytest.raises(UserError, match="k80"):
        analytic_trace("resnet50", 32, "k81")


CPU_TOO_LARGE = {"tinyllama-1.1b": "1.1e9 parameters at 2,048 tokens: minutes per iteration on 2 cores"}
"""Zoo models without a measured CPU trace (their measured trace is the GPU one) and why."""


def test_shipped_traces_cover_the_zoo():
    on_cpu = [name for name in model_names() if name not in CPU_TOO_LARGE]
    assert set(on_cpu) <= {stem.split("-cpu-")[0] for stem in shipped_traces() if "-cpu-" in stem}
    assert set(model_names()) <= {stem.rsplit("-", 2)[0] for stem in shipped_traces() if "bf16-" in stem}
    for name in on_cpu:
        trace = load_trace(trace_path(name))
        assert trace.model == name and trace.device == "cpu"
        assert trace.total_params == count_params(name)
        with torch.device("meta"):
            assert trace.num_layers == len(learnable_layers(get_model(name)))
        assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in trace.layers)
    for name, batch in (("googlenet", 64), ("resnet50", 32)):
        shipped = find_trace(f"{name}-k80-b{batch}")
        assert shipped.to_dict() == analytic_trace(name, batch, "k80").to_dict()  # regenerated = shipped
    assert find_trace("resnet50").model == "resnet50"
    # The cpu preset was calibrated on resnet50-cpu-b8; the FLOP/byte model must carry over to the whole zoo.
    for name in on_cpu:
        measured = load_trace(trace_path(name))
        modelled = analytic_trace(name, measured.batch_size, "cpu")
        ratio = (modelled.t_f + modelled.t_b) / (measured.t_f + measured.t_b)
        assert (0.85 < ratio < 1.15) if name == "resnet50" else (0.5 < ratio < 2), (name, ratio)
    with pytest.raises(UserError, match="shipped"):
        find_trace("resnet51")


def test_shipped_gpu_traces_are_the_zoo_models_measured_on_a_gpu():
    # fp32 on an H100 (-h100-), bf16 parameters and gradients on an H200 (-h200bf16-: 2 bytes each)
    stems = [stem for stem in shipped_traces() if stem.rsplit("-", 2)[1].startswith(("h100", "h200"))]
    assert len(stems) >= 5 + len(model_names())
    for stem in stems:
        trace = find_trace(stem)
        device = stem.rsplit("-", 2)[1]
        assert trace_path(trace.model, device) is not None and trace.device.startswith("cuda:")
        assert trace.dtype_bytes == (2 if device.endswith("bf16") else 4), stem
        assert trace.total_params == count_params(trace.model)
        with torch.device("meta"):
            assert trace.num_layers == len(learnable_layers(get_model(trace.model)))
        assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in trace.layers)
        # hooks cost launch gaps on a GPU (docs/traces.md): per-layer sums at or above the hook-free pass, up
        # to 1.61x for the smallest launch-bound model (vit-cifar in bf16)
        meta = trace.to_dict()
        assert 0.95 < trace.t_f / meta["iteration_forward_s"] < 1.7, stem
        assert 0.95 < trace.t_b / meta["iteration_backward_s"] < 1.7, stem


def test_cli_writes_a_valid_trace(tmp_path, capsys, one_thread):
    out = tmp_path / "lenet.json"
    args = ["profile", "--model", "lenet5", "--batch-size", "4", "--iters", "2", "--warmup", "0"]
    assert main([*args, "--timer", "thread", "--threads", "1", "-o", str(out)]) == 0
    trace = load_trace(out)
    assert trace.model == "lenet5" and trace.num_layers == 4 and trace.batch_size == 4
    said = capsys.readouterr()
    assert "wrote" in said.out
    assert said.err == ""  # rich's progress bar printed an empty line when stderr was not a terminal
    assert (
        main(["profile", "--model", "googlenet", "--batch-size", "64", "--analytic", "k80", "-o", str(out)])
        == 0
    )
    assert load_trace(out).device == "analytic:k80"


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--model", "nope", "--batch-size", "2"], "unknown model"),
        (["--model", "lenet5", "--batch-size", "0"], "--batch-size"),
        (["--model", "lenet5", "--batch-size", "2", "--iters", "0"], "--iters"),
        (["--model", "lenet5", "--batch-size", "2", "--analytic", "k81"], "preset"),
        (["--model", "lenet5", "--batch-size", "2", "--device", "tpu"], "device"),
    ]
    + (
        []
        if torch.cuda.is_available()
        else [(["--model", "lenet5", "--batch-size", "2", "--device", "cuda"], "cuda")]
    ),
)
def test_cli_rejects_bad_arguments_in_one_line(capsys, extra, needle):
    assert main(["profile", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcomm: error: ") and err.count("\n") == 1 and needle in err


def test_models_cli_lists_the_zoo(capsys):
    import json

    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == model_names()
    assert all(r["params"] == count_params(r["name"]) for r in rows)
    assert main(["models"]) == 0 and "resnet50" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_profile_uses_events_and_sums_to_the_iteration():
    trace = profile(get_model("resnet20"), example_input("resnet20", 32), iters=10, warmup=3, device="cuda")
    assert trace.device.startswith("cuda:") and all(layer.backward_s > 0 for layer in trace.layers)
    whole = trace.extra["iteration_forward_s"] + trace.extra["iteration_backward_s"]
    assert trace.t_f + trace.t_b == pytest.approx(whole, rel=0.3)
