"""``dpcomm.ddp.wrap`` and ``dpcomm.fsdp.shard`` on models from transformers, diffusers and torch-geometric
(:mod:`tests._corpus_thirdparty`), against plain DDP and plain FSDP2 (issue 54, item 1).

The third-party tier: ``make test-thirdparty`` installs the ``thirdparty`` extra (pinned in pyproject.toml)
into ``.venv`` and runs this file with ``DPCOMM_THIRDPARTY=1``; without that variable the whole module is
skipped at collection, so ``make test`` (whose two selections, ``-m "not slow and not testbed"`` and its
complement, would otherwise both reach it) never runs it and never needs the extra. ``.ci/run`` runs the
tier after ``make test``.

Two launches of 2 gloo workers (:mod:`tests._thirdparty_workers`), each rank with its own batch: the first
runs every ``wrap`` case and the ``shard`` cases of the dense models, the second the ``shard`` cases of the
routed-expert models (a collective mismatch there aborts its workers in gloo, and would take every other
result with it). Per case the model and the random state are built and seeded alike for dpcomm and for the
reference, and three plain SGD steps (no momentum) are trained on each:

- ``wrap``, every DDP mode plain DDP can run the model in (its default, ``find_unused_parameters``,
  ``static_graph``), the three planners in turn: against plain DDP with the same buckets, losses within
  ``rel=1e-6``, last gradients and parameters within ``1e-6`` (the same sums: bitwise in practice), the
  random state untouched, replicas equal across ranks, DDP's buckets (read by a recording comm hook) the
  plan's groups;
- ``shard`` with ``optimal`` (and ``per-block`` on the routed-expert models), without ``mp_policy``:
  against plain DDP, within ``rel=1e-5`` / ``1e-5`` (reduce-scatter and all-reduce sum in another order);
  with ``MixedPrecisionPolicy(bf16 parameters, fp32 reductions)``: against plain FSDP2 given the same
  policy on the modules dpcomm chose (``model.dpcomm.groups``), called in the same order, within the same
  ``1e-5`` (the same casts and the same sums: bitwise in practice; a unit cast elsewhere would differ by
  bf16's ``~4e-3``); the random state untouched, no sharded copy of the trial left alive, replicas equal,
  no unit returning a view.

The routed-expert models' ``static_graph`` and, under ``mp_policy``, their float32 routers are left out,
for plain PyTorch cannot run them (docs/models_tried.md says why).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from dpcomm.launch import launch
from tests import _thirdparty_workers as T
from tests._corpus import STATIC, UNUSED
from tests._corpus_thirdparty import THIRDPARTY

if os.environ.get("DPCOMM_THIRDPARTY") != "1":  # not `make test`'s: see the module docstring
    pytest.skip("the third-party tier: run it with `make test-thirdparty`", allow_module_level=True)

pytestmark = [pytest.mark.thirdparty, pytest.mark.slow]

PLANNERS = ("optimal", "mgwfbp", "wfbp")
MODELS = ("gpt2", "t5", "switch", "nllb-moe", "unet", "gcn")
ROUTED = ("switch", "nllb-moe")
"""Models whose tokens decide which experts a rank runs (and NLLB-MoE's LayerDrop which layers)."""


def _mode_name(kw: dict) -> str:
    return "+".join(sorted(kw)) or "default"


WRAP_CASES = [
    {"model": m, "planner": p, "ddp": kw}
    for i, m in enumerate(MODELS)
    for j, kw in enumerate(THIRDPARTY[m][2])
    for p in (PLANNERS if len(THIRDPARTY[m][2]) == 1 else (PLANNERS[(i + j) % 3],))
]
"""Every model in every DDP mode plain DDP runs it in, a planner each, in turn (each planner on each model
with three modes); the routed-expert models (one mode) with all three."""

SHARD_CASES = [
    {"model": f"{m}-bf16-router" if mp and m in ROUTED else m, "planner": "optimal", "mp": mp}
    for m in MODELS
    for mp in (False, True)
] + [{"model": m, "planner": "per-block", "mp": False} for m in ROUTED]
"""``optimal`` without and with ``mp_policy``; the routed-expert models with ``per-block`` too (no trial).
Under ``mp_policy`` those have a bf16 router (``router_dtype="bfloat16"``): with the float32 default their
router casts its classifier to float32 inside FSDP2's forward, and plain FSDP2 fails ("FSDP reduce-scatter
expects uniform gradient dtype")."""

LAUNCHES = {
    "main": ([c for c in WRAP_CASES], [c for c in SHARD_CASES if not c["model"].startswith(ROUTED)]),
    "routed-shard": ([], [c for c in SHARD_CASES if c["model"].startswith(ROUTED)]),
}


def _where(door: str, case: dict) -> tuple[str, int]:
    """The launch that runs ``case`` and its index there."""
    for name, cases in LAUNCHES.items():
        got = cases[0 if door == "wrap" else 1]
        if case in got:
            return name, got.index(case)
    raise KeyError(case)


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    """Per launch: ``(wrap results, shard results)``, each a list per case of one result per rank; or the
    launch's one-line failure."""
    out: dict[str, Any] = {}
    for name, (wrap, shard) in LAUNCHES.items():
        try:
            res = launch(T.run_all, 2, wrap, shard)
        except Exception as exc:  # a worker died (gloo aborts): every case of that launch says so
            out[name] = f"{type(exc).__name__}: {exc}"
            continue
        out[name] = (
            [[r[0][i] for r in res] for i in range(len(wrap))],
            [[r[1][i] for r in res] for i in range(len(shard))],
        )
    return out


def _ranks(runs: dict[str, Any], door: str, case: dict) -> list[dict[str, Any]]:
    name, i = _where(door, case)
    got = runs[name]
    assert not isinstance(got, str), f"launch '{name}' failed: {got}"
    return got[0 if door == "wrap" else 1][i]


def _runs_the_plan(seen: list, buckets: list, plan: list[list[int]]) -> bool:
    """DDP's buckets (``[units, dtype]``, communication order) are the plan's, the groups in its order (a
    group's buckets in any order)."""
    group = {u: k for k, g in enumerate(plan) for u in g}
    order = [group[units[0]] for units, _ in seen]
    key = lambda b: (group[b[0][0]], b[0], b[1])  # noqa: E731
    return order == sorted(order) and sorted(seen, key=key) == sorted(buckets, key=key)


@pytest.mark.parametrize(
    "case", WRAP_CASES, ids=[f"{c['model']}-{c['planner']}-{_mode_name(c['ddp'])}" for c in WRAP_CASES]
)
def test_wrap_trains_like_plain_ddp_and_runs_the_plan(runs, case):
    for rank, r in enumerate(_ranks(runs, "wrap", case)):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert r["rng_same"], "wrap changed the caller's random state"
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-6), "losses differ from plain DDP"
        assert r["grad_diff"] <= 1e-6 and r["param_diff"] <= 1e-6, (r["grad_diff"], r["param_diff"])
        assert r["replicas"], "replicas differ across ranks"
        assert _runs_the_plan(r["seen"], r["buckets"], r["plan"]), f"DDP ran {r['seen']}, plan {r['buckets']}"
        if case["ddp"] != STATIC:
            assert r["plan"] == r["requested"] and not r["dropped"], "a cut of the plan was dropped"
        if rank > 0:
            assert r["warnings"] == [], "warnings are said on rank 0 only"


def _shard_id(c: dict) -> str:
    return f"{c['model']}-{c['planner']}-{'mp' if c['mp'] else 'fp32'}"


REFUSED = {"nllb-moe-bf16-router-optimal-mp": "its inputs cast only where a unit starts"}
"""Cases ``shard`` must refuse in one line. NLLB-MoE under ``mp_policy``: its LayerDrop skips layers on some
ranks, so no layer may be a unit (a unit one rank runs and another skips breaks the collectives), and in one
unit over the whole model FSDP2 casts only the model's integer inputs: its float32 positions meet bf16 norms
("mixed dtype (CPU)"), as they do under plain ``fully_shard`` on the same modules."""


@pytest.mark.parametrize("case", SHARD_CASES, ids=[_shard_id(c) for c in SHARD_CASES])
def test_shard_trains_like_plain_ddp_and_plain_fsdp2(runs, case):
    ranks = _ranks(runs, "shard", case)
    if _shard_id(case) in REFUSED:
        errors = [r.get("error", "") for r in ranks]
        assert all(e.startswith("UserError: ") and REFUSED[_shard_id(case)] in e for e in errors), errors
        assert "\n" not in errors[0] and len(set(errors)) == 1, errors
        return
    for rank, r in enumerate(ranks):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert r["rng_same"], "shard changed the caller's random state"
        assert r["lingering"] == 0, "the trial's sharded copies outlive shard (SIGABRT at exit)"
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-5), (r["losses"], r["ref_losses"])
        assert r["grad_diff"] <= 1e-5 and r["param_diff"] <= 1e-5, (r["grad_diff"], r["param_diff"])
        assert r["replicas"], "replicas differ across ranks"
        assert r["view_warnings"] == [], r["view_warnings"]
        assert r["text"].startswith("dpcomm.fsdp.shard: ") and r["modules"], r["text"]


def test_the_corpus_covers_every_door():
    """Each model through ``wrap`` in each of its DDP modes and ``shard`` with and without ``mp_policy``;
    the modes plain DDP runs: all three for the dense models, ``find_unused_parameters`` for the routed."""
    assert {(c["model"], _mode_name(c["ddp"])) for c in WRAP_CASES} == {
        (m, _mode_name(kw)) for m in MODELS for kw in THIRDPARTY[m][2]
    }
    assert all(THIRDPARTY[m][2] == (UNUSED,) for m in ROUTED)
    assert {c["planner"] for c in WRAP_CASES if c["model"] in ("gpt2", "t5", "unet", "gcn")} == set(PLANNERS)
    assert {(c["model"].removesuffix("-bf16-router"), c["mp"]) for c in SHARD_CASES} == {
        (m, mp) for m in MODELS for mp in (False, True)
    }
