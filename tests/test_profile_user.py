"""``dpcomm profile`` on a user's own model (``--model package.module:Class --input SPEC``), from its
torch.profiler trace, and a trace re-timed for a GPU (``--retime``) and re-typed for the reduction's dtype
(``--reduce-dtype``) (issue 40).

The user's module is written here into a temporary folder on ``sys.path``, as a user's file would be: a tiny
decoder (an embedding, blocks of LayerNorm + Linear, a head) and a small CNN, cheap on a CPU.
"""

from __future__ import annotations

import gzip
import json
import sys

import pytest
import torch

from dpcomm.cli.main import main
from dpcomm.errors import UserError
from dpcomm.trace import Layer, Trace, find_trace, load_trace
from dpcomm.trace.analytic import LayerCost, layer_costs, trace_from_costs
from dpcomm.trace.retime import TARGETS, parse_retime, retime, row_costs, with_reduce_dtype
from dpcomm.trace.torch_profiler import read_chrome_trace
from dpcomm.trace.units import gradient_units
from dpcomm.trace.user_model import build_model, make_inputs, parse_inputs

MOD = "dpcomm_user_nets_t40"  # a name no other test imports (sys.modules caches modules by name)
SOURCE = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Linear(d, d)

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class TinyDecoder(nn.Module):
    def __init__(self, vocab=32, d=16, n_layer=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d) for _ in range(n_layer)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.emb(ids)))


class SmallCNN(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.fc = nn.Linear(width, 10)

    def forward(self, x, scale):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3))) * scale.mean()


def not_a_module():
    return 3
"""
DEC = f"{MOD}:TinyDecoder"
IDS = "long[2,8]:vocab=32"


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("usermod")
    (folder / f"{MOD}.py").write_text(SOURCE)
    (folder / f"{MOD}_broken.py").write_text("import torch\nraise RuntimeError('the user module breaks')\n")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in (MOD, f"{MOD}_broken"):
        sys.modules.pop(name, None)


@pytest.fixture
def one_thread():
    """One torch thread while a test measures (two spin against each other on a shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_input_specs():
    a, b = parse_inputs("long[4,128]:vocab=1000; float32[4,128]")
    assert (a.dtype, a.shape, a.vocab) == (torch.int64, (4, 128), 1000)
    assert (b.dtype, b.shape, b.vocab) == (torch.float32, (4, 128), None)
    specs = parse_inputs("float32[8,3,32,32],bf16[8],long[8]:vocab=10")  # commas between brackets split
    assert [s.shape for s in specs] == [(8, 3, 32, 32), (8,), (8,)]
    x, h, ids = make_inputs(specs, generator=torch.Generator().manual_seed(0))
    assert x.shape == (8, 3, 32, 32) and h.dtype == torch.bfloat16 and ids.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < 10
    one = make_inputs(parse_inputs("[2,3]"))  # no dtype: float32; one input: a tensor, not a tuple
    assert isinstance(one, torch.Tensor) and one.dtype == torch.float32
    for bad, says in [
        ("long[4]", "vocab"),
        ("float32[4]:vocab=3", "only an integer input"),
        ("complex[2]", "unknown dtype"),
        ("float32[0,3]", ">= 1"),
        ("float32[a]", "whole numbers"),
        ("float32[4]:lo=1", "unknown option"),
        ("float32(4)", r"DTYPE\[D0,D1"),
        ("int8[2]:vocab=300", "does not fit"),
        ("float32[100000,100000]", "elements"),
        (" ; ", "empty"),
    ]:
        with pytest.raises(UserError, match=says):
            parse_inputs(bad)


def _one_line_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpcomm: error:") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_model_paths_are_one_line(user_module, capsys):
    run = ["profile", "--input", IDS, "--model"]
    assert "cannot import module 'no_such_pkg_t40.sub'" in _one_line_error(
        [*run, "no_such_pkg_t40.sub:Net"], capsys
    )
    err = _one_line_error([*run, f"{MOD}:Nope"], capsys)
    assert "has no attribute 'Nope'" in err and "TinyDecoder" in err  # it lists the classes there
    err = _one_line_error([*run, f"{MOD}_broken:Net"], capsys)
    assert f"importing module '{MOD}_broken' failed: RuntimeError: the user module breaks" in err
    err = _one_line_error([*run, DEC, "--model-args", '{"n_layers": 2}'], capsys)
    assert "building it failed: TypeError" in err and "n_layers" in err
    assert "not JSON" in _one_line_error([*run, DEC, "--model-args", "{n_layer: 2}"], capsys)
    assert "not a torch.nn.Module" in _one_line_error([*run, f"{MOD}:not_a_module"], capsys)
    assert "package.module:Class" in _one_line_error([*run, "a-b:C"], capsys)
    assert "--input" in _one_line_error(["profile", "--model", DEC], capsys)
    assert "first dimension" in _one_line_error([*run, DEC, "--batch-size", "4"], capsys)


def test_user_model_is_profiled_as_a_zoo_model_is(user_module, tmp_path, capsys, one_thread):
    out = tmp_path / "dec.json"
    argv = ["profile", "--model", DEC, "--model-args", '{"n_layer": 3}', "--input", IDS]
    assert main([*argv, "--iters", "2", "--warmup", "0", "-o", str(out)]) == 0
    assert f"wrote {out}: {DEC} batch 2 on cpu, 8 layers" in capsys.readouterr().out
    trace = load_trace(out)
    model = build_model(DEC, {"n_layer": 3})
    units = gradient_units(model, make_inputs(parse_inputs(IDS)))
    assert [x.param_names for x in trace.layers] == [u.param_names for u in units]
    assert [x.name for x in trace.layers][:3] == ["emb", "blocks.0.ln", "blocks.0.mlp"]
    assert trace.total_params == sum(p.numel() for p in model.parameters()) == 32 * 16 + 3 * (32 + 272) + 544
    assert trace.batch_size == 2 and trace.model == DEC and trace.extra["iters"] == 2
    assert all(x.forward_s > 0 and x.backward_s > 0 for x in trace.layers)
    assert main(["plan", "--trace", str(out), "--schedule", "mgwfbp", "--nodes", "4"]) == 0
    # two inputs (forward(x, scale)), analytic on the meta device: FLOPs as the analytic model counts them
    assert main(["profile", "--model", f"{MOD}:SmallCNN", "--input", "float32[2,3,8,8]; float32[1]",
                 "--analytic", "h100-bf16", "-o", str(tmp_path / "cnn.json")]) == 0  # fmt: skip
    cnn = load_trace(tmp_path / "cnn.json")
    assert cnn.device == "analytic:h100-bf16" and [x.name for x in cnn.layers] == ["conv", "fc"]
    assert cnn.layers[0].extra["flops"] == 2 * (2 * 4 * 8 * 8) * 3 * 9 + 2 * 4 * 8 * 8  # 2*out*C_in*k + bias


def test_the_torch_profiler_trace_of_a_user_model(user_module, tmp_path, one_thread):
    # the failure: a zoo name for a user's decoder found no call of the zoo's class in the trace
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model, ids = build_model(DEC), make_inputs(parse_inputs(IDS))
    path, out = tmp_path / "tp.json", tmp_path / "t.json"
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, with_modules=True) as p:
        for _ in range(2):
            model.zero_grad()
            model(ids).float().mean().backward()
    p.export_chrome_trace(str(path))
    argv = ["profile", "--model", DEC, "--input", IDS, "--from-torch-profiler", str(path), "-o", str(out)]
    assert main(argv) == 0
    trace = load_trace(out)
    assert trace.extra["measured_by"] == "torch.profiler" and trace.extra["iterations"] == 2
    assert [x.param_names for x in trace.layers] == [u.param_names for u in gradient_units(model, ids)]
    assert trace.t_f == pytest.approx(trace.extra["iteration_forward_s"], rel=1e-9)
    # gzipped, as tensorboard_trace_handler(use_gzip=True) writes it: the same trace
    packed = tmp_path / "tp.pt.trace.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert main([*argv[:-3], str(packed), "-o", str(tmp_path / "z.json")]) == 0
    assert load_trace(tmp_path / "z.json").to_dict() == trace.to_dict()
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(UserError, match="cannot read it as gzip"):
        read_chrome_trace(tmp_path / "bad.json.gz")


def _hand_trace() -> Trace:
    rows = (
        Layer(name="fc", params=1000, forward_s=1.0, backward_s=2.0),
        Layer(name="ln", params=10, forward_s=0.5, backward_s=0.5),
        Layer(name="spare", params=5, forward_s=0.1, backward_s=0.0, param_names=("spare.w",), unused=True),
    )
    rows = tuple(
        Layer(name=x.name, params=x.params, forward_s=x.forward_s, backward_s=x.backward_s,
              param_names=x.param_names or (f"{x.name}.weight",), unused=x.unused)
        for x in rows
    )  # fmt: skip
    return Trace(model="hand", batch_size=4, device="cpu", dtype_bytes=4, layers=rows,
                 extra={"iteration_forward_s": 1.6, "iteration_backward_s": 2.5})  # fmt: skip


def test_retime_for_h100_bf16_by_hand():
    costs = [
        LayerCost(name="fc", kind="Linear", params=1000, fwd_flops=2 * 10**12, bwd_flops=4 * 10**12,
                  fwd_bytes=10**9, bwd_bytes=2 * 10**9),  # compute-bound
        LayerCost(name="ln", kind="LayerNorm", params=10, fwd_flops=5 * 10**9, bwd_flops=10**10,
                  fwd_bytes=2 * 10**10, bwd_bytes=4 * 10**10),  # memory-bound
        LayerCost(name="spare", kind="Linear", params=5, fwd_flops=0, bwd_flops=0, fwd_bytes=0, bwd_bytes=0),
    ]  # fmt: skip
    out = retime(_hand_trace(), "h100-bf16", costs=costs)
    # 989.4e12 FLOP/s x 0.5 = 494.7e12 FLOP/s; 3.35e12 B/s x 0.7 = 2.345e12 B/s
    assert out.layers[0].forward_s == pytest.approx(2e12 / 494.7e12, rel=1e-12)  # 4.043 ms
    assert out.layers[0].backward_s == pytest.approx(4e12 / 494.7e12, rel=1e-12)
    assert out.layers[1].forward_s == pytest.approx(2e10 / 2.345e12, rel=1e-12)  # 8.529 ms
    assert out.layers[1].backward_s == pytest.approx(4e10 / 2.345e12, rel=1e-12)
    assert out.layers[2].backward_s == 0.0  # an unused unit computes nothing in backward
    assert out.device == "analytic:h100-bf16" and "iteration_forward_s" not in out.extra
    assert out.extra["retime"]["before"] == {"device": "cpu", "t_f": 1.6, "t_b": 2.5}
    assert [x.params for x in out.layers] == [1000, 10, 5] and out.dtype_bytes == 4
    with pytest.raises(UserError, match="3 rows"):
        retime(_hand_trace(), "h100-bf16", costs=costs[:2])


def test_retime_counts_the_trace_models_flops():
    # a shipped CPU trace of a zoo model: per row, the analytic model's layer costs at bf16 and its batch
    trace = find_trace("resnet20-cpu-b32")
    out = retime(trace, "h100-bf16")
    with torch.device("meta"):
        from dpcomm.models import example_input, get_model

        net, x = get_model("resnet20"), example_input("resnet20", 32, device="meta")
    ref = trace_from_costs(layer_costs(net, x, dtype_bytes=2), TARGETS["h100-bf16"].preset,
                           model="resnet20", batch_size=32)  # fmt: skip
    assert [a.forward_s for a in out.layers] == pytest.approx([b.forward_s for b in ref.layers], rel=1e-12)
    assert [a.backward_s for a in out.layers] == pytest.approx([b.backward_s for b in ref.layers], rel=1e-12)
    assert out.extra["retime"]["memory_term"] == "model"
    # gradient units (gpt2-tiny ties its head to the token embedding): FLOPs split over rows add up
    units = find_trace("gpt2-tiny-cpu-b16")
    with torch.device("meta"):
        net, x = get_model("gpt2-tiny"), example_input("gpt2-tiny", 16, device="meta")
    total = sum(c.fwd_flops for c in layer_costs(net, x))
    rows = row_costs(units, net, x, 2)
    assert abs(sum(c.fwd_flops for c in rows) - total) <= len(rows)  # rounding, at most 1 per row


def test_scales_and_ratios(tmp_path):
    t = _hand_trace()
    out = retime(t, "scale:0.05")
    assert [x.forward_s for x in out.layers] == pytest.approx([0.05, 0.025, 0.005], rel=1e-12)
    assert out.extra["iteration_backward_s"] == pytest.approx(2.5 * 0.05) and out.device == "scaled:cpu"
    two = retime(t, "scale:0.1,0.2")
    assert two.t_f == pytest.approx(0.16) and two.t_b == pytest.approx(0.5)
    fast = retime(t, "scale:0.25,0.5")
    from dpcomm.trace import save_trace

    save_trace(fast, tmp_path / "gpu.json")
    save_trace(t, tmp_path / "cpu.json")
    s = parse_retime(f"ratio:{tmp_path / 'gpu.json'},{tmp_path / 'cpu.json'}")
    assert (s.forward, s.backward) == pytest.approx((0.25, 0.5), rel=1e-12)
    for bad, says in [("scale:0", "> 0"), ("scale:x", "not a number"), ("h300", "choose a target"),
                      ("ratio:resnet20-h100-b128,resnet20-cpu-b32", "one model at one batch")]:  # fmt: skip
        with pytest.raises(UserError, match=says):
            parse_retime(bad)


def test_reduce_dtype_sets_the_bytes_reduced(tmp_path, capsys):
    from dpcomm.planner._common import layer_bytes

    bf16 = find_trace("gpt2-tiny-h200bf16-b64")  # a model cast to bf16: 2-byte gradients
    fp32 = with_reduce_dtype(bf16, "fp32")  # autocast / FSDP2 reduce_dtype=float32: 4 bytes
    assert (bf16.dtype_bytes, fp32.dtype_bytes, fp32.extra["param_dtype_bytes"]) == (2, 4, 2)
    assert (layer_bytes(fp32) == 2 * layer_bytes(bf16)).all()
    assert with_reduce_dtype(fp32, "bf16").extra["param_dtype_bytes"] == 2  # the parameters' size stays
    out = tmp_path / "g.json"
    assert (
        main(["profile", "--trace", "gpt2-tiny-h200bf16-b64", "--reduce-dtype", "fp32", "-o", str(out)]) == 0
    )
    assert "gradients reduced in fp32" in capsys.readouterr().out
    assert json.loads(out.read_text())["dtype_bytes"] == 4
    assert "--reduce-dtype 'int3'" in _one_line_error(
        ["profile", "--trace", "gpt2-tiny-h200bf16-b64", "--reduce-dtype", "int3"], capsys
    )
    assert "needs --retime" in _one_line_error(["profile", "--trace", "gpt2-tiny-h200bf16-b64"], capsys)


def test_cli_retimes_a_user_models_trace(user_module, tmp_path, capsys, one_thread):
    src, out = tmp_path / "dec.json", tmp_path / "h100.json"
    base = ["profile", "--model", DEC, "--input", IDS]
    assert main([*base, "--iters", "1", "--warmup", "0", "-o", str(src)]) == 0
    assert main([*base, "--trace", str(src), "--retime", "h100-bf16", "-o", str(out)]) == 0
    assert "re-timed (h100-bf16) from cpu" in capsys.readouterr().out
    got = load_trace(out)
    meta = [x.forward_s for x in got.layers]
    with torch.device("meta"):
        net = build_model(DEC)
    ref = retime(load_trace(src), "h100-bf16", costs=row_costs(load_trace(src), net,
                 make_inputs(parse_inputs(IDS), device="meta"), 2))  # fmt: skip
    assert meta == pytest.approx([x.forward_s for x in ref.layers], rel=1e-12)
    assert got.extra["retime"]["memory_term"] == "model" and got.layers[0].extra["flops"] == 0  # a gather
    # without the model: the trace's FLOPs only, and it says so
    assert main(["profile", "--trace", str(src), "--retime", "h100-bf16", "-o", str(out)]) == 0
    assert load_trace(out).extra["retime"]["memory_term"].startswith("none")
    err = _one_line_error(["profile", "--model", DEC, "--input", "long[3,8]:vocab=32", "--trace", str(src),
                           "--retime", "h100-bf16"], capsys)  # fmt: skip
    assert "batch 3 is not the trace's batch size 2" in err
