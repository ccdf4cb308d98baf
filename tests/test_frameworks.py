"""dpcomm's framework integrations (:mod:`dpcomm.integrations`) against the same frameworks without dpcomm
(issue 55): Accelerate, the Hugging Face Trainer and Lightning (DDP and FSDP2) training a small GPT-2 and a
small Llama on 2 gloo ranks, each rank its own batches; torchtitan's own Llama 3 (a small config, built on
``meta``) through ``parallelize_llama`` and through dpcomm's ``planned`` around it; and the naive routes
(findings 1 and 2).

The frameworks tier: ``make test-frameworks`` builds ``.venv-frameworks`` (the ``frameworks`` extra, pinned
in pyproject.toml, with torch 2.13.0) and runs this file with ``DPCOMM_FRAMEWORKS=1``; without that variable
the module is skipped at collection, so ``make test`` never runs it and never needs the frameworks.
``.ci/run`` runs the tier. The exports' checks against the frameworks' own config classes are
tests/test_export_frameworks.py, in the same tier.

One launch of 2 workers runs every case (:mod:`tests._framework_workers`); per case the model, data and
random state are alike for the framework's run and dpcomm's. Asserted per rank: losses within ``rel=1e-5``
and parameters within ``1e-5`` of the framework's own run (the same sums on 2 ranks: bitwise in practice),
the global random state after training the same (the example batch was taken without drawing from it or
the samplers), replicas bitwise equal, and what ran: DDP's buckets, read by a recording comm hook in every
step, are the plan's groups (``ddp.dpcomm.caps.param_groups``, communication order), and one DDP's worth of
elements is all-reduced per step; FSDP2's units (its modules grouped by the parameter group they share, read
from its state) are the plan's ``fully_shard`` calls.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

if os.environ.get("DPCOMM_FRAMEWORKS") != "1":  # not `make test`'s: see the module docstring
    pytest.skip("the frameworks tier: run it with `make test-frameworks`", allow_module_level=True)

from dpcomm.launch import launch  # noqa: E402  (after the skip: `make test` imports nothing of the tier)
from tests import _framework_workers as F  # noqa: E402

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]

MODELS = ("gpt2", "llama")
PAIRED = [
    {"run": "accelerate", "model": m, "plan": p} for m, p in zip(MODELS, ("optimal", "mgwfbp"), strict=True)
] + [
    {"run": "accelerate", "model": "gpt2", "plan": "optimal", "mp": "bf16"},
    *({"run": "trainer", "model": m, "plan": p} for m, p in zip(MODELS, ("mgwfbp", "optimal"), strict=True)),
    *({"run": "lightning", "model": m, "plan": "optimal"} for m in MODELS),
    *({"run": "lightning", "model": m, "plan": "optimal", "fsdp": True} for m in MODELS),
    {"run": "torchtitan", "model": "llama3", "plan": "optimal", "fsdp": True},
]
"""Each integration with each model, against the framework's own run of the same case."""
NAIVE = [{"run": "accelerate-naive", "model": "gpt2"}, {"run": "trainer-naive", "model": "gpt2"}]

CASES = [c | {"dpcomm": d} for c in PAIRED for d in (True, False)] + NAIVE


def _id(c: dict[str, Any]) -> str:
    return "-".join(str(c[k]) for k in ("run", "model", "plan", "mp") if k in c) + (
        "-fsdp" if c.get("fsdp") else ""
    )


@pytest.fixture(scope="module")
def runs() -> list[list[dict[str, Any]]]:
    """Per case, one result per rank."""
    res = launch(F.run_all, 2, CASES)
    return [[r[i] for r in res] for i in range(len(CASES))]


def _ranks(runs: list, case: dict[str, Any]) -> list[dict[str, Any]]:
    got = runs[CASES.index(case)]
    for rank, r in enumerate(got):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
    return got


@pytest.mark.parametrize("case", PAIRED, ids=[_id(c) for c in PAIRED])
def test_the_integration_trains_as_the_framework_does_and_runs_the_plan(runs, case):
    mine, theirs = _ranks(runs, case | {"dpcomm": True}), _ranks(runs, case | {"dpcomm": False})
    for rank, (r, ref) in enumerate(zip(mine, theirs, strict=True)):
        assert len(r["losses"]) == F.STEPS and r["losses"] == pytest.approx(ref["losses"], rel=1e-5), rank
        assert r["params"].keys() == ref["params"].keys()
        diff = max(_max_abs(r["params"][n], ref["params"][n]) for n in r["params"])
        assert diff <= 1e-5, (rank, diff)
        assert r["rng"] == ref["rng"], "planning drew from the random state"
        assert r["replicas"], "replicas differ across ranks"
        if case.get("fsdp"):  # FSDP2's units, from its state, are the plan's fully_shard calls
            assert r["text"].startswith("dpcomm.fsdp.shard: "), r["text"]
            assert [u for u in r["units"] if u != [""]] == [g for g in r["groups"] if g != [""]], r
            assert any("" in u for u in r["units"]), "the root is not sharded"
            continue
        assert r["groups"], "the DDP was not built by dpcomm"
        assert ref["groups"] is None
        for step, seen in enumerate(r["buckets"][1:], start=1):  # DDP rebuilds its buckets after step 0
            assert seen == r["groups"], f"rank {rank} step {step}: DDP ran {seen}, the plan {r['groups']}"
        assert r["elements"] == ref["elements"] == F.STEPS * r["numel"], "not one DDP's all-reduce per step"


def _max_abs(a: Any, b: Any) -> float:
    if isinstance(a, list):
        return max((_max_abs(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


@pytest.mark.parametrize("case", NAIVE, ids=[_id(c) for c in NAIVE])
def test_a_dpcomm_ddp_handed_to_the_framework_stops_in_one_line(runs, case):
    """Findings 1 and 2: before, ``Accelerator.prepare`` put a second DDP around dpcomm's (twice the
    elements all-reduced per step) and ``Trainer(model=...)`` failed at the first step with an empty
    batch. Now either trains as one DDP, or stops in one line naming the integration."""
    for r in runs[CASES.index(case)]:
        if "error" not in r:
            assert r["elements"] == r["numel"], f"{r['elements']} elements all-reduced for {r['numel']}"
            continue
        assert r["error"].startswith("UserError: dpcomm: this model is already DistributedDataParallel"), r
        assert "\n" not in r["error"] and "dpcomm.integrations." in r["error"], r["error"]
