"""Online re-planning: the switch decision (threshold against a reference timing model), the re-plan points
(a function of shared counts), and a short 2-worker run that re-plans and keeps replicas identical."""

from __future__ import annotations

import pytest

from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.planner import make_plan
from dpcomm.train.config import TrainConfig
from dpcomm.train.replan import REPLAN_GAIN, decide, message, replan_due
from dpcomm.train.replica import check_schedule
from tests._sim_ref import make_trace, ref_t_iter

# backward times (s) and sizes where merging pays: a large start-up a makes one message per layer slow
_TRACE = make_trace([0.01, 0.02, 0.01, 0.03], forward=[0.01] * 4, params=[1000, 5000, 2000, 8000])


def _plans(cost):
    return make_plan("wfbp", _TRACE, cost, 4), make_plan("single", _TRACE, cost, 4)


@pytest.mark.parametrize("a", [0.0, 0.002, 0.05])
def test_switch_only_when_the_predicted_gain_exceeds_the_threshold(a):
    cost = LinearCost(a, 1e-6)
    cur, new = _plans(cost)
    t_cur = ref_t_iter(_TRACE, cur.groups, cost)
    t_new = ref_t_iter(_TRACE, new.groups, cost)
    gain = (t_cur - t_new) / t_cur
    d = decide(_TRACE, cur, new, cost, 4, threshold=REPLAN_GAIN)
    assert d.current_s == pytest.approx(t_cur) and d.new_s == pytest.approx(t_new)
    assert d.gain == pytest.approx(gain)
    assert d.switch == (gain > REPLAN_GAIN)
    if gain > 0:  # just below / just above the predicted gain
        assert decide(_TRACE, cur, new, cost, 4, threshold=gain * 0.99).switch
        assert not decide(_TRACE, cur, new, cost, 4, threshold=gain * 1.01).switch
    # the other way round the gain is negative: never a switch
    assert decide(_TRACE, new, cur, cost, 4, threshold=0.0).switch == (t_cur < t_new)


def test_the_same_groups_never_switch_and_the_log_line_says_what_happened():
    cost = LinearCost(0.05, 1e-6)
    cur, new = _plans(cost)
    same = decide(_TRACE, cur, cur, cost, 4, threshold=0.0)
    assert not same.switch and same.gain == 0.0
    d = decide(_TRACE, cur, new, cost, 4)
    assert d.switch  # a 50 ms start-up per message: one message is far faster
    line = message(9, d, cur, new, lambda p: str(len(p.groups)))
    assert line.startswith("re-plan at iteration 9: switched wfbp 4 -> single 1, predicted ")
    assert f"{d.current_s * 1e3:.1f} ms -> {d.new_s * 1e3:.1f} ms" in line
    assert "kept wfbp" in message(9, same, cur, cur, lambda p: "")


def test_replan_points_depend_only_on_the_steady_count():
    # every rank counts the same steady iterations, so every rank re-plans at the same one
    assert [n for n in range(1, 13) if replan_due(n, 4)] == [4, 8, 12]
    assert not any(replan_due(n, 0) for n in range(50))  # 0: off
    assert not replan_due(0, 3)


def test_replan_every_is_checked_and_ddp_schedules_refuse_it():
    with pytest.raises(UserError, match="--replan-every must be >= 0"):
        TrainConfig(replan_every=-1)
    cfg = TrainConfig(replan_every=2)
    for s in ("ddp", "ddp:mgwfbp"):
        with pytest.raises(UserError, match="replan-every runs with dpcomm's runtime"):
            check_schedule(cfg, s)
    assert check_schedule(cfg, "mgwfbp").name == "mgwfbp"


@pytest.mark.slow
def test_two_workers_replan_every_2_iterations_and_stay_identical():
    from dpcomm.train import train

    cfg = TrainConfig(model="lenet5", nproc=2, iters=12, batch_size=8, replan_every=2, profile_iters=1,
                      verify_iters=0, threads=1, progress=False)  # fmt: skip
    r = train(cfg)
    assert len(set(r.params_sha256)) == 1, "replicas differ"
    # profile 1 iteration, plan; then every 2 steady iterations profile 1 again and re-plan
    phases = [rec["phase"] for rec in r.records]
    assert phases == ["profile", "steady", "steady"] * 4
    assert all(rec["plan"] == "single" for rec in r.records if rec["phase"] == "profile")
    lines = [line for line in r.log if "re-plan at iteration" in line]
    assert [int(line.split("iteration ")[1].split(":")[0]) for line in lines] == [4, 7, 10]
    assert all(("kept " in line) != ("switched " in line) and " ms -> " in line for line in lines)
    assert r.plan is not None and r.plan["schedule"] == "mgwfbp"
