"""``dpcomm train --schedule ddp:PLANNER``: stock DDP with a dpcomm plan, as a replica kind of the loop."""

from __future__ import annotations

import pytest

from dpcomm.errors import UserError
from dpcomm.train.config import TrainConfig
from dpcomm.train.replica import check_schedule, kind_of


def test_ddp_with_a_planner_is_checked_in_the_parent():
    cfg = TrainConfig()
    assert kind_of("ddp:mgwfbp").name == kind_of("ddp").name == "ddp"
    assert check_schedule(cfg, "ddp") is None  # the baseline, as before
    assert check_schedule(cfg, "ddp:bucket:1KB").size_bytes == 1024
    assert check_schedule(cfg, "ddp:optimal").name == "optimal"
    with pytest.raises(UserError, match="unknown schedule 'fastest'"):
        check_schedule(cfg, "ddp:fastest")
    with pytest.raises(UserError, match="needs a planner"):
        check_schedule(cfg, "ddp:")
    with pytest.raises(UserError, match="needs a dpcomm schedule"):
        check_schedule(TrainConfig(mode="lp-alg2"), "ddp:mgwfbp")


@pytest.mark.slow
def test_ddp_plans_train_like_dpcomms_runtime_side_by_side():
    from dpcomm.train import compare_schedules

    cfg = TrainConfig(model="lenet5", nproc=2, iters=6, batch_size=8, threads=1, progress=False)
    wfbp, ddp_wfbp, ddp_mgwfbp = compare_schedules(cfg, ["wfbp", "ddp:wfbp", "ddp:mgwfbp"])
    for r in (ddp_wfbp, ddp_mgwfbp):
        assert len(set(r.params_sha256)) == 1, f"{r.schedule}: replicas differ"
        assert len(r.records) == 6 and r.records[0]["phase"] == "profile"
        assert any("DDP with plan" in line for line in r.log)
        assert r.plan is not None and r.trace is not None
    assert ddp_wfbp.plan["groups"] == wfbp.plan["groups"] == [[3], [2], [1], [0]]
    # same seed, data and averaged gradients: the same training up to summation order
    assert ddp_wfbp.loss_final == pytest.approx(wfbp.loss_final, rel=1e-4)
    assert ddp_mgwfbp.loss_final == pytest.approx(wfbp.loss_final, rel=1e-4)
