"""Worker functions for tests/test_compile.py: ``dpcomm.ddp.wrap`` on a compiled model (``DDP(torch.compile
(model))``, the pattern dynamo's DDPOptimizer serves), against plain compiled DDP with the same buckets
(module level: the launcher spawns workers that import them)."""

from __future__ import annotations

import contextlib
import copy
import traceback
import warnings
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from dpcomm.launch import init_worker
from tests._corpus import CORPUS, ZOO
from tests._user_workers import _fingerprint, _recorded_buckets, _same_on_all_ranks, _train


def _groups_of_splits(splits: list[list[str]], param_groups: Any) -> list[list[int]]:
    """Dynamo's subgraphs (the graph inputs DDPOptimizer counted in each, communication order) as the plan
    groups their parameters belong to."""
    from dpcomm.ddp.compiled import placeholder_name

    group_of = {placeholder_name(n): k for k, g in enumerate(param_groups) for n in g}
    return [sorted({group_of[n] for n in sub if n in group_of}) for sub in splits]


def _inductor_passes(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """A backend for tests: AOTAutograd with inductor's decompositions, then inductor's own post-grad passes
    (``fx_passes.post_grad.post_grad_passes``: DDP's all-reduce fusion, ``fuse_by_plan`` when installed,
    among them) on each graph, which then runs as FX, without inductor's code generation (minutes on the
    2-core VM for GPT-2 tiny's backward)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes.post_grad import post_grad_passes
    from torch._inductor.virtualized import V

    def passes(g: torch.fx.GraphModule, _inputs: Any, is_inference: bool = True) -> Any:
        vals = [n.meta.get("val") for n in g.graph.nodes if n.op == "placeholder"]
        with V.set_fake_mode(next(v.fake_mode for v in vals if hasattr(v, "fake_mode"))):
            post_grad_passes(g, is_inference=is_inference)
        g.recompile()
        return g

    return aot_autograd(
        fw_compiler=passes, bw_compiler=lambda g, i: passes(g, i, False), decompositions=select_decomp_table()
    )(gm, example_inputs)


BACKENDS = {"inductor-passes": _inductor_passes}
"""Test backends by name (any other name is torch's)."""


def _backward_compiled(mode: str, backend: Any) -> Any:
    """Compiled autograd around the backward (torch 2.13's entry: the backward's graph, DDP's python
    reducer's all-reduces in it, compiled by ``backend``), for ``optimize_ddp="python_reducer"``."""
    if mode != "python_reducer":
        return contextlib.nullcontext()
    return torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend))


def compiled_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{model, planner, backend, optimize_ddp, backward, ref_backward}`` (``backward``: compiled
    autograd's backend, default ``backend``; ``ref_backward``: the reference's, default ``backward``):
    wrap(torch.compile(model)) and plain
    DistributedDataParallel(torch.compile(copy)) with the plan's caps, trained side by side."""
    from dpcomm.ddp import wrap

    rank, world = init_worker()
    torch.set_num_threads(1)
    out = []
    for case in cases:
        if "fsdp" in case:
            out.append(_fsdp_case(case, rank))
            continue
        if "train" in case:
            out.append(_train_case(case, rank, world))
            continue
        build, batch_of, _ = {**CORPUS, **ZOO}[case["model"]]
        torch.manual_seed(0)
        model = build()
        plain = copy.deepcopy(model)
        batch = batch_of(10 + rank)
        r: dict[str, Any] = {}
        mode = case.get("optimize_ddp", "ddp_optimizer")
        backend = BACKENDS.get(case.get("backend", "aot_eager"), case.get("backend", "aot_eager"))
        backward = BACKENDS.get(case.get("backward", ""), case.get("backward", backend))  # compiled autograd
        torch._dynamo.config.optimize_ddp = mode
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=backend)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rng = torch.get_rng_state()
                ddp = wrap(compiled, case["planner"], example=batch[0], profile_iters=1, verify_iters=1,
                           network="10gbe")  # fmt: skip
                r["untouched"] = torch.equal(rng, torch.get_rng_state()) and all(
                    p.grad is None for p in model.parameters()
                )  # the compiled copy's timing left no trace
                torch.manual_seed(7)
                with _backward_compiled(mode, backward):
                    losses, _ = _train(ddp, batch, None)
            w = ddp.dpcomm
            r["warnings"] = [str(m.message)[:200] for m in caught if "dpcomm" in str(m.message)]
            r["plan"] = [list(g) for g in w.caps.plan.groups]
            r["split_groups"] = _groups_of_splits(w.compiled_splits[-1], w.caps.param_groups) if (
                w.compiled_splits) else []  # fmt: skip
            names = {n.removeprefix("_orig_mod."): p for n, p in ddp.module.named_parameters()}
            unit_of = {
                id(names[n]): u for u, x in enumerate(w.trace.layers) for n in x.param_names if n in names
            }
            caps = w.caps.ddp_kwargs() if mode == "ddp_optimizer" else {"bucket_cap_mb": 25}
            ref = DistributedDataParallel(torch.compile(plain, backend=backend), **caps)
            torch.manual_seed(7)
            counters = torch._dynamo.utils.counters["inductor"]
            counters.pop("ddp_buckets", None)
            ref_backward = BACKENDS.get(case.get("ref_backward", ""), backward)
            with _backward_compiled(mode, ref_backward):
                ref_losses, _ = _train(ref, batch, None)
            r["ref_buckets"] = counters.get("ddp_buckets")  # inductor's greedy pass, on plain DDP
            r.update(losses=losses, ref_losses=ref_losses, replicas=_same_on_all_ranks(_fingerprint(model)),
                     seen=_recorded_buckets(ddp, batch, unit_of) if mode == "ddp_optimizer" else None,
                     notes=list(w.compiled_notes), fused=[list(map(list, g)) for g in w.compiled_buckets],
                     plan_groups=[list(g) for g in w.caps.param_groups],
                     trace_extra={k: v for k, v in w.trace.extra.items() if not isinstance(v, list)},
                     trace_sums=[sum(x.forward_s for x in w.trace.layers),
                                 sum(x.backward_s for x in w.trace.layers)])  # fmt: skip
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["trace"] = traceback.format_exc(limit=8)
        finally:
            torch._dynamo.config.optimize_ddp = "ddp_optimizer"
        out.append(r)
    return out


def _train_case(case: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """``dpcomm train`` (``case["train"]``: :class:`TrainConfig` keyword arguments; ``case["schedules"]``
    compared in one run, on the same batches) in this launch, after the checks ``train`` makes. With
    ``case["passes"]``, ``torch.compile``'s ``inductor`` backend runs as ``BACKENDS["inductor-passes"]``:
    inductor's decompositions and post-grad passes (DDP's all-reduce fusion, ``fuse_by_plan``, among them)
    without its code generation, for this case only."""
    from dpcomm.train.checks import check
    from dpcomm.train.config import TrainConfig
    from dpcomm.train.loop import _train_rank

    wrapper = torch._TorchCompileInductorWrapper
    call = wrapper.__call__
    if case.get("passes"):
        wrapper.__call__ = lambda self, gm, inputs: _inductor_passes(gm, inputs)
    try:
        torch._dynamo.reset()
        cfg = TrainConfig(**case["train"])
        parsed = check(cfg, case["schedules"]).schedules
        return {"results": _train_rank(cfg, parsed, rank, world, 0, {"iteration": None})}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=8)}
    finally:
        wrapper.__call__ = call


def _fsdp_state(model: torch.nn.Module) -> dict[str, Any]:
    """FSDP2's own record of a sharded model: its ``fully_shard`` modules (paths; ``""`` the root) and each
    one's forward and backward prefetch lists, as module paths."""
    from torch.distributed.fsdp import FSDPModule

    path = {id(m): n for n, m in model.named_modules()}
    out = {}
    for n, m in model.named_modules():
        if isinstance(m, FSDPModule):
            st = m._get_fsdp_state()
            out[n] = {
                "modules": [path[id(x)] for x in st._modules],
                "forward": [path[id(o._modules[0])] for o in st._states_to_forward_prefetch],
                "backward": [path[id(o._modules[0])] for o in st._states_to_backward_prefetch],
            }
    return out


def _fsdp_case(case: dict[str, Any], rank: int) -> dict[str, Any]:
    """``dpcomm.fsdp.shard_compiled`` against plain compiled FSDP2 (``fully_shard`` per block and on the
    root, each block compiled: torchtitan's pattern) from the same weights: FSDP2's units and prefetch
    before compiling (a plain ``shard``) and after, the trace's origin, three SGD steps' losses."""
    from torch.distributed.fsdp import fully_shard

    import dpcomm.fsdp
    from dpcomm.fsdp.compiled import shard_compiled

    build, batch_of, _ = {**CORPUS, **ZOO}[case["model"]]
    backend = case.get("backend", "aot_eager")
    torch.manual_seed(0)
    model = build()
    plain, twin = copy.deepcopy(model), copy.deepcopy(model)
    batch = batch_of(10 + rank)
    r: dict[str, Any] = {}
    try:
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = shard_compiled(model, case["fsdp"], backend=backend, example=batch[0], profile_iters=1,
                                   verify_iters=1)  # fmt: skip
            torch.manual_seed(7)
            losses, _ = _train(model, batch, None)
        said = model.dpcomm
        dpcomm.fsdp.shard(twin, said.plan, layer_params=said.layer_params, example=batch[0])  # not compiled
        mods = dict(model.named_modules())
        for block in plain.h:  # plain compiled FSDP2
            fully_shard(block)
        fully_shard(plain)
        for block in plain.h:
            block.compile(backend=backend)
        torch.manual_seed(7)
        ref_losses, _ = _train(plain, batch, None)
        extra, rows = said.trace.extra, said.trace.layers
        r.update(
            losses=losses, ref_losses=ref_losses, replicas=_same_on_all_ranks(_fingerprint(model)),
            state=_fsdp_state(model), uncompiled_state=_fsdp_state(twin),
            compiled=sorted(p for ps in said.groups.modules for p in ps if p and mods[p]._compiled_call_impl),
            unit_paths=sorted(p for ps in said.groups.modules for p in ps if p),
            measured_by=extra.get("measured_by"), backend=extra.get("backend"),
            unit_forward_s=extra.get("unit_forward_s"), unit_backward_s=extra.get("unit_backward_s"),
            eager_unit_forward_s=extra.get("eager_unit_forward_s"),
            layer_sums=[[sum(x.forward_s for x in rows[a : z + 1]), sum(x.backward_s for x in rows[a : z + 1])]  # noqa: E501
                        for a, z in said.plan.units],
            eager_time_s=extra.get("eager_time_s"),
            time_s=said.plan.time_s, sha=said.plan.sha256(), twin_sha=twin.dpcomm.plan.sha256(),
            warnings=[str(m.message)[:200] for m in caught if "dpcomm" in str(m.message)],
        )  # fmt: skip
    except Exception as exc:
        r["error"] = f"{type(exc).__name__}: {exc}"
        r["trace"] = traceback.format_exc(limit=8)
    return r
