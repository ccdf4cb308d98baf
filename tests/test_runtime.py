"""DataParallel on real gloo workers: replicas bitwise identical and equal to single-process SGD.

Budget: about 60 s on a quiet 2-core machine (one 3-rank launch running every training case back to back,
one 3-process spawn for the kill test, and a few process-free unit tests).

Tolerances: float32 cases must match single-process SGD on the concatenated batch to ``1e-5`` (absolute,
parameters of magnitude ~0.5 after 20 momentum-SGD steps; only the summation order differs: the mean of
per-rank means versus one mean). bfloat16 cases: ``2e-2`` (bfloat16 has 8 significant bits, ~4e-3 relative,
and each of 20 steps rounds).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import time

import pytest
import torch

from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.launch import launch
from dpcomm.plan import Plan
from dpcomm.planner.autoplan import fit_linear
from dpcomm.runtime.buckets import GradBuckets
from dpcomm.runtime.spans import layer_times
from tests import _runtime_workers as W

L = 4  # learnable layers of W.MLP and W.Tied
WORLD = 3
F32_TOL, BF16_TOL = 1e-5, 2e-2


COLLECTIVES = ["native", "ring", "lp"]
MODE_COLLECTIVES = [c for c in COLLECTIVES if c != "ring"]  # the LP paper's modes: LP and the baseline
SCHEDULES = ["wfbp", "single", "bucket:1KB", "mgwfbp", "optimal"]
WFBP = Plan.from_sizes("wfbp", [1] * L, L)


def _cases(trace_path: str) -> dict[str, dict]:
    base = COLLECTIVES[0]
    cases: dict[str, dict] = {}
    for c in COLLECTIVES:
        for s in SCHEDULES:
            cases[f"{s}/{c}"] = {"plan": s, "collective": c, "profile_iters": 2}
    cases["network-model"] = {
        "plan": "mgwfbp",
        "collective": base,
        "profile_iters": 2,
        "network": "10gbe",
        "verify_iters": 0,  # the model's plan, not timed against the fallbacks
    }
    sub = {"group": [0, 2], "collective": base, "root": 1, "profile_iters": 2}
    cases["subgroup-mgwfbp"] = {"plan": "mgwfbp", **sub}
    cases["subgroup-lp-alg2"] = {"plan": WFBP, "mode": "lp-alg2", **sub}
    cases["hand-wfbp"] = {"plan": WFBP, "collective": base, "inspect": True, "trace": trace_path}
    cases["hand-2x2"] = {"plan": Plan.from_sizes("x", [2, 2], L), "collective": base, "inspect": True}
    for mode in ("lp-alg1", "lp-alg2", "lp-alg3"):
        for c in MODE_COLLECTIVES:
            cases[f"{mode}/{c}"] = {"plan": Plan.from_sizes("x", [1, 3], L), "collective": c, "mode": mode}
    cases["lp-alg1-planned"] = {"plan": "mgwfbp", "collective": base, "mode": "lp-alg1", "profile_iters": 2}
    cases["lp-alg2-inspect"] = {"plan": WFBP, "collective": base, "mode": "lp-alg2", "inspect": True}
    cases["lp-alg3-k3"] = {"plan": WFBP, "collective": base, "mode": "lp-alg3", "broadcast_every": 3}
    for c in COLLECTIVES:
        cases[f"bn/{c}"] = {
            "plan": Plan.from_sizes("x", [2, 1], 3),
            "collective": c,
            "model": "bn",
            "no_reference": True,
        }
    cases["unused-error"] = {"plan": WFBP, "collective": base, "model": "mlp-skip"}
    cases["unused-allowed"] = {"plan": WFBP, "collective": base, "model": "mlp-skip", "allow_unused": True}
    cases["tied"] = {"plan": WFBP, "collective": base, "model": "tied"}
    cases["no-sync-planned"] = {"plan": "optimal", "collective": base, "micro": 2, "profile_iters": 2}
    cases["clip"] = {"plan": WFBP, "collective": base, "clip": 0.05}
    cases["no-sync"] = {"plan": Plan.from_sizes("x", [2, 2], L), "collective": base, "micro": 3}
    cases["bf16"] = {"plan": WFBP, "collective": base, "dtype": torch.bfloat16}
    cases["fp16"] = {"plan": WFBP, "collective": base, "dtype": torch.float16}
    cases["bf16-f32"] = {
        "plan": WFBP,
        "collective": base,
        "dtype": torch.bfloat16,
        "reduce_dtype": torch.float32,
    }
    other = Plan.from_sizes("x", [2, 2], L)
    cases["mismatch-hand"] = {"plan": [WFBP] + [other] * (WORLD - 1), "collective": base}
    # a free network (no start-up, no per-byte cost): MG-WFBP keeps every layer apart, so the fallback
    # (single) differs from the plan and is timed against it, 2 iterations each
    free = Network(name="free", alpha=0.0, beta=0.0)
    cases["measured"] = {
        "plan": "mgwfbp",
        "collective": base,
        "profile_iters": 2,
        "network": free,
        "verify_iters": 2,
    }
    cases["mismatch-tamper"] = {"plan": "mgwfbp", "collective": base, "profile_iters": 2, "tamper": True}
    cases["after-errors"] = {
        "plan": WFBP,
        "collective": base,
        "double_wrap": True,
    }  # the group still works after the errors
    return cases


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trace") / "timeline.json")
    cases = _cases(trace)
    out = launch(W.run_cases, WORLD, list(cases.values()))
    return {name: [out[r][i] for r in range(WORLD)] for i, name in enumerate(cases)}, trace


def _ok(res, name, tol=F32_TOL):
    per_rank = [r for r in res[name] if not r.get("outside")]
    assert [r["error"] for r in per_rank] == [None] * len(per_rank), per_rank[0]["error"]
    assert len(per_rank[0]["sha"]) == len(per_rank) and len(set(per_rank[0]["sha"])) == 1, (
        f"{name}: replicas differ"
    )
    assert per_rank[0]["diff"] <= tol, f"{name}: {per_rank[0]['diff']} from single-process SGD"
    assert per_rank[0]["records"] == 20
    return per_rank


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("collective", ["native", "ring", "lp"])
def test_planner_names_train_like_one_process(results, schedule, collective):
    res, _ = results
    per_rank = _ok(res, f"{schedule}/{collective}")
    plan = per_rank[0]["plan"]
    assert plan["num_layers"] == L
    for r in per_rank:
        assert r["plan"] == plan
        _check_record_plans(r, schedule)
        # the measured trace: the MLP's layer sizes in forward order, times > 0 on every layer
        assert [p for p, _, _ in r["trace_layers"]] == [8 * 32 + 32, 32 * 32 + 32, 32 * 16 + 16, 16 * 4 + 4]
        assert all(f > 0 and b > 0 for _, f, b in r["trace_layers"])
        assert len(r["cost_points"]) >= 3 and r["cost"][0] >= 0 and r["cost"][1] >= 0
        assert any(line.startswith(f"[rank {r['rank']}] plan {schedule}: ") for line in r["log"])
        assert any("all-reduce cost LinearCost" in line for line in r["log"])


def _check_record_plans(r: dict, schedule: str, verify: int = 3, profiled: int = 2, total: int = 20) -> None:
    """Two profiled iterations with the safe plan; for mgwfbp/optimal the candidates timed round-robin
    (``verify`` iterations each, when the fallbacks differ from the plan); then the kept plan."""
    plans = r["record_plans"]  # (phase, plan label) per iteration
    assert plans[:profiled] == [("profile", "single")] * profiled
    trial = [p for phase, p in plans[profiled:] if phase == "trial"]
    kept = plans[profiled + len(trial) :]
    assert kept == [("steady", r["plan"]["schedule"])] * (total - profiled - len(trial)) and kept
    kept_name = kept[0][1]
    if schedule not in ("mgwfbp", "optimal") or not trial:
        assert kept_name == schedule and not any("measured iteration" in line for line in r["log"])
        return
    names = list(dict.fromkeys(trial))
    assert names[0] == schedule and set(names) <= {schedule, "single", "ddp-buckets"} and len(names) >= 2
    assert trial == names * verify  # round-robin, one iteration each in turn
    chose = [line for line in r["log"] if "measured iteration" in line]
    assert len(chose) == 1 and chose[0].endswith(f"-> keeping {kept_name}") and kept_name in names


@pytest.mark.slow
def test_network_model_prices_the_plan_instead_of_timing(results):
    from dpcomm.costmodel import allreduce_cost
    from dpcomm.costmodel.network import PRESETS

    res, _ = results
    per_rank = _ok(res, "network-model")
    want = allreduce_cost(PRESETS["10gbe"], WORLD, COLLECTIVES[0])
    for r in per_rank:
        assert r["cost_points"] == [] and tuple(r["cost"]) == (want.a, want.b)
        assert r["plan"]["schedule"] == "mgwfbp"


@pytest.mark.slow
def test_planned_plan_is_timed_against_single_and_ddp_buckets(results):
    res, _ = results
    for r in _ok(res, "measured"):
        # the MLP's gradients fit in DDP's first bucket: its buckets are the single plan, timed once
        assert r["record_plans"][2:6] == [("trial", "mgwfbp"), ("trial", "single")] * 2
        _check_record_plans(r, "mgwfbp", verify=2)
        assert any("timing 2 plans for 2 iteration(s) each: mgwfbp [3, 2, 1, 0]" in line for line in r["log"])


@pytest.mark.slow
def test_process_group_subset_with_another_root(results):
    # ranks 0 and 2 train on their own group whose root is group rank 1 (global rank 2); rank 1 is outside
    res, _ = results
    for name in ("subgroup-mgwfbp", "subgroup-lp-alg2"):
        assert res[name][1].get("outside")
        assert len(_ok(res, name)) == 2


@pytest.mark.slow
def test_overlap_queues_groups_during_backward_in_plan_order(results):
    res, trace = results
    for name, groups in (("hand-wfbp", 4), ("hand-2x2", 2)):
        r0 = _ok(res, name)[0]
        assert [lab.split(" (")[0] for lab in r0["comm_labels"]] == [
            f"allreduce group {g}" for g in range(groups)
        ]
        # every group but the last (layer 0's) was queued while backward was still computing
        assert r0["queued_in_backward"] == [True] * (groups - 1) + [False]
        rec = r0["record"]
        assert rec["total_s"] >= rec["forward_s"] + rec["backward_s"] > 0
        assert 0 <= rec["exposed_comm_s"] <= rec["step_s"] <= rec["total_s"]
        assert r0["buffer_bytes"] == r0["grad_bytes"]  # exactly one extra copy of the gradients
    events = json.load(open(trace))["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(range(WORLD))
    for rank in range(WORLD):
        rows = {e["tid"] for e in spans if e["pid"] == rank}
        names = {e["name"] for e in spans if e["pid"] == rank}
        assert rows == {0, 1} and {"forward", "backward", "step"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lp-alg1", "lp-alg2", "lp-alg3"])
def test_lp_bsp_modes_train_like_one_process(results, mode):
    res, _ = results
    for c in MODE_COLLECTIVES:
        _ok(res, f"{mode}/{c}")
    if (
        mode == "lp-alg1"
    ):  # a planner name: profiled with one reduce after backward, then the planner's groups
        # (the LP modes keep the planner's plan: no timed fallbacks)
        plans = _ok(res, "lp-alg1-planned")[0]["record_plans"]
        assert plans == [("profile", "single")] * 2 + [("steady", "mgwfbp")] * 18


@pytest.mark.slow
def test_fork_join_modes_communicate_after_backward(results):
    res, _ = results
    r0 = _ok(res, "lp-alg2-inspect")[0]
    labels = [lab.split(" (")[0] for lab in r0["comm_labels"]]
    assert labels == [f"reduce group {g}" for g in range(L)] + [
        f"broadcast params group {g}" for g in range(L)
    ]
    assert not any(r0["queued_in_backward"])
    _ok(res, "lp-alg3-k3")


@pytest.mark.slow
def test_buffers_follow_the_root(results):
    # batch norm statistics drift apart with each rank's batch; the root's are broadcast at every training
    # forward (so every rank's last forward started from the same running mean), and sync_params() makes the
    # whole state (parameters, running mean/var, the int64 counter) identical, with every collective
    res, _ = results
    for c in COLLECTIVES:
        per_rank = res[f"bn/{c}"]
        assert [r["error"] for r in per_rank] == [None] * WORLD, per_rank[0]["error"]
        assert len({r["bn_seen"] for r in per_rank}) == 1
        assert len(set(per_rank[0]["state_sha"])) == 1 and len(set(per_rank[0]["sha"])) == 1
        assert "bn.num_batches_tracked" in per_rank[0]["state_keys"]


@pytest.mark.slow
def test_unused_parameters(results):
    res, _ = results
    errors = [r["error"] for r in res["unused-error"]]
    assert all(e and "fc2.weight, fc2.bias" in e and "allow_unused=True" in e for e in errors), errors
    _ok(res, "unused-allowed")
    for r in _ok(res, "after-errors"):  # the group still works after the errors; one open wrapper per module
        assert "already wrapped by an open DataParallel" in r["double_wrap"]


@pytest.mark.slow
def test_tied_no_sync_clipping_and_low_precision(results):
    res, _ = results
    _ok(res, "tied")
    _ok(res, "no-sync")
    _check_record_plans(_ok(res, "no-sync-planned")[0], "optimal")
    _ok(res, "clip")
    r0 = _ok(res, "bf16", BF16_TOL)[0]
    assert r0["buffer_bytes"] == r0["grad_bytes"]
    _ok(res, "fp16", BF16_TOL)
    r0 = _ok(res, "bf16-f32", BF16_TOL)[0]
    assert r0["buffer_bytes"] == 2 * r0["grad_bytes"]  # upcast buffers: float32 for bfloat16 gradients


@pytest.mark.slow
def test_plan_mismatch_is_detected_on_every_rank(results):
    res, _ = results
    for name in ("mismatch-hand", "mismatch-tamper"):
        errors = [r["error"] for r in res[name]]
        assert all(e and "PlanMismatchError" in e and "rank(s) 1" in e for e in errors), errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, port: int, victim: int, result_dir: str, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    W.kill_worker(victim, result_dir, timeout_s)


@pytest.mark.slow
def test_killed_worker_makes_the_others_fail_not_hang(tmp_path):
    # Plain spawned processes (not the elastic agent, which would itself kill the survivors at once).
    world, victim, pg_timeout = 3, 1, 10.0
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(target=_spawned, args=(r, world, port, victim, str(tmp_path), pg_timeout))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 90  # spawn + import on a loaded machine, then at most the pg timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not alive, f"ranks {alive} hung after rank {victim} died"
    assert procs[victim].exitcode == 17
    for r in range(world):
        if r == victim:
            continue
        seconds, msg = (tmp_path / f"rank{r}.txt").read_text().splitlines()[:2]
        assert msg.startswith("CommFailure: DataParallel rank"), msg
        assert "failed" in msg and "\n" not in msg


# ----------------------------------------------------------------- process-free units


def test_layer_times_from_timestamps():
    # forward starts at 0, 1, 3 (layer 2 not called), ends at 6; backward starts at 10, gradients of layers
    # 2, 1, 0 arrive at 11, 14, 15 (layer 2 never ready: b = 0)
    f, b = layer_times([0.0, 1.0, None, 3.0], 6.0, [15.0, 14.0, None, 11.0], 10.0)
    assert f == [1.0, 2.0, 0.0, 3.0]
    assert b == [1.0, 3.0, 0.0, 1.0]


def test_fit_linear_recovers_a_and_b():
    cost = fit_linear([(m, 1e-4 + 2e-9 * m) for m in (1_000, 4_000, 64_000, 1_000_000)])
    assert cost.a == pytest.approx(1e-4) and cost.b == pytest.approx(2e-9)
    flat = fit_linear([(1_000, 5e-4), (100_000, 4e-4)])  # noise: decreasing -> constant cost
    assert flat.b == 0 and flat.a == pytest.approx(4.5e-4)


def test_buckets_layout_readiness_and_order():
    model = W.MLP()
    layers = [[m.weight, m.bias] for m in (model.fc1, model.fc2, model.fc3, model.fc4)]
    names = {id(p): n for n, p in model.named_parameters()}
    b = GradBuckets(Plan.from_sizes("x", [2, 2], L), layers, names)
    assert [g.layers for g in b.groups] == [(2, 3), (0, 1)]
    assert b.nbytes == sum(p.numel() * 4 for p in model.parameters())
    for p in model.parameters():
        p.grad = torch.full_like(p, 2.0)
    b.mark_ready(model.fc1.weight)
    b.mark_ready(model.fc1.bias)
    assert b.pop_launchable() == []  # group (0, 1) is complete, but (2, 3) comes first in plan order
    for p in (model.fc4.weight, model.fc4.bias, model.fc3.weight):
        b.mark_ready(p)
    assert [s.name for s in b.missing()] == ["fc3.bias", "fc2.weight", "fc2.bias"]
    with pytest.raises(RuntimeError, match="fc3.weight.*twice"):
        b.mark_ready(model.fc3.weight)
    b.fill_missing_with_zeros()
    assert [g.index for g in b.pop_launchable()] == [0, 1]
    b.pack_grads(b.groups[0])
    b.unpack_grads(b.groups[0], 0.5)
    assert model.fc3.bias.grad.eq(0).all() and model.fc4.weight.grad.eq(1.0).all()
    # layer 3's parameters are one contiguous slice of group 0's buffer (LP Alg. 1 broadcasts it)
    ((_, piece),) = b.layer_slices(3)
    assert piece.numel() == model.fc4.weight.numel() + model.fc4.bias.numel()


def test_bad_arguments_are_one_line_user_errors():
    from dpcomm import DataParallel

    with pytest.raises(UserError, match="unknown DataParallel mode 'lp-alg4'"):
        DataParallel(W.MLP(), plan=WFBP, mode="lp-alg4")
    with pytest.raises(UserError, match="unknown schedule 'fastest'"):
        DataParallel(W.MLP(), plan="fastest")
    with pytest.raises(UserError, match="DataParallel needs torch.distributed"):
        DataParallel(W.MLP(), plan=WFBP)


def test_trial_times_candidates_round_robin_and_keeps_the_fewest_messages_within_the_margin():
    from dpcomm.planner.autoplan import Trial

    a, b, c = (Plan.from_sizes(n, s, L) for n, s in (("mgwfbp", [1, 1, 2]), ("single", [4]), ("ddp", [2, 2])))
    trial = Trial([a, b, c], 2)
    order = []
    for seconds in (0.100, 0.090, 0.0995, 0.102, 0.092, 0.0999):
        assert not trial.complete
        order.append(trial.current.schedule)
        trial.record(seconds)
    assert order == ["mgwfbp", "single", "ddp"] * 2 and trial.complete
    best, medians = trial.choose(None)  # no process group: this process's medians
    assert best is b and medians == pytest.approx([0.101, 0.091, 0.0997])
    fast = Trial([a, c], 1)
    fast.record(0.090)  # the planned plan (3 messages) is 10% faster than DDP's buckets: kept
    fast.record(0.100)
    assert fast.choose(None)[0] is a
    close = Trial([a, c], 1)
    close.record(0.0990)  # 1% apart: within the 2% margin, the plan with fewer messages is kept
    close.record(0.1000)
    assert close.choose(None)[0] is c
    assert close.choose(None, margin=0.001)[0] is a
    # a preferred baseline (DDP's own buckets) is kept within the margin, even against fewer messages,
    # and not outside it (c is 9.6% slower than b)
    assert trial.choose(None, prefer=2)[0] is b
    near = Trial([b, c], 1)
    near.record(0.0990)
    near.record(0.1000)
    assert near.choose(None)[0] is b and near.choose(None, prefer=1)[0] is c


def test_candidates_are_the_plan_single_and_ddp_buckets_once_each():
    from dpcomm.costmodel.base import LinearCost
    from dpcomm.planner.autoplan import build_trace, candidates

    # float32 layer bytes 1.2 MB, 40 KB, 1.2 MB, 20 KB: DDP's first bucket (1 MiB) closes at layer 2
    trace = build_trace("m", list("abcd"), [300_000, 10_000, 300_000, 5_000], [1e-3] * 4, [2e-3] * 4, 8, 4)
    cost = LinearCost(a=1e-4, b=1e-9)
    wfbp = Plan.from_sizes("mgwfbp", [1, 1, 1, 1], L)
    got = candidates(wfbp, trace, cost, 4)
    assert [p.schedule for p in got] == ["mgwfbp", "single", "ddp-buckets"]
    assert got[1].groups == ((0, 1, 2, 3),) and got[2].groups == ((2, 3), (0, 1))
    merged = Plan.from_sizes("optimal", [4], L)  # the same groups as single: timed once
    assert [p.schedule for p in candidates(merged, trace, cost, 4)] == ["optimal", "ddp-buckets"]
