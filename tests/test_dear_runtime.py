"""The ``dear`` schedule in dpcomm's runtime (:mod:`dpcomm.runtime.dear`) against an all-reduce plan of the
same groups, on 3 gloo ranks, each rank its own data: parameters within 1e-6 relative after every case,
replicas bitwise equal, the optimizer state sharded. One launch runs every case (about 8 s on the 2-core VM).

Tolerance: 1e-6 relative to the largest parameter. Both runs average the same per-rank gradients; only the
order of the sums differs (the ring's reduce-scatter against the all-reduce), a few float32 ulps per step.
"""

from __future__ import annotations

import pytest

from dpcomm.launch import launch
from tests import _dear_workers as W

WORLD = 3
REL = 1e-6
CASES = {
    "sgd-momentum": {},
    "one-layer-groups": {"sizes": [1, 1, 1, 1]},
    "native-collective": {"collective": "native"},
    "clip": {"clip": 0.05},
    "adamw": {"adamw": True},
    "scaler-skips-a-step": {"scaler": True, "inf_at": 2},
    "scaler-clip": {"scaler": True, "inf_at": 4, "clip": 0.05},
    "param-groups-lr-scheduler": {"groups": True},
    "resume": {"resume": 3, "groups": True},
    "eval-flush": {"eval": True},
    "planned-on-the-workers": {"plan": "dear"},
}


@pytest.fixture(scope="module")
def results():
    out = launch(W.run_cases, WORLD, list(CASES.values()))
    return {name: [out[r][i] for r in range(WORLD)] for i, name in enumerate(CASES)}


def _ok(results, name):
    ranks = results[name]
    assert [r["error"] for r in ranks] == [None] * WORLD, ranks[0]["error"]
    assert len({r["sha"] for r in ranks}) == 1, f"{name}: replicas differ"
    assert ranks[0]["rel"] <= REL, f"{name}: {ranks[0]['rel']} from the all-reduce plan"
    return ranks


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_dear_equals_the_allreduce_plan(results, name):
    ranks = _ok(results, name)
    # ZeRO-1: each rank holds optimizer state for its third of the elements only
    per_rank = [r["shard_state"] for r in ranks]
    slots = 2 if name in ("adamw", "param-groups-lr-scheduler", "resume") else 1
    assert sum(per_rank) == slots * ranks[0]["params"], per_rank
    assert max(per_rank) < slots * ranks[0]["params"] / 2


@pytest.mark.slow
def test_a_skipped_scaler_step_is_skipped_on_every_rank(results):
    for name in ("scaler-skips-a-step", "scaler-clip"):
        for r in _ok(results, name):
            assert r["scales"][0] == r["scales"][1] < 2.0**8  # the scale halved once: the step was skipped


@pytest.mark.slow
def test_resume_from_a_consolidated_checkpoint_is_bitwise(results):
    for r in _ok(results, "resume"):
        assert r["resume_bitwise"]
    assert results["resume"][0]["resumed_state_keys"] == ["exp_avg", "exp_avg_sq", "step"]


@pytest.mark.slow
def test_evaluation_flushes_the_gathers_in_flight(results):
    for r in _ok(results, "eval-flush"):
        assert r["stale_diff"] > 1e-3  # before the flush the module holds last step's other shards
        assert r["eval_diff"] <= 1e-6


@pytest.mark.slow
def test_planned_on_the_workers_with_the_collectives_own_halves(results):
    for r in _ok(results, "planned-on-the-workers"):
        assert r["halves"] == ["ag", "rs"] and r["split"] == "SplitCost"
