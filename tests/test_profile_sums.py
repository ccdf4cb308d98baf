"""dpcomm.trace.profiler on the CPU: the units add up to the hookless iteration (whatever the hooks cost),
and ``autocast`` (``dpcomm profile --autocast``) runs the forward in mixed precision and says so."""

import json

import pytest
import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.trace.profiler import profile, time_iteration
from dpcomm.trace.shares import SCALED, sum_ratios


def _many_small_layers() -> nn.Module:
    torch.manual_seed(0)  # launch-bound in miniature: 24 tiny layers, the hooks' cost next to the work's
    return nn.Sequential(*(m for _ in range(12) for m in (nn.Linear(8, 8), nn.ReLU())), nn.Linear(8, 2))


def test_the_units_add_up_to_the_hookless_iteration_and_the_hooked_sums_stay_on_record():
    trace = profile(_many_small_layers(), torch.randn(4, 8), iters=3, warmup=1)
    assert sum_ratios(trace) == pytest.approx((1.0, 1.0), rel=1e-9)
    assert trace.extra["attribution"] == SCALED
    assert trace.extra["hooked_forward_s"] > 0 and trace.extra["hooked_backward_s"] > 0
    assert all(x.forward_s > 0 and x.backward_s > 0 for x in trace.layers)
    assert trace.extra["autocast"] is None


def _dtype_seen(seen: list) -> object:
    def loss(out: torch.Tensor) -> torch.Tensor:
        seen.append(out.dtype)
        return out.float().mean()

    return loss


def test_autocast_runs_the_forward_in_bf16_and_the_trace_says_so():
    seen: list = []
    trace = profile(
        _many_small_layers(), torch.randn(4, 8), iters=2, warmup=0, autocast="bf16", loss_fn=_dtype_seen(seen)
    )
    assert trace.extra["autocast"] == "bfloat16" and set(seen) == {torch.bfloat16}
    assert trace.dtype_bytes == 4  # mixed precision: the parameters (and gradients) stay fp32
    assert sum_ratios(trace) == pytest.approx((1.0, 1.0), rel=1e-9)


def test_the_callers_autocast_is_profiled_and_recorded_as_wrap_and_shard_see_it():
    seen: list = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trace = profile(_many_small_layers(), torch.randn(4, 8), iters=1, warmup=0, loss_fn=_dtype_seen(seen))
    assert trace.extra["autocast"] == "bfloat16" and set(seen) == {torch.bfloat16}
    seen.clear()
    plain = profile(_many_small_layers(), torch.randn(4, 8), iters=1, warmup=0, loss_fn=_dtype_seen(seen))
    assert plain.extra["autocast"] is None and set(seen) == {torch.float32}


def test_time_iteration_takes_autocast_too():
    seen: list = []
    f, b = time_iteration(_many_small_layers(), torch.randn(4, 8), iters=1, warmup=0, autocast="bf16",
                          loss_fn=_dtype_seen(seen))  # fmt: skip
    assert f > 0 and b > 0 and set(seen) == {torch.bfloat16}


@pytest.mark.parametrize("bad", ["fp8", "int8", ""])
def test_an_unknown_autocast_is_one_line(bad):
    with pytest.raises(UserError, match="autocast"):
        profile(_many_small_layers(), torch.randn(4, 8), iters=1, warmup=0, autocast=bad)


def test_dpcomm_profile_autocast(tmp_path, capsys):
    from dpcomm.cli.main import main

    out = tmp_path / "t.json"
    args = ["profile", "--model", "lenet5", "--batch-size", "4", "--iters", "1", "--warmup", "0"]
    assert main([*args, "--autocast", "bf16", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["autocast"] == "bfloat16" and data["attribution"] == SCALED
    capsys.readouterr()
    assert main([*args, "--autocast", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp8" in err[0]
