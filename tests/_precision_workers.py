"""Worker functions for tests/test_hsdp.py's launch: ``dpcomm.fsdp.shard(..., mp_policy=...)`` (and FSDP2's
other keywords) against plain ``fully_shard`` with the same keywords on the same units (module level: the
launcher spawns workers that import it).

Per case a worker reports plain data: both runs' losses, each ``fully_shard`` call's modules and the
parameters its group holds (by name, as FSDP2's own state says), the policies each unit holds, the dtype
the model's output came in (bf16 when the policy casts), whether the replicas agree, and for the cases
plain FSDP2 cannot run, both refusals' first lines.
"""

from __future__ import annotations

import copy
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.launch import init_worker
from dpcomm.utils.user_run import call
from tests._corpus import CORPUS, ZOO, loss_of

STEPS = 3
LR = 0.1


def fsdp_calls(model: nn.Module) -> list[tuple[list[str], list[str]]]:
    """Each ``fully_shard`` call as FSDP2 holds it: the modules it was given (paths) and the parameters its
    group manages (names), in the model's module order."""
    from torch.distributed.fsdp import FSDPModule

    path = {id(m): n for n, m in model.named_modules()}
    name = {id(p): n for n, p in model.named_parameters()}
    out, seen = [], set()
    for m in model.modules():
        if isinstance(m, FSDPModule) and id(m._get_fsdp_state()) not in seen:
            state = m._get_fsdp_state()  # torch 2.13: the state fully_shard made (one per call)
            seen.add(id(state))
            groups = state._fsdp_param_groups
            params = sorted(name[id(fp.sharded_param)] for g in groups for fp in g.fsdp_params)
            out.append(([path[id(x)] for x in state._modules], params))
    return out


def _sums(model: nn.Module, sharded: bool) -> list[float]:
    """The sums of ``model``'s sharded parameters (``sharded``), or of those FSDP2 left plain (ignored)."""
    out = []
    for _, p in sorted(model.named_parameters()):
        if hasattr(p, "full_tensor") == sharded:
            t = p.full_tensor() if sharded else p
            out += [float(t.detach().double().sum()), float(t.detach().double().abs().sum())]
    return out


def _same(values: Any, group: Any) -> bool:
    """Whether every rank of ``group`` holds the same ``values``."""
    got: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, values, group=group)
    return all(g == got[0] for g in got)


def _local(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's part of every parameter (its shard; an ignored parameter whole): compared shard by shard
    with the plain run's, which shards alike, without a collective."""
    return {n: (p.to_local() if hasattr(p, "to_local") else p).detach() for n, p in model.named_parameters()}


def _policies(model: nn.Module) -> list[tuple[str | None, str | None]]:
    from torch.distributed.fsdp import FSDPModule

    out, seen = [], set()
    for m in model.modules():
        if isinstance(m, FSDPModule) and id(m._get_fsdp_state()) not in seen:
            seen.add(id(m._get_fsdp_state()))
            mp = m._get_fsdp_state()._mp_policy  # torch 2.13: the policy fully_shard stored
            out.append((str(mp.param_dtype), str(mp.reduce_dtype)))
    return out


def _offloads(model: nn.Module) -> list[str]:
    """Each parameter group's offload policy (its class name) and whether its shards live on the CPU."""
    from torch.distributed.fsdp import FSDPModule

    out, seen = [], set()
    for m in model.modules():
        if isinstance(m, FSDPModule) and id(m._get_fsdp_state()) not in seen:
            seen.add(id(m._get_fsdp_state()))
            for g in m._get_fsdp_state()._fsdp_param_groups:
                on_cpu = all(fp.offload_to_cpu for fp in g.fsdp_params)
                out.append(f"{type(g.offload_policy).__name__}:{on_cpu}")
    return out


def _zeros_for(model: nn.Module) -> list[str]:
    """The ``fully_shard`` calls (by their first module's path) that reduce-scatter zeros for parameters
    without a gradient on a rank (``set_reduce_scatter_unused_params``)."""
    from torch.distributed.fsdp import FSDPModule

    return [
        path for path, m in model.named_modules() if isinstance(m, FSDPModule)
        and any(g.reduce_scatter_unused_params for g in m._get_fsdp_state()._fsdp_param_groups)
        and m._get_fsdp_state()._modules[0] is m
    ]  # fmt: skip


def _train(model: nn.Module, batch: Any) -> tuple[list[float], list[str]]:
    x, y = batch
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, dtypes = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        out = call(model, x)
        out = out["logits"] if isinstance(out, dict) else out
        dtypes.append(str(out.dtype))
        loss = loss_of(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, dtypes


def _priced(said: Any, plain: nn.Module, planner: str, mp: Any) -> dict[str, Any]:
    """What ``shard`` planned and bounded under the policy, beside the planner's own plan under the
    policy's prices on the same trace and costs, and the bound of the same units counted in fp32 (on the
    unsharded copy)."""
    from dpcomm.fsdp.bound import as_run
    from dpcomm.planner.fsdp import FSDP_MAX_DEPTH, plan_fsdp
    from dpcomm.planner.fsdp_precision import Precision

    req = said.requested
    mine = plan_fsdp(planner, said.trace, said.ag_cost, said.rs_cost, max_depth=FSDP_MAX_DEPTH,
                     overlap=said.overlap, precision=Precision.of(mp), unit_s=req.meta.get("unit_s", 0.0),
                     atoms=req.meta.get("atoms"))  # fmt: skip

    def shape(p: Any) -> list[Any]:
        return [[list(u) for u in p.units], p.depth, p.reshard_after_forward, p.time_s, p.peak_bytes]

    return {
        "requested": shape(req), "planner": shape(mine), "meta_precision": req.meta.get("precision"),
        "bound": said.peak_bound_bytes, "computed_in": said.trace.extra.get("computed_in"),
        "fp32_bound": as_run(plain, said.plan, said.groups, said.layer_params, None, None, None)[1],
        "text": str(said), "certified": "lower_bound_s" in req.meta,
    }  # fmt: skip


def _keywords(case: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """FSDP2's keywords of ``case`` for ``model``: ``mp`` (bf16 parameters, fp32 reductions), ``offload``
    (``CPUOffloadPolicy(pin_memory=False)``: pinning needs an accelerator), ``ignored`` (the named
    parameters, as the set of ``model``'s own)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kw: dict[str, Any] = {}
    if case.get("mp", True):
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if case.get("offload"):
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if case.get("ignored"):
        named = dict(model.named_parameters())
        kw["ignored_params"] = {named[n] for n in case["ignored"]}
    return kw


def _refusal(model, planner, example, **kw) -> str:
    """``shard``'s one-line refusal of ``model`` (``""`` where it shards it)."""
    import dpcomm.fsdp
    from dpcomm.errors import UserError

    try:
        dpcomm.fsdp.shard(model, planner, example=example, **kw)
    except UserError as exc:
        return str(exc)
    return ""


def _plain_refusal(build: Any, batch: Any, kw: dict[str, Any]) -> str:
    """Plain FSDP2 with ``kw``, one step: a ``fully_shard`` call per module holding parameters of its own
    (children first), then the root; its error's first line, or ``""`` if it ran."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = build()
    try:
        owners = [
            m for m in model.modules() if m is not model and any(True for _ in m.parameters(recurse=False))
        ]
        for m in reversed(owners):
            fully_shard(m, **kw)
        fully_shard(model, **kw)
        _train(model, batch)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return ""


def pair_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`precision_cases` over two pairs of ranks at once: ranks 0 and 1 run ``cases[0::2]`` over their
    own group, ranks 2 and 3 ``cases[1::2]`` (FSDP over 2 ranks; half the processes per case)."""
    rank, _ = init_worker()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes both
    out = precision_cases(cases[rank // 2 :: 2], pairs[rank // 2])
    dist.barrier()
    return out


def precision_cases(cases: list[dict[str, Any]], group: Any = None) -> list[dict[str, Any]]:
    """Per case ``{model, planner}`` (and ``full``: the plan's prices and a run without the policy;
    ``cannot``: a model plain FSDP2 cannot run with the policy; ``offload``, ``ignored``, ``mp``: which of
    FSDP2's keywords, :func:`_keywords`): ``shard`` with them, then plain ``fully_shard`` calls with them
    over the module groups ``shard`` chose (children first, the root last), both from the same weights and
    random state, each rank on its own batch."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import dpcomm.fsdp

    rank, _ = init_worker()
    torch.set_num_threads(1)
    on = {} if group is None else {"mesh": DeviceMesh.from_group(group, "cpu")}  # the plain run's mesh
    out = []
    for case in cases:
        r: dict[str, Any] = {"seconds": time.perf_counter()}
        try:
            build, batch_of, _ = {**CORPUS, **ZOO}[case["model"]]
            batch = batch_of(10 + rank)  # each rank its own data
            torch.manual_seed(0)
            plain = build()
            model = copy.deepcopy(plain)
            kw, ref_kw = _keywords(case, model), _keywords(case, plain) | on
            if "bad" in case:  # keywords shard refuses: its one line
                r["shard_error"] = _refusal(model, case["planner"], batch[0], **case["bad"])
                r["seconds"] = time.perf_counter() - r["seconds"]
                out.append(r)
                continue
            if case.get("cannot"):  # plain FSDP2's refusal, then shard's
                r["plain_error"] = _plain_refusal(build, batch, _keywords(case, plain))
                r["shard_error"] = _refusal(model, case["planner"], batch[0], profile_iters=1, **kw)
                r["seconds"] = time.perf_counter() - r["seconds"]
                out.append(r)
                continue
            torch.manual_seed(100 + rank)
            before = torch.get_rng_state()
            model = dpcomm.fsdp.shard(model, case["planner"], example=batch[0], profile_iters=1,
                                      verify_iters=1, process_group=group, **kw)  # fmt: skip
            groups = model.dpcomm.groups
            if case.get("full"):
                r |= _priced(model.dpcomm, plain, case["planner"], kw["mp_policy"])
            torch.set_rng_state(before)
            r["losses"], r["dtypes"] = _train(model, batch)
            r["calls"], r["policies"] = fsdp_calls(model), _policies(model)
            r["offloads"] = _offloads(model)
            r["replicas"] = _same(_sums(model, True), group)
            whole = [n for n, p in model.named_parameters() if not hasattr(p, "full_tensor")]
            r["plain_params"] = sorted(whole)  # parameters no fully_shard call sharded
            r["gathered"] = sorted(n for ns in model.dpcomm.layer_params for n in ns)
            r["text"] = str(model.dpcomm)
            mods = dict(plain.named_modules())
            for k in groups.order:  # the same fully_shard calls, by hand
                paths = groups.modules[k]
                if paths != ("",):
                    target = [mods[p] for p in paths]
                    fully_shard(target if len(target) > 1 else target[0], **ref_kw)
            fully_shard(plain, **ref_kw)
            r["zeros_for"] = _zeros_for(model)  # as a plain FSDP2 user must where ranks use other parameters
            for path in r["zeros_for"]:
                mods[path].set_reduce_scatter_unused_params(True, recurse=False)
            torch.set_rng_state(before)
            r["ref_losses"], r["ref_dtypes"] = _train(plain, batch)
            r["ref_calls"] = fsdp_calls(plain)
            mine, ref = _local(model), _local(plain)
            r["param_diff"] = max((float((mine[n] - ref[n]).abs().max()) for n in mine if mine[n].numel()),
                                  default=0.0) if mine.keys() == ref.keys() else float("inf")  # fmt: skip
            r["ignored_differ"] = not _same(_sums(model, False), group)
            if case.get("full"):
                torch.manual_seed(0)
                fp32 = build()  # the same run without a policy: how far bf16 moves the loss
                fully_shard(fp32)
                torch.set_rng_state(before)
                r["fp32_losses"], _ = _train(fp32, batch)
                del fp32
            del model, plain
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["trace"] = traceback.format_exc(limit=8)
        r["seconds"] = time.perf_counter() - r["seconds"]  # this rank's, for the test's cost
        out.append(r)
    dist.barrier(group)
    return out
