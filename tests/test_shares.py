"""Measured traces add up: every unit's forward and backward times sum to the trace's own hookless iteration
(MG-WFBP Eq. 3), within 3%, for every shipped trace; the bf16 excess of the H200 profiles, and its removal.

``tests/data/h200bf16/`` holds traces as ``dpcomm profile`` recorded them on one H200 in bf16 (torch
2.11.0+cu130; the shipped ``*-h200bf16-*`` traces before :func:`dpcomm.trace.shares.to_iteration` was applied
to them). Their units' sums exceed the iteration each recorded without hooks by the factor the GPU run
reported (``docs/gpu.md``): per-layer hooks and CUDA events stretch an iteration whose GPU waits for the host.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from dpcomm.trace.format import load_trace
from dpcomm.trace.shares import SCALED, TOLERANCE, sum_ratios, to_iteration
from dpcomm.trace.shipped import shipped_traces

RECORDED = Path(__file__).parent / "data" / "h200bf16"


def test_every_shipped_trace_adds_up_to_its_own_iteration():
    checked = 0
    for name, path in shipped_traces().items():
        trace = load_trace(path)
        ratios = sum_ratios(trace)
        if ratios is None:  # only a model (no measurement) has no iteration of its own
            assert trace.device.startswith("analytic:"), name
            continue
        checked += 1
        forward, backward = ratios
        assert abs(forward - 1) <= TOLERANCE and abs(backward - 1) <= TOLERANCE, (name, ratios)
    assert checked >= 30  # the CPU, H100 and H200 traces


def _excess(trace) -> float:
    """The units' sum over the hookless iteration, forward and backward together."""
    it = trace.extra["iteration_forward_s"] + trace.extra["iteration_backward_s"]
    return (trace.t_f + trace.t_b) / it


# recorded excess: launch-bound (small models, bf16) well above 3%, compute-bound (gpt2 b8, vgg19) within
@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("resnet20-h200bf16-b128", 1.30, 1.36),
        ("gpt2-tiny-h200bf16-b64", 1.30, 1.36),
        ("vit-cifar-h200bf16-b128", 1.42, 1.48),
        ("inception-v3-h200bf16-b32", 1.23, 1.29),
        ("gpt2-h200bf16-b8", 1.03, 1.06),
        ("vgg19-h200bf16-b32", 1.0, 1.01),
    ],
)
def test_the_recorded_bf16_excess_and_its_correction(name, low, high):
    recorded = load_trace(RECORDED / f"{name}.json")
    assert low <= _excess(recorded) <= high  # the excess, as recorded on the H200
    fixed = to_iteration(recorded)
    assert sum_ratios(fixed) == pytest.approx((1.0, 1.0), rel=1e-12)
    assert _excess(fixed) == pytest.approx(1.0, rel=1e-12)
    # each unit keeps its share of its pass; the hooked sums stay on record; a second scaling is a no-op
    for a, b in zip(recorded.layers, fixed.layers, strict=True):
        assert b.forward_s / fixed.t_f == pytest.approx(a.forward_s / recorded.t_f, rel=1e-12)
        assert b.backward_s / fixed.t_b == pytest.approx(a.backward_s / recorded.t_b, rel=1e-12)
        assert (b.name, b.params) == (a.name, a.params)
    assert (fixed.extra["hooked_forward_s"], fixed.extra["hooked_backward_s"]) == (recorded.t_f, recorded.t_b)
    assert fixed.extra["attribution"] == SCALED
    assert to_iteration(fixed) == fixed


def test_the_shipped_h200_traces_are_the_recorded_ones_scaled():
    shipped = shipped_traces()
    for path in sorted(RECORDED.glob("*.json")):
        assert load_trace(shipped[path.stem]) == to_iteration(load_trace(path)), path.stem


def test_a_trace_without_a_measured_iteration_is_left_as_it_is():
    analytic = load_trace(shipped_traces()["resnet50-k80-b32"])
    assert to_iteration(analytic) is analytic
    recorded = load_trace(RECORDED / "resnet20-h200bf16-b128.json")
    profiler = dataclasses.replace(recorded, extra={**recorded.extra, "measured_by": "torch.profiler"})
    assert to_iteration(profiler) is profiler  # its iteration fields are the profiler's own sums


def test_the_recorded_files_are_small_and_untouched():
    for path in RECORDED.glob("*.json"):
        data = json.loads(path.read_text())
        assert "attribution" not in data and data["torch"] == "2.11.0+cu130" and path.stat().st_size < 40_000
