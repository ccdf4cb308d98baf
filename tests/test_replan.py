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


def test_replan_every_is_checked_and_plain_ddp_refuses_it():
    with pytest.raises(UserError, match="--replan-every must be >= 0"):
        TrainConfig(replan_every=-1)
    cfg = TrainConfig(replan_every=2)
    with pytest.raises(UserError, match="--replan-every needs a plan to re-make: use ddp:PLANNER"):
        check_schedule(cfg, "ddp")
    assert check_schedule(cfg, "ddp:mgwfbp").name == "mgwfbp"
    assert check_schedule(cfg, "mgwfbp").name == "mgwfbp"


def _replan_iterations(log: list[str]) -> list[int]:
    lines = [line for line in log if "re-plan at iteration" in line]
    assert all(("kept " in line) != ("switched " in line) and " ms -> " in line for line in lines)
    return [int(line.split("iteration ")[1].split(":")[0]) for line in lines]


@pytest.mark.slow
def test_two_workers_replan_every_2_iterations_and_stay_identical():
    from dpcomm.train import compare_schedules

    cfg = TrainConfig(model="lenet5", nproc=2, iters=12, batch_size=8, replan_every=2, profile_iters=1,
                      verify_iters=0, threads=1, progress=False)  # fmt: skip
    runtime, ddp = compare_schedules(cfg, ["mgwfbp", "ddp:mgwfbp"])
    for r in (runtime, ddp):
        assert len(set(r.params_sha256)) == 1, f"{r.schedule}: replicas differ"
        # profile (or plan) once, then after every 2 steady iterations profile / re-plan again
        assert [rec["phase"] for rec in r.records] == ["profile", "steady", "steady"] * 4, r.schedule
    assert all(rec["plan"] == "single" for rec in runtime.records if rec["phase"] == "profile")
    # the runtime names the first iteration on the kept plan (after its profiling iteration), DDP the
    # iteration it re-planned before
    assert _replan_iterations(runtime.log) == [4, 7, 10]
    assert _replan_iterations(ddp.log) == [3, 6, 9]
    assert runtime.plan is not None and runtime.plan["schedule"] == "mgwfbp"
    # both replicas trained the same batches from the same start: same loss to float tolerance
    assert runtime.loss_final == pytest.approx(ddp.loss_final, rel=1e-4)
