"""``bucket:auto``, the best single bucket size (:mod:`dpcomm.planner.bucket_auto`, issue 55): exact against
exhaustive search over every single size on random traces, never slower in the model than DDP's
``bucket_cap_mb=25``, its size reproducing its groups, and what ``dpcomm plan`` says of it. Pure functions.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel.base import LinearCost
from dpcomm.planner import make_plan, parse_schedules, plan_bucket
from dpcomm.planner.bucket_auto import layout, plan_bucket_auto
from dpcomm.planner.schedule import PlannerSchedule
from dpcomm.sim import simulate
from dpcomm.trace import save_trace
from dpcomm.trace.shipped import find_trace
from tests._sim_ref import make_trace, ref_t_iter


class _Stepped:
    """A non-linear cost: a start-up, a rate, and a jump past 64 KiB (as NCCL changes protocol)."""

    def __call__(self, nbytes: float) -> float:
        return 2e-4 + 1e-9 * nbytes + (3e-4 if nbytes > 65536 else 0.0)


def _random_trace(rng: np.random.Generator):
    L = int(rng.integers(1, 14))
    params = [int(x) for x in rng.choice([1, 7, 300, 4096, 50_000, 400_000], size=L)]
    backward = [float(x) for x in rng.uniform(1e-5, 3e-3, size=L)]
    forward = [float(x) for x in rng.uniform(0, 1e-3, size=L)]
    return make_trace(backward, forward, params, dtype_bytes=4)


def _exhaustive(trace, cost) -> float:
    """The least t_iter over every single size: one size per sum of consecutive layers (backward order),
    which between them change no comparison the walk makes."""
    m = [trace.layer_bytes(l) for l in range(trace.num_layers - 1, -1, -1)]
    sums = {sum(m[i : j + 1]) for i, j in itertools.combinations_with_replacement(range(len(m)), 2)}
    return min(ref_t_iter(trace, plan_bucket(trace, cost, 4, size_bytes=int(c)).groups, cost) for c in sums)


@pytest.mark.parametrize("seed", range(40))
def test_bucket_auto_is_the_best_single_size_and_never_slower_than_25mb(seed):
    rng = np.random.default_rng(seed)
    trace = _random_trace(rng)
    cost = (
        LinearCost(float(rng.uniform(1e-5, 2e-3)), float(rng.uniform(1e-10, 5e-9)))
        if seed % 2
        else _Stepped()
    )
    plan = plan_bucket_auto(trace, cost, 4)
    t = ref_t_iter(trace, plan.groups, cost)
    assert t == pytest.approx(_exhaustive(trace, cost), rel=1e-12, abs=1e-15)
    assert plan.meta["t_iter_s"] == pytest.approx(t, rel=1e-12)
    ddp = plan_bucket(trace, cost, 4, size_bytes=25 * 2**20)
    assert simulate(trace, plan, cost, 4).t_iter_s <= simulate(trace, ddp, cost, 4).t_iter_s * (1 + 1e-12)
    # the one number reproduces the groups: DDP given bucket_cap_mb cuts every bucket at it
    again = plan_bucket(trace, cost, 4, size_bytes=int(plan.meta["bucket_cap_mb"] * 2**20))
    assert again.groups == plan.groups and plan.meta["bucket_bytes"] == int(
        plan.meta["bucket_cap_mb"] * 2**20
    )


def test_every_layout_is_priced_once_on_a_shipped_trace():
    """ResNet-50 (107 layers, H100 trace) on 16 nodes of 10 GbE: the walk meets each distinct layout once
    (as many as the distinct layouts of every single size), and the result is between the per-bucket
    optimum and DDP's default in the model."""
    trace = find_trace("resnet50-h100-b32")
    cost = LinearCost(1.3578e-3, 1.5e-9)  # the ring on 16 nodes of the 10gbe preset (dpcomm plan prints it)
    plan = plan_bucket_auto(trace, cost, 16)
    m = np.array([trace.layer_bytes(l) for l in range(trace.num_layers - 1, -1, -1)])
    P = np.concatenate(([0.0], np.cumsum(m)))
    sums = np.unique((P[None, 1:] - P[:-1, None])[np.triu_indices(m.size)])
    layouts = {tuple(layout(m, c)[0]) for c in sums}
    assert plan.meta["layouts"] == len(layouts)
    t = {s: simulate(trace, make_plan(s, trace, cost, 16), cost, 16).t_iter_s for s in ("optimal", "ddp")}
    assert t["optimal"] <= simulate(trace, plan, cost, 16).t_iter_s <= t["ddp"]


def test_bucket_auto_is_a_schedule_name(tmp_path, capsys):
    assert parse_schedules("wfbp,bucket:auto") == ["wfbp", "bucket:auto"]
    trace = make_trace([0.002, 0.001, 0.003, 0.002], [0.001] * 4, [1000, 200_000, 50_000, 4_000_000], 4)
    cost = LinearCost(0.001, 1e-9)
    assert (
        PlannerSchedule.parse("bucket:auto").plan(trace, cost, 8).groups
        == plan_bucket_auto(trace, cost, 8).groups
    )
    path = tmp_path / "t.json"
    save_trace(trace, path)
    argv = [
        "plan",
        "--trace",
        str(path),
        "--nodes",
        "8",
        "--schedule",
        "bucket:auto",
        "--linear-cost",
        "0.001,1e-9",
    ]
    assert main([*argv, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["schedule"] == "bucket:auto" and obj["bucket_cap_mb"] > 0
    assert obj["against_s"]["optimal"] <= obj["t_iter_s"] <= obj["against_s"]["ddp"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "one bucket size: bucket_cap_mb=" in out and "per-bucket optimum" in out
