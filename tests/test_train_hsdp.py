"""``dpcomm train --schedule hsdp:PLANNER[:G]`` (and ``fsdp:...,mesh=G``) and ``--param-dtype``/
``--reduce-dtype``: HSDP and FSDP2's mixed precision from the command line.

Fast tier: the schedules parse (HSDP's group, ``auto``, ``size:BYTES`` with a group, ``mesh=``) and bad
ones are one line, checked in the parent. Slow tier: one launch of 4 gloo workers
(``tests/_train_workers.py``): LeNet-5 under DDP, ``hsdp:per-block:2`` (two replicas of 2-rank shard
groups), ``hsdp:optimal`` (the planner chooses the group) side by side; half of the ``hsdp:per-block:2``
run with a checkpoint and that half resumed; and ``fsdp:per-block`` under ``--param-dtype bf16
--reduce-dtype fp32``.

Tolerances: HSDP averages in two steps (reduce-scatter in the group, all-reduce across), DDP in one
all-reduce, so float32 sums round in another order: ``rel=1e-5`` as ``tests/test_hsdp.py``. Under the
bf16 policy the forward and backward run in bf16: after 4 steps the loss stays within ``rel=1e-2`` of
DDP's fp32 run (measured 2e-4 on LeNet-5), and must differ from it (else the policy did not run).
"""

from __future__ import annotations

import pytest

from dpcomm.errors import UserError
from dpcomm.train.config import TrainConfig
from dpcomm.train.fsdp_replica import parse_schedule
from dpcomm.train.replica import check_schedule

LOSS_REL = 1e-5


@pytest.mark.parametrize(
    "text, method, mesh",
    [
        ("hsdp:optimal:2", "optimal", 2),
        ("hsdp:per-block", "per-block", "auto"),
        ("hsdp:optimal:auto", "optimal", "auto"),
        ("hsdp:size:64KB:2", "size:64kb", 2),
        ("hsdp:size:64", "size:64", "auto"),
        ("fsdp:optimal,mesh=2", "optimal", 2),
        ("fsdp:optimal", "optimal", None),
    ],
)
def test_hsdp_schedules_parse(text, method, mesh):
    got = parse_schedule(text)
    assert (got.method, got.mesh) == (method, mesh)


def test_bad_hsdp_schedules_and_dtypes_are_one_line():
    cfg = TrainConfig(model="lenet5", nproc=4, iters=2)
    for text, match in [
        ("hsdp:optimal:3", "does not divide the 4 ranks"),
        ("hsdp:optimal:2,mesh=2", "gives the shard group twice"),
        ("fsdp:optimal,mesh=0", "shard group must be an integer >= 1"),
        ("hsdp:best:2", "unknown FSDP planner"),
    ]:
        with pytest.raises(UserError, match=match) as e:
            check_schedule(cfg, text)
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="--param-dtype must be one of"):
        TrainConfig(model="lenet5", param_dtype="int8")
    from dpcomm.train.checks import check

    with pytest.raises(UserError, match="FSDP2's mixed precision: give an fsdp: or hsdp: schedule"):
        check(TrainConfig(model="lenet5", nproc=2, iters=2, schedule="ddp", param_dtype="bf16"))


BASE = dict(model="lenet5", nproc=4, iters=4, batch_size=4, threads=1, profile_iters=1, verify_iters=1,
            progress=False)  # fmt: skip
RESUMED = "hsdp:per-block:2"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests._train_workers import train_runs

    tmp = tmp_path_factory.mktemp("hsdp")
    half, kept = tmp / "ckpt", tmp / "half"
    side, _, (resumed,), (mixed,) = train_runs(
        [
            (TrainConfig(**BASE), ["ddp", RESUMED, "hsdp:optimal"]),
            (TrainConfig(**{**BASE, "iters": 2, "schedule": RESUMED, "checkpoint": str(half)}), None,
             str(kept)),
            (TrainConfig(**{**BASE, "schedule": RESUMED, "checkpoint": str(half), "resume": True}), None),
            (TrainConfig(**{**BASE, "schedule": "fsdp:per-block", "param_dtype": "bf16",
                            "reduce_dtype": "fp32"}), None),
        ]
    )  # fmt: skip
    return {"side": side, "resumed": (resumed, kept), "mixed": mixed}


@pytest.mark.slow
def test_hsdp_from_the_cli_trains_like_ddp(runs):
    ddp, block, chosen = runs["side"]
    for r in (block, chosen):
        assert len(set(r.params_sha256)) == 1, f"{r.schedule}: gathered parameters differ across ranks"
        assert r.records[0]["phase"] == "profile" and len(r.records) == 4
        assert r.loss_final == pytest.approx(ddp.loss_final, rel=LOSS_REL), r.schedule
    assert block.plan["shard_group"] == 2, block.plan  # two replicas of 2-rank groups
    assert chosen.plan.get("shard_group", 4) in (1, 2, 4)


@pytest.mark.slow
def test_hsdp_resumes_bitwise(runs):
    from dpcomm.runtime.checkpoint import load_checkpoint

    resumed, half = runs["resumed"]
    whole = runs["side"][1]
    state = load_checkpoint(half)
    assert state["iteration"] == 2 and state["plan"]["shard_group"] == 2
    assert not any(type(v).__name__ == "DTensor" for v in state["model"].values())  # full tensors
    assert resumed.start_iteration == 2 and resumed.plan["shard_group"] == 2
    assert resumed.params_sha256 == whole.params_sha256 and len(set(whole.params_sha256)) == 1


@pytest.mark.slow
def test_param_dtype_runs_fsdp2s_policy(runs):
    ddp, mixed = runs["side"][0], runs["mixed"]
    assert len(set(mixed.params_sha256)) == 1
    assert mixed.loss_final == pytest.approx(ddp.loss_final, rel=1e-2)
    assert mixed.loss_final != ddp.loss_final, "bf16 made no difference: the policy did not run"
    assert any("param_dtype bf16, reduce_dtype fp32" in line for line in mixed.log), mixed.log
