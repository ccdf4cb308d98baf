"""dpcomm inside stock DDP: plans as ``bucket_cap_mb_list`` and dpcomm collectives as comm hooks.

The bucket tests read DDP's real buckets (a recording comm hook's ``GradBucket.parameters()``) on 2 gloo
workers for every planner and several zoo models; the pure tests check the expressibility rule against an
exhaustive search over coarsenings, with DDP's bucket-cutting rule written out independently.
"""

from __future__ import annotations

import itertools
import random

import pytest

from dpcomm.ddp import expressible_plan
from dpcomm.launch import launch
from dpcomm.plan import Plan
from tests import _ddp_workers as W

SCHEDULES = ("wfbp", "single", "bucket:64KB", "mgwfbp", "optimal")
MODELS = ("lenet5", "resnet20", "googlenet")
SKIP = {("googlenet", s) for s in ("single", "bucket:64KB", "mgwfbp")}
"""GoogLeNet costs seconds per case on 2 cores: its 123 layers run with one group per layer and optimal."""


# --------------------------------------------------------------------------------------- pure: the cut rule


def ddp_cut(order: list[int], nbytes: dict[int, int], caps: list[int]) -> list[set[int]]:
    """DDP's reducer rule, written out: walk parameters in ready order, close a bucket once it holds >= its
    cap (the k-th bucket gets caps[k], the last cap repeats); buckets as sets of layers."""
    buckets, cur, size, k = [], set(), 0, 0
    for layer in order:
        cur.add(layer)
        size += nbytes[layer]
        if size >= caps[min(k, len(caps) - 1)]:
            buckets.append(cur)
            cur, size, k = set(), 0, k + 1
    if cur:
        buckets.append(cur)
    return buckets


def _coarsenings(plan: Plan):
    cuts = range(len(plan.groups) - 1)
    for keep in itertools.product((True, False), repeat=len(cuts)):
        sizes, run = [], 0
        for k, g in enumerate(plan.groups):
            run += len(g)
            if k == len(plan.groups) - 1 or keep[k]:
                sizes.append(run)
                run = 0
        yield Plan.from_sizes(plan.schedule, sizes, plan.num_layers)


def test_expressible_plan_is_the_finest_coarsening_ddp_can_cut():
    rng = random.Random(7)
    checked_inexact = 0
    for _ in range(300):
        n = rng.randint(1, 6)
        params = {l: rng.randint(1, 3) for l in range(n)}  # parameters per layer, one element each
        order = [l for l in reversed(range(n)) for _ in range(params[l])]
        for _ in range(rng.randint(0, 2)):  # move a parameter somewhere else in the ready order
            order.insert(rng.randrange(len(order) + 1), order.pop(rng.randrange(len(order))))
        sizes, left = [], n
        while left:
            sizes.append(rng.randint(1, left))
            left -= sizes[-1]
        plan = Plan.from_sizes("x", sizes, n)
        got, dropped = expressible_plan(plan, order)
        nbytes = {l: 4 for l in range(n)}

        def forms(p: Plan, order=order, params=params, nbytes=nbytes) -> bool:
            caps = [4 * sum(params[l] for l in g) for g in p.groups]
            return ddp_cut(order, nbytes, caps) == [set(g) for g in p.groups]

        ok = [p for p in _coarsenings(plan) if forms(p)]
        assert forms(got), (order, plan.groups, got.groups)
        assert len(got.groups) == max(len(p.groups) for p in ok)
        assert len(dropped) == len(plan.groups) - len(got.groups)
        checked_inexact += bool(dropped)
    assert checked_inexact > 20  # the random orders did exercise the fallback


# ----------------------------------------------------------------------------------- real DDP, 2 workers


def _cases():
    cases = [{"model": m, "schedule": s} for m in MODELS for s in SCHEDULES if (m, s) not in SKIP]
    cases.append({"model": "splituse", "schedule": "wfbp"})
    cases.append({"model": "resnet20", "schedule": "mgwfbp", "on_workers": True})
    return cases


@pytest.fixture(scope="module")
def buckets():
    cases = _cases()
    out = launch(W.bucket_cases, 2, cases)
    return {
        (c["model"], c["schedule"], bool(c.get("on_workers"))): [r[i] for r in out]
        for i, c in enumerate(cases)
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "schedule"), [(m, s) for m in MODELS for s in SCHEDULES if (m, s) not in SKIP]
)
def test_ddp_buckets_equal_the_plan(buckets, model, schedule):
    ranks = buckets[(model, schedule, False)]
    r = ranks[0]
    assert r["plan"] == r["requested"] and r["note"] is None and not r["warnings"]
    for other in ranks:
        assert other["sha"] == r["sha"]
        assert other["seen"][1] == r["requested"], f"{model} {schedule}: DDP ran {other['seen'][1]}"


@pytest.mark.slow
def test_the_plans_are_not_trivial(buckets):
    run = [(m, s) for m in MODELS for s in SCHEDULES if (m, s) not in SKIP]
    shapes = {len(buckets[(m, s, False)][0]["requested"]) for m, s in run}
    merged = [buckets[(m, s, False)][0]["requested"] for m, s in run if s in ("mgwfbp", "optimal")]
    assert any(1 < len(p) < sum(map(len, p)) for p in merged), "no planner merged some but not all layers"
    assert len(shapes) > 3


@pytest.mark.slow
def test_a_plan_ddp_cannot_cut_falls_back_and_says_so(buckets):
    r = buckets[("splituse", "wfbp", False)][0]
    assert r["requested"] == [[3], [2], [1], [0]]
    assert r["plan"] == [[3], [0, 1, 2]]  # root's 'post' is ready between c and b, its 'pre' last
    assert r["seen"][1] == r["plan"]
    assert len(r["warnings"]) == 1 and "3|2" not in r["note"] and "2|1" in r["note"] and "1|0" in r["note"]
    # zero compute times: t_iter is the sum of the messages, and two fewer messages save two start-ups
    assert r["extra_s"] == pytest.approx(-2 * W.COST.a)


@pytest.mark.slow
def test_wrap_with_a_planner_name_plans_on_the_workers(buckets):
    ranks = buckets[("resnet20", "mgwfbp", True)]
    assert ranks[0]["sha"] == ranks[1]["sha"]
    for r in ranks:
        assert r["seen"][1] == r["plan"] == r["requested"]
