"""dpcomm's DDP plans under ``torch.compile`` (issue 37): ``wrap(torch.compile(model), P, example=x)`` on 2
gloo workers, one launch, the ``aot_eager`` backend (dynamo's graphs and DDPOptimizer's splits are the
backend's input, so inductor's slow CPU compile adds nothing to what is checked).

For ``wfbp`` and a merging planner (``optimal``, ``mgwfbp``) on GPT-2 tiny (the zoo's, tied ``lm_head``)
and on a user's ``nn.TransformerEncoderLayer`` classifier: the plan is made over the units dynamo's graph
can be cut between; DDPOptimizer's subgraphs (its own record, ``ddp.dpcomm.compiled_splits``) are the
plan's groups, one each; DDP's reducer buckets (a recording comm hook) are the plan's groups; three SGD
steps give the losses of plain compiled DDP built with the same caps (``rel=1e-6``); the plan was made on a
compiled copy's times (its own dynamo cache entry: the splits above show that the user's module was still
split), the same on both ranks. Under compiled autograd (``optimize_ddp="python_reducer"``, inductor: its
post-grad pass is where the all-reduces are fused) the compiled backward runs one fused all-reduce per plan
group, read back from the graph, and plain compiled DDP's losses in that mode (``rel=1e-5``); with
``DPCOMM_COMPILE_MATRIX=1`` the same on the models and planners above (``MATRIX``, through inductor's
post-grad passes without code generation). Compiled FSDP2 (``dpcomm.fsdp.shard_compiled``, GPT-2 tiny
``per-block``, ``aot_eager``): FSDP2's own units and prefetch lists equal a plain ``shard``'s of the same
plan, every unit is compiled, the trace's unit times are the compiled units' (averaged over ranks) and
price the plan, and three SGD steps give the losses of plain ``fully_shard`` + per-block compile
(``rel=1e-6``). ``dpcomm train --compile aot_eager`` for ``ddp:optimal`` and ``fsdp:per-block`` ends at
eager's loss (``rel=1e-5``: ``aot_eager`` runs the same aten operations) with identical replicas."""

from __future__ import annotations

import os

import pytest
import torch

from dpcomm.launch import launch
from tests import _compile_workers as W

_PLANNERS = {"gpt2-tiny": ("wfbp", "optimal"), "encoder": ("wfbp", "mgwfbp")}
CASES = [{"model": m, "planner": p} for m, ps in _PLANNERS.items() for p in ps]
"""Every model with ``wfbp`` (a cut per unit) and one merging planner each (``DPCOMM_COMPILE_MATRIX=1`` runs
all three planners on both models under compiled autograd)."""
REDUCER = {
    "model": "nested", "planner": "wfbp", "optimize_ddp": "python_reducer", "backward": "inductor",
    "ref_backward": "inductor-passes",
}  # fmt: skip
"""Compiled autograd: inductor itself compiles the backward (only its post-grad passes fuse DDP's
all-reduces; the forward by ``aot_eager``), on the corpus's smallest user model (three linears, registered
in another order than they run); the reference's backward runs inductor's decompositions and post-grad
passes without its code generation (``_compile_workers.BACKENDS``: one inductor compile, not two)."""

MATRIX = [
    {"model": m, "planner": p, "optimize_ddp": "python_reducer", "backend": "inductor-passes"}
    for m in ("gpt2-tiny", "encoder")
    for p in ("wfbp", "mgwfbp", "optimal")
]
"""Compiled autograd on the models and planners of ``CASES``, through inductor's post-grad passes: tracing
GPT-2 tiny's backward through compiled autograd takes ~20 s a case on the 2-core VM, so this runs only
with ``DPCOMM_COMPILE_MATRIX=1`` (it skips, saying so, otherwise)."""


FSDP = {"model": "gpt2-tiny", "fsdp": "per-block", "backend": "aot_eager"}
"""Compiled FSDP2: ``dpcomm.fsdp.shard_compiled`` (shard, time the compiled units, compile them)."""

TRAIN_CA = {
    "train": dict(model="lenet5", nproc=2, iters=3, batch_size=4, threads=1, profile_iters=1, verify_iters=1,
                  progress=False, compile="inductor", compiled_autograd=True),
    "schedules": ["ddp", "ddp:wfbp"], "passes": True,
}  # fmt: skip
"""``dpcomm train --compile inductor --compiled-autograd`` on the zoo's smallest model: plain ``ddp`` (DDP's
defaults: inductor's greedy fusion) and ``ddp:wfbp`` (a plan group per layer) side by side on the same
batches (``compare_schedules``), through inductor's post-grad passes without its code generation (``passes``:
~25 s more for a real inductor compile here; ``DPCOMM_COMPILE_MATRIX=1`` runs that too)."""

_TRAIN_BASE = dict(model="gpt2-tiny", nproc=2, iters=4, batch_size=4, threads=1, profile_iters=1,
                   verify_iters=1, progress=False)  # fmt: skip
TRAIN_SCHEDULES = ["ddp:optimal", "fsdp:per-block"]
TRAINED = [{"train": _TRAIN_BASE, "schedules": TRAIN_SCHEDULES},
           {"train": {**_TRAIN_BASE, "compile": "aot_eager"}, "schedules": TRAIN_SCHEDULES}]  # fmt: skip
"""``dpcomm train`` on gpt2-tiny, eager and ``--compile aot_eager``, each comparing ``TRAIN_SCHEDULES``."""

REDUCER_AT, FSDP_AT, TRAIN_AT, TRAINED_AT = len(CASES), len(CASES) + 1, len(CASES) + 2, len(CASES) + 3
ALL = CASES + [REDUCER, FSDP, TRAIN_CA, *TRAINED]


@pytest.fixture(scope="module")
def runs():
    """The module's one launch of 2 workers: every case of ``ALL``, one after another; per case, each rank's
    results."""
    out = launch(W.compiled_cases, 2, ALL)
    return [[r[i] for r in out] for i in range(len(ALL))]


@pytest.fixture(scope="module")
def matrix():
    if os.environ.get("DPCOMM_COMPILE_MATRIX") != "1":
        pytest.skip("compiled autograd on every model and planner: set DPCOMM_COMPILE_MATRIX=1 (~1.5 min)")
    out = launch(W.compiled_cases, 2, MATRIX)
    return [[r[i] for r in out] for i in range(len(MATRIX))]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c['model']}-{c['planner']}" for c in CASES])
def test_compiled_ddp_splits_and_buckets_as_planned(runs, index):
    for rank, r in enumerate(runs[index]):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        n = len(r["plan"])
        assert len(r["split_groups"]) == n, r["split_groups"]  # one subgraph per group, no more, no fewer
        for k, groups in enumerate(r["split_groups"]):
            assert k in groups and set(groups) <= {k, n - 1}, (k, groups)  # n - 1: a tied weight's other use
        assert r["seen"] == r["plan"], f"DDP ran {r['seen']}"
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-6)
        assert r["replicas"] and not r["warnings"]
        extra, (f, b) = r["trace_extra"], r["trace_sums"]  # planned on the compiled copy's times
        assert extra["measured_by"] == "dpcomm.ddp.compiled" and extra["backend"] == "aot_eager", extra
        assert f == pytest.approx(extra["compiled_forward_s"], rel=1e-9) and f > 0
        assert b == pytest.approx(extra["compiled_backward_s"], rel=1e-9) and b > 0
        assert r["trace_extra"] == runs[index][0]["trace_extra"]  # every rank plans on the same times
        assert r["untouched"]  # random state and gradients as the user left them
    if CASES[index]["planner"] == "wfbp":
        assert len(runs[index][0]["plan"]) > 10  # many cuts, all under 1 MiB: DDPOptimizer asserted before


def test_fuse_by_plan_on_a_traced_graph():
    """The pass alone, on a graph shaped as compiled autograd's (marked gradient -> div -> all_reduce ->
    wait): one all-reduce per plan group, the markers gone, inductor's concat fusion (no worker)."""
    from torch._inductor.virtualized import V
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    from dpcomm.ddp import compiled_autograd as CA

    c10d = torch.ops._c10d_functional
    key, record = -1, []

    def backward(g1, g2, g3):
        out = []
        for k, (g, bucket) in enumerate(zip((g1, g2, g3), (0, 0, 1), strict=True)):
            marked = torch.ops.dpcomm.planned_grad(g * 1.0, key, bucket, k)
            out.append(c10d.wait_tensor(c10d.all_reduce(marked / 2, "sum", "0")))
        return out

    gm = make_fx(backward, tracing_mode="fake")(torch.ones(3, 2), torch.ones(3), torch.ones(4))
    for n in gm.graph.nodes:
        if isinstance(n.meta.get("val"), torch.Tensor):
            n.meta["tensor_meta"] = _extract_tensor_metadata(n.meta["val"])
    mode = next(n.meta["val"].fake_mode for n in gm.graph.nodes if n.op == "placeholder")
    CA._RECORDS[key] = (("a.weight", "a.bias", "b.weight"), record)
    try:
        with V.set_fake_mode(mode):
            CA.fuse_by_plan(gm.graph)
    finally:
        del CA._RECORDS[key]
    targets = [n.target for n in gm.graph.nodes]
    assert targets.count(c10d.all_reduce.default) == 2
    assert torch.ops.dpcomm.planned_grad.default not in targets
    assert record == [[["a.weight", "a.bias"], ["b.weight"]]]
    assert CA.conflict() is None  # inductor's later all-reduce bucketing is off by default ...
    with torch._inductor.config.patch(bucket_all_reduces_fx="all"):  # ... on, it is one line in wrap
        assert "bucket_all_reduces_fx='all'" in CA.conflict() and "\n" not in CA.conflict()


def _check_fused(results: list[dict], greedy: int | None = None) -> None:
    for rank, r in enumerate(results):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert len(r["fused"]) == 1, r["fused"]  # one backward graph, compiled once, read back after the pass
        # one fused all-reduce per plan group, each the group's parameters, in communication order
        assert [sorted(b) for b in r["fused"][0]] == [sorted(g) for g in r["plan_groups"]], r["fused"]
        assert greedy is None or r["ref_buckets"] == greedy  # inductor's greedy pass, on plain DDP
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-5)  # plain compiled DDP in that mode
        assert r["replicas"] and not r["warnings"] and not r["notes"]


def test_compiled_trace_gives_each_unit_its_compiled_times():
    """Each unit's compiled time is split over its layers as the eager profile split it (no worker)."""
    from dpcomm.fsdp.compiled import compiled_trace
    from dpcomm.trace.format import Layer, Trace

    eager = [(1.0, 2.0), (3.0, 6.0), (0.0, 0.0), (0.0, 0.0)]
    layers = tuple(
        Layer(name=f"l{i}", params=4, forward_s=f, backward_s=b, param_names=(f"l{i}.w",))
        for i, (f, b) in enumerate(eager)
    )
    trace = Trace(model="m", batch_size=1, device="cpu", dtype_bytes=4, layers=layers)
    out = compiled_trace(trace, [(0, 1), (2, 3)], [2.0, 0.5], [4.0, 1.0], "inductor")
    split = [(x.forward_s, x.backward_s) for x in out.layers]
    assert split == [(0.5, 1.0), (1.5, 3.0), (0.25, 0.5), (0.25, 0.5)]  # unit 1: no eager time, split evenly
    assert out.extra["measured_by"] == "dpcomm.fsdp.compiled" and out.extra["backend"] == "inductor"
    assert (out.extra["eager_unit_forward_s"], out.extra["eager_unit_backward_s"]) == ([4.0, 0.0], [8.0, 0.0])
    assert trace.layers == layers  # the eager trace is left as it was


@pytest.mark.slow
def test_compiled_autograd_fuses_the_plans_buckets(runs):
    assert len(runs[REDUCER_AT][0]["plan_groups"]) == 3  # wfbp: a group per linear, inductor's greedy: one
    _check_fused(runs[REDUCER_AT], greedy=1)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(MATRIX)), ids=[f"{c['model']}-{c['planner']}" for c in MATRIX])
def test_compiled_autograd_matrix(matrix, index):
    _check_fused(matrix[index])
    if MATRIX[index]["planner"] == "wfbp":
        assert len(matrix[index][0]["plan_groups"]) > 10


@pytest.mark.slow
def test_compiled_fsdp_keeps_units_and_prefetch_and_prices_compiled_times(runs):
    for rank, r in enumerate(runs[FSDP_AT]):
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert r["state"] == r["uncompiled_state"]  # FSDP2's units and prefetch lists: as a plain shard's
        assert r["sha"] == r["twin_sha"]  # the same plan (units, depth, reshard)
        assert r["compiled"] == r["unit_paths"]  # every unit but the root compiled in place
        assert r["measured_by"] == "dpcomm.fsdp.compiled" and r["backend"] == "aot_eager"
        n = len(r["layer_sums"])
        assert len(r["unit_forward_s"]) == len(r["unit_backward_s"]) == n
        for (f, b), uf, ub in zip(r["layer_sums"], r["unit_forward_s"], r["unit_backward_s"], strict=True):
            assert f == pytest.approx(uf, rel=1e-9) and b == pytest.approx(ub, rel=1e-9)  # the compiled times
        assert sum(r["unit_backward_s"]) > 0 and r["time_s"] > 0 and r["time_s"] != r["eager_time_s"]
        assert r["losses"] == pytest.approx(r["ref_losses"], rel=1e-6)  # fully_shard + compile per block
        assert r["replicas"] and not r["warnings"]
    assert runs[FSDP_AT][0]["unit_forward_s"] == runs[FSDP_AT][1]["unit_forward_s"]  # averaged over ranks
    assert runs[FSDP_AT][0]["time_s"] == runs[FSDP_AT][1]["time_s"]


@pytest.fixture(scope="module")
def trained(runs):
    """``TRAINED``'s runs by schedule: (eager, compiled) :class:`TrainResult` (rank 0's, as ``train``)."""
    from dpcomm.train.config import TrainResult

    eager, compiled = (runs[TRAINED_AT + k][0] for k in (0, 1))
    for got in (eager, compiled):
        assert "error" not in got, f"{got.get('error')}\n{got.get('trace')}"
    eager, compiled = ([TrainResult(**r) for r in got["results"]] for got in (eager, compiled))
    return dict(zip(TRAIN_SCHEDULES, zip(eager, compiled, strict=True), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", TRAIN_SCHEDULES)
def test_train_compile_trains_like_eager(trained, schedule):
    eager, compiled = trained[schedule]
    assert compiled.loss_final == pytest.approx(eager.loss_final, rel=1e-5)
    assert len(set(compiled.params_sha256)) == 1  # replicas identical
    assert compiled.iterations == eager.iterations == 4


def _check_train_compiled_autograd(results: list[dict]) -> None:
    """Plain ``ddp`` and ``ddp:wfbp`` under ``--compiled-autograd`` (rank 0's results, ``TRAIN_CA``)."""
    from dpcomm.train.config import TrainResult
    from dpcomm.train.report import predict

    assert "error" not in results, f"{results.get('error')}\n{results.get('trace')}"
    plain, planned = (TrainResult(**r) for r in results["results"])
    assert planned.loss_final == pytest.approx(plain.loss_final, rel=1e-5)  # plain compiled-autograd DDP's
    for r in (plain, planned):
        assert len(set(r.params_sha256)) == 1 and r.iterations == 3  # replicas identical
        assert all(x["compiled_autograd"] for x in r.records)
    layers = planned.trace["layers"]
    groups = [sorted(n for u in g for n in layers[u]["param_names"]) for g in planned.plan["groups"]]
    assert [sorted(b) for b in planned.compiled_buckets] == groups and len(groups) == 4  # wfbp: one per layer
    assert planned.compiled_allreduces == 4 and plain.compiled_allreduces >= 1  # inductor's greedy buckets
    extra = planned.trace.get("extra", planned.trace)
    assert extra["measured_by"] == "dpcomm.ddp.compiled" and extra["backend"] == "inductor"  # compiled times
    assert predict(planned) is not None  # --json's predicted_t_iter_s
    assert planned.to_json()["compiled_buckets"] == planned.compiled_buckets
    assert plain.to_json()["compiled_allreduces"] == plain.compiled_allreduces


@pytest.mark.slow
def test_train_compiled_autograd_runs_the_plans_buckets(runs):
    _check_train_compiled_autograd(runs[TRAIN_AT][0])


@pytest.mark.slow
def test_train_compiled_autograd_with_inductor():
    """``TRAIN_CA`` with inductor's code generation: ``DPCOMM_COMPILE_MATRIX=1`` (~25 s more)."""
    if os.environ.get("DPCOMM_COMPILE_MATRIX") != "1":
        pytest.skip("dpcomm train --compiled-autograd, inductor's code generation: DPCOMM_COMPILE_MATRIX=1")
    out = launch(W.compiled_cases, 2, [{**TRAIN_CA, "passes": False}])
    _check_train_compiled_autograd(out[0][0])
