"""Worker function for tests/test_hsdp.py's launch: ``dpcomm.fsdp.shard(..., mp_policy=...)`` against
plain ``fully_shard`` with the same policy on the same units (module level: the launcher spawns workers
that import it).

Per case a worker reports plain data: both runs' losses, the modules each made FSDP units (by path), the
policy each unit holds, the dtype the model's output came in (bf16 when the policy casts), and whether
the replicas agree.
"""

from __future__ import annotations

import copy
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.launch import init_worker
from tests._corpus import CORPUS, ZOO, loss_of
from tests._user_workers import _fingerprint, _same_on_all_ranks

STEPS = 3
LR = 0.1


def _units(model: nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    return [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]


def _policies(model: nn.Module) -> list[tuple[str | None, str | None]]:
    from torch.distributed.fsdp import FSDPModule

    out = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            mp = m._get_fsdp_state()._mp_policy  # torch 2.13: the policy fully_shard stored
            out.append((str(mp.param_dtype), str(mp.reduce_dtype)))
    return out


def _train(model: nn.Module, batch: Any) -> tuple[list[float], list[str]]:
    x, y = batch
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, dtypes = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        out = model(x)
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
    from dpcomm.fsdp.planning import as_run
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


def precision_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{model, planner}``: ``shard`` with ``MixedPrecisionPolicy(bf16, fp32)``, then plain
    ``fully_shard`` calls with that policy over the module groups ``shard`` chose (children first, the root
    last), both from the same weights and random state."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import dpcomm.fsdp

    rank, _ = init_worker()
    torch.set_num_threads(1)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out = []
    for case in cases:
        r: dict[str, Any] = {}
        try:
            build, batch_of, _ = {**CORPUS, **ZOO}[case["model"]]
            torch.manual_seed(0)
            plain = build()
            model = copy.deepcopy(plain)
            batch = batch_of(10 + rank)
            torch.manual_seed(100 + rank)
            before = torch.get_rng_state()
            model = dpcomm.fsdp.shard(model, case["planner"], example=batch[0], profile_iters=1,
                                      verify_iters=1, mp_policy=mp)  # fmt: skip
            groups = model.dpcomm.groups
            r |= _priced(model.dpcomm, plain, case["planner"], mp)
            torch.set_rng_state(before)
            r["losses"], r["dtypes"] = _train(model, batch)
            r["units"], r["policies"] = _units(model), _policies(model)
            r["replicas"] = _same_on_all_ranks(_fingerprint(model))
            mods = dict(plain.named_modules())
            for k in groups.order:  # the same fully_shard calls, by hand
                paths = groups.modules[k]
                if paths != ("",):
                    target = [mods[p] for p in paths]
                    fully_shard(target if len(target) > 1 else target[0], mp_policy=mp)
            fully_shard(plain, mp_policy=mp)
            torch.set_rng_state(before)
            r["ref_losses"], r["ref_dtypes"] = _train(plain, batch)
            r["ref_units"] = _units(plain)
            torch.manual_seed(0)
            fp32 = build()  # the same run without a policy: how far bf16 moves the loss
            fully_shard(fp32)
            torch.set_rng_state(before)
            r["fp32_losses"], _ = _train(fp32, batch)
            del model, plain, fp32
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["trace"] = traceback.format_exc(limit=8)
        out.append(r)
    dist.barrier()
    return out
