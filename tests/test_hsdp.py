"""``dpcomm.fsdp.shard(..., mesh=...)``: HSDP on 4 gloo ranks against plain DDP (issue 40).

One launch of 4 workers (:func:`tests._user_workers.shard_cases`): each case is sharded on a 2 x 2 mesh
(two replicas of 2-rank shard groups), given as a shard group size, as a ``DeviceMesh`` the user built, or
chosen by the planner (``"auto"``), and must train like plain DDP over the 4 ranks: three SGD steps with
the same losses (``rel=1e-5``: HSDP averages in two steps, a reduce-scatter within the group then an
all-reduce across, so sums are rounded in another order than DDP's one all-reduce), gradients and
parameters within ``atol=1e-5``, replicas equal across ranks. The parameters must be FSDP2's HSDP
DTensors: a 2-D mesh, ``(Replicate, Shard)``. Bad ``mesh=`` is one line on every rank.

The same launch runs ``shard(..., mp_policy=MixedPrecisionPolicy(bf16, fp32))`` on every model of the
corpus (:mod:`tests._corpus`, and the zoo's GPT-2) against plain ``fully_shard`` calls with that policy
over the same modules (:mod:`tests._precision_workers`; FSDP over the 4 ranks, or over a pair of them, two
models at a time; each rank on its own batch): every ``fully_shard`` call holds the same modules and
parameters in both, and both cast the same fp32 shards to bf16 and reduce in fp32 over the same units, so
the losses are expected equal; ``rel=2**-8`` (bf16's unit roundoff) is the dtype's tolerance. That the
policy is in force is checked apart: outputs come in bf16, and (two models) the losses differ from the fp32
run's. A model plain FSDP2 cannot run with
the policy is named in :data:`CANNOT` with the reason, and both refusals are checked. FSDP2's other
keywords (``offload_policy``, ``ignored_params``) run in the same launch against plain FSDP2 with them.
"""

from __future__ import annotations

import pytest

from dpcomm.launch import launch
from tests import _precision_workers as P
from tests import _user_workers as W
from tests._corpus import CORPUS

pytestmark = pytest.mark.slow

CASES = [
    {"model": "decoder", "planner": "optimal", "memory": None, "mesh": 2},
    {"model": "bn", "planner": "per-block", "memory": None, "mesh": "2x2"},  # the user's DeviceMesh
    {"model": "encoder", "planner": "optimal", "memory": None, "mesh": "auto"},
]
BAD = [3, "rows", "1x2x2"]
"""Meshes that cannot be: 3 does not divide 4 ranks, a word, a 3-D ``DeviceMesh``."""


def _user_mesh(spec):
    """``"AxB.."`` as the user builds it (``init_device_mesh``), other specs as given."""
    from torch.distributed.device_mesh import init_device_mesh

    if isinstance(spec, str) and "x" in spec:
        shape = tuple(int(x) for x in spec.split("x"))
        names = ("replicate", "shard") if len(shape) == 2 else None
        return init_device_mesh("cpu", shape, mesh_dim_names=names)
    return spec


CANNOT = {
    "bn": (
        "expected scalar type BFloat16 but found Float",
        "FSDP2 casts BatchNorm's weight to bf16 but not its running statistics (buffers, fp32), and batch "
        "norm on the CPU takes one dtype",
    ),
}
"""Corpus models plain FSDP2 cannot run with ``MixedPrecisionPolicy(bf16, fp32)``: what it raises, and why."""
FULL = [
    {"model": "gpt2-tiny", "planner": "optimal", "full": True},
    {"model": "decoder", "planner": "per-block", "full": True},
]
"""Cases whose plan's prices under the policy are checked too, and which also run without it."""
SWEEP = [{"model": m, "planner": "per-block"} for m in CORPUS if m not in ("decoder", *CANNOT)]
"""The rest of the corpus, run two cases at a time on two pairs of ranks (:func:`tests._precision_workers.
pair_cases`: FSDP over 2 ranks, half the processes per case)."""
PRECISION = FULL + SWEEP
"""``shard`` with FSDP2's mixed-precision policy against plain ``fully_shard`` with it."""
IGNORED = ("head.weight", "head.bias")
KEYWORDS = [
    {"model": "lora", "planner": "per-block", "offload": True},  # with the bf16 policy, as recipes pair them
    {"model": "lora", "planner": "per-block", "ignored": IGNORED, "mp": False},
]
"""FSDP2's other keywords through ``shard``: ``offload_policy=CPUOffloadPolicy(pin_memory=False)`` (pinning
needs an accelerator: refused in one line, tests/test_fsdp_keywords.py), ``ignored_params`` (the LoRA model's
head; without the policy: FSDP2 leaves ignored parameters in fp32, and the head would take bf16 inputs)."""
PER_RANK = ("moe-top1", "moe-top2", "tasks", "switch")
"""Models whose ranks' batches use other parameters: ``shard`` has FSDP2 reduce-scatter zeros for them
(``set_reduce_scatter_unused_params``, as DDP's ``find_unused_parameters`` sums), and the plain run too."""
BAD_KEYWORDS = {
    "bogus": ({"bogus": 1}, "fully_shard takes no keyword 'bogus'; it takes"),
    "mp_policy": ({"mp_policy": "bf16"}, "mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy"),
    "reshard_after_forward": ({"reshard_after_forward": False}, "reshard_after_forward is the plan's choice"),
}
"""Keywords ``shard`` refuses in one line before planning (FSDP2 would raise from the middle of sharding, or
not at all), and what it says (the rest: tests/test_fsdp_keywords.py)."""
ALL = [
    *FULL,
    *({"model": m, "planner": "per-block", "cannot": True} for m in CANNOT),
    *KEYWORDS,
    *({"model": "lora", "planner": "per-block", "bad": kw} for kw, _ in BAD_KEYWORDS.values()),
]


def _all(cases, bad, precision, sweep):  # one launch (module level: spawned workers import it)
    cases = [{**c, "mesh": _user_mesh(c["mesh"])} for c in cases]
    out = W.shard_cases(cases)
    case = {"model": "lora", "planner": "per-block", "memory": None}
    errs = [W.shard_cases([{**case, "mesh": _user_mesh(spec)}])[0].get("error") for spec in bad]
    return out, errs, P.precision_cases(precision), P.pair_cases(sweep)


@pytest.fixture(scope="module")
def runs():
    return launch(_all, 4, CASES, BAD, ALL, SWEEP)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c['model']}-{c['mesh']}" for c in CASES])
def test_hsdp_on_a_2x2_mesh_trains_like_plain_ddp(runs, index):
    case = CASES[index]
    for rank, (out, *_) in enumerate(runs):
        r = out[index]
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert r["rng_same"], "shard changed the caller's random state"
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-5), "losses differ from plain DDP"
        assert r["grad_diff"] <= 1e-5 and r["param_diff"] <= 1e-5, (r["grad_diff"], r["param_diff"])
        assert r["replicas"], "replicas differ across ranks"
        if case["mesh"] != "auto":
            assert r["shard_group"] == 2 and r["mesh_shape"] == [2, 2], r
            assert r["placements"] == ["Replicate", "Shard"], r
            assert r["priced_all_reduce"], "the plan was made without the all-reduce across the replicas"
            assert "HSDP: shard groups of 2 ranks" in r["text"].splitlines()[0]
        else:  # the planner's choice runs: its group size is the mesh's last dim
            G = r["shard_group"] or 4
            assert r["mesh_shape"][-1] == G and G in (1, 2, 4), r
    assert len({str(out[index].get("shard_group")) for out, *_ in runs}) == 1, "ranks chose different meshes"


@pytest.mark.parametrize("index", range(len(BAD)), ids=[str(b) for b in BAD])
def test_a_mesh_that_cannot_be_is_one_line_on_every_rank(runs, index):
    errors = [errs[index] for _, errs, *_ in runs]
    assert all(e is not None and e.startswith("UserError: dpcomm.fsdp.shard: mesh") for e in errors), errors
    assert len(set(errors)) == 1 and "\n" not in errors[0]


def _same_calls(r: dict) -> None:
    """Every ``fully_shard`` call of ``shard``'s run is the plain run's: the same modules, the same
    parameters in its group; every trained parameter is in one."""
    assert r["calls"] == r["ref_calls"], (r["calls"], r["ref_calls"])
    held = [n for _, names in r["calls"] for n in names]
    assert len(held) == len(set(held)) and set(r["gathered"]) <= set(held), (held, r["gathered"])


def _precision(runs, index: int) -> list[tuple[int, dict]]:
    """``(rank, report)`` of each rank that ran ``PRECISION[index]``: every rank for :data:`FULL`, the
    case's pair for :data:`SWEEP` (ranks 0-1 the even cases, 2-3 the odd)."""
    if index < len(FULL):
        return [(rank, out[index]) for rank, (_, _, out, _) in enumerate(runs)]
    j = index - len(FULL)
    return [(rank, runs[rank][3][j // 2]) for rank in (2 * (j % 2), 2 * (j % 2) + 1)]


@pytest.mark.parametrize("index", range(len(PRECISION)), ids=[c["model"] for c in PRECISION])
def test_shard_with_a_policy_trains_as_plain_fully_shard_with_it(runs, index):
    for rank, r in _precision(runs, index):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        _same_calls(r)
        assert r["policies"] == [("torch.bfloat16", "torch.float32")] * len(r["calls"]), r["policies"]
        out = (
            "torch.float32" if PRECISION[index]["model"] == "mixed" else "torch.bfloat16"
        )  # it casts its own
        assert r["dtypes"] == r["ref_dtypes"] == [out] * 3
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=2.0**-8)
        assert r["param_diff"] <= 2.0**-8, r["param_diff"]
        if "fp32_losses" in r:
            assert len(r["calls"]) > 1
            assert r["losses"] != r["fp32_losses"], "the policy made no difference: not applied"
        assert r["replicas"] and not r["ignored_differ"]
        assert bool(r["zeros_for"]) == (PRECISION[index]["model"] in PER_RANK), r["zeros_for"]


def test_every_corpus_model_is_compared_or_named_with_why_not():
    assert {c["model"] for c in PRECISION} | set(CANNOT) == {*CORPUS, "gpt2-tiny"}
    assert not set(CANNOT) & {c["model"] for c in PRECISION}


@pytest.mark.parametrize("model", list(CANNOT))
def test_where_plain_fsdp2_cannot_run_the_policy_shard_refuses_in_one_line(runs, model):
    """The model's reason holds (plain FSDP2 raises it), and ``shard`` refuses before sharding, in one line
    naming the same error, on every rank."""
    said, _ = CANNOT[model]
    index = ALL.index({"model": model, "planner": "per-block", "cannot": True})
    errors = [out[index].get("shard_error") for _, _, out, _ in runs]
    for _, _, out, _ in runs:
        assert said in out[index]["plain_error"], out[index]
    assert all(e and said in e and "\n" not in e for e in errors), errors
    assert len(set(errors)) == 1


def test_offload_policy_reaches_every_unit_and_trains_as_plain_fsdp2_with_it(runs):
    for rank, (_, _, out, _) in enumerate(runs):
        r = out[ALL.index(KEYWORDS[0])]
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        _same_calls(r)
        held = [c for c in r["calls"] if c[1]]  # the calls holding parameters (not the bare root's)
        assert len(held) > 1 and r["offloads"] == ["CPUOffloadPolicy:True"] * len(held), r["offloads"]
        assert r["policies"] == [("torch.bfloat16", "torch.float32")] * len(r["calls"])
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=2.0**-8) and r["replicas"]
        assert r["param_diff"] <= 2.0**-8


def test_ignored_params_are_in_no_unit_and_train_as_plain_fsdp2_leaves_them(runs):
    """FSDP2 leaves ignored parameters whole and unreduced: each rank's own (its own batch), as in plain
    FSDP2 with the same ``ignored_params``; no ``fully_shard`` call holds them and ``shard`` plans no
    gather of them."""
    for rank, (_, _, out, _) in enumerate(runs):
        r = out[ALL.index(KEYWORDS[1])]
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        _same_calls(r)
        assert r["plain_params"] == sorted(IGNORED), r["plain_params"]
        assert not set(IGNORED) & {n for _, names in r["calls"] for n in names}
        assert not set(IGNORED) & set(r["gathered"]), "shard planned gathers of ignored parameters"
        assert all(m != "head" for mods, _ in r["calls"] for m in mods), "a unit of ignored parameters only"
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-6) and r["param_diff"] <= 1e-6
        assert r["replicas"] and r["ignored_differ"], "ignored parameters are each rank's own in FSDP2"


@pytest.mark.parametrize("index", range(len(FULL)), ids=[c["model"] for c in FULL])
def test_shard_plans_and_bounds_in_the_policys_dtypes(runs, index):
    """``shard``'s own plan and bound follow ``mp_policy``: the plan is the planner's under bf16 gathers and
    fp32 reductions, the bound counts the gathered parameters in bf16 (half the fp32 bytes), the units
    were timed computing in bf16, and ``str(model.dpcomm)`` says so (with the certificate of ``optimal``)."""
    for rank, (_, _, out, _) in enumerate(runs):
        r = out[index]
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert r["meta_precision"] == {"param_dtype": "bf16", "reduce_dtype": "fp32"}, r["meta_precision"]
        assert r["requested"][:3] == r["planner"][:3], (r["requested"], r["planner"])
        assert r["requested"][3:] == pytest.approx(r["planner"][3:], rel=1e-12)
        assert 2 * r["bound"] == r["fp32_bound"] > 0, (r["bound"], r["fp32_bound"])
        assert r["computed_in"] == "bfloat16"
        first = r["text"].splitlines()[0]
        assert "param_dtype bf16, reduce_dtype fp32" in first and f"{r['bound']:,} bytes" in first, first
        assert r["certified"] == (FULL[index]["planner"] == "optimal")
        assert ("certified lower bound" in r["text"]) == r["certified"], r["text"]


@pytest.mark.parametrize("name", list(BAD_KEYWORDS))
def test_a_keyword_shard_cannot_pass_is_one_line_on_every_rank(runs, name):
    kw, said = BAD_KEYWORDS[name]
    errors = [
        out[ALL.index({"model": "lora", "planner": "per-block", "bad": kw})]["shard_error"]
        for _, _, out, _ in runs
    ]
    assert all(said in e and "\n" not in e for e in errors) and len(set(errors)) == 1, errors
