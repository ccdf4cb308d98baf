"""Worker functions for tests/test_thirdparty.py: the third-party models of :mod:`tests._corpus_thirdparty`
through ``dpcomm.ddp.wrap`` and ``dpcomm.fsdp.shard``, each trained next to plain PyTorch from the same
weights and random state (module level: the launcher spawns workers that import them).

As :mod:`tests._user_workers` (whose helpers these reuse), with each model's own loss (``output.loss``, a
diffusion model's MSE to the noise). ``wrap`` is compared with plain DDP on the same buckets; ``shard``
without ``mp_policy`` with plain DDP, and with ``mp_policy`` (bf16 parameters, fp32 reductions) with plain
FSDP2 given the same ``mp_policy`` on the same modules, called in the same order, as dpcomm's units.
"""

from __future__ import annotations

import copy
import traceback
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dpcomm.utils.user_run import call
from tests import _user_workers as W
from tests._corpus_thirdparty import LOSS_FN, THIRDPARTY, loss_of

STEPS = W.STEPS
LR = W.LR


def _mp_policy() -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _train(model: nn.Module, batch: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``STEPS`` plain SGD steps (no momentum) on this rank's batch with the model's own loss; the losses and
    the last step's gradients by name (full tensors under FSDP2)."""
    x, y = batch
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(call(model, x), y)
        loss.backward()
        grads = {
            W._strip(n): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
        opt.step()
        losses.append(float(loss.detach()))
    return losses, grads


def _grad_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of two sets of gradients by name; a gradient one side lacks counts as zeros
    (DDP and dpcomm leave ``None`` where no rank used a parameter, plain FSDP2 reduce-scatters zeros)."""
    if any(n not in b and a[n].any() for n in a) or any(n not in a and b[n].any() for n in b):
        return float("inf")
    return max((float((a[n] - b[n]).abs().max()) for n in a.keys() & b.keys()), default=0.0)


def _error(r: dict[str, Any], exc: BaseException) -> None:
    r["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    r["trace"] = traceback.format_exc()[-4000:]


def wrap_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{model, planner, ddp: kwargs}``: ``wrap`` against plain DDP with the same buckets."""
    from dpcomm.ddp import wrap

    rank = W._start()
    out = []
    for case in cases:
        name = case["model"]
        build, batch_of, _ = THIRDPARTY[name]
        torch.manual_seed(0)  # the same initial model on every rank
        model = build()
        plain = copy.deepcopy(model)
        batch = batch_of(10 + rank)  # each rank its own batch
        kwargs = dict(case["ddp"])
        torch.manual_seed(100 + rank)
        before = W._rng()
        r: dict[str, Any] = {}
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ddp = wrap(model, case["planner"], example=batch[0], loss_fn=LOSS_FN[name], profile_iters=1,
                           verify_iters=1, **kwargs)  # fmt: skip
            r["rng_same"] = bool(torch.equal(before, W._rng()))
            r["warnings"] = [str(m.message) for m in caught if "dpcomm" in str(m.message)]
            w = ddp.dpcomm
            r["text"] = str(w)
            caps = w.caps
            losses, grads = _train(ddp, batch)
            torch.set_rng_state(before)
            ref = DistributedDataParallel(plain, **caps.ddp_kwargs(), **kwargs)
            ref_losses, ref_grads = _train(ref, batch)
            names = dict(model.named_parameters())
            unit_of = {id(names[n]): u for u, x in enumerate(w.trace.layers) for n in x.param_names}
            r.update(
                losses=losses,
                ref_losses=ref_losses,
                grad_diff=W._diff(grads, ref_grads),
                param_diff=W._diff(W._params(ddp), W._params(ref)),
                replicas=W._same_on_all_ranks(W._fingerprint(model)),
                plan=[list(g) for g in caps.plan.groups],
                buckets=[
                    [sorted({unit_of[id(names[n])] for n in b}), str(names[b[0]].dtype)]
                    for b in caps.param_groups
                ],
                requested=[list(g) for g in caps.requested.groups],
                dropped=list(caps.dropped),
                seen=W._recorded_buckets(ddp, batch, unit_of, dtypes=True, loss=loss_of),
            )
            del ddp, ref
        except Exception as exc:  # one case's failure is reported, the others still run
            _error(r, exc)
        out.append(r)
    return out


def _plain_fsdp(model: nn.Module, modules: list[list[str]], order: list[int], **fsdp_kw: Any) -> nn.Module:
    """Plain FSDP2 on ``model``: ``fully_shard`` on each unit's modules (``modules[k]``, the order
    ``order``), the root last, with ``fsdp_kw``; FSDP2's own defaults otherwise (no prefetch set, gathers
    not made asynchronous: neither changes a number)."""
    from torch.distributed.fsdp import fully_shard

    mods = dict(model.named_modules())
    for k in order:
        if modules[k] == [""]:
            continue
        target = [mods[p] for p in modules[k]]
        fully_shard(target if len(target) > 1 else target[0], **fsdp_kw)
    return fully_shard(model, **fsdp_kw)


def shard_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{model, planner, mp}``: ``shard`` (with ``mp_policy`` where ``mp``) against plain DDP, or
    with ``mp`` against plain FSDP2 on dpcomm's units under the same ``mp_policy``."""
    import dpcomm.fsdp

    rank = W._start()
    out = []
    for case in cases:
        name = case["model"]
        build, batch_of, modes = THIRDPARTY[name]
        torch.manual_seed(0)
        plain = build()
        model = copy.deepcopy(plain)
        batch = batch_of(10 + rank)
        fsdp_kw = {"mp_policy": _mp_policy()} if case.get("mp") else {}
        torch.manual_seed(100 + rank)
        alive = W._fsdp_alive()
        before = W._rng()
        r: dict[str, Any] = {}
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = dpcomm.fsdp.shard(model, case["planner"], example=batch[0], loss_fn=LOSS_FN[name],
                                          profile_iters=1, verify_iters=1, **fsdp_kw)  # fmt: skip
                r["rng_same"] = bool(torch.equal(before, W._rng()))
                r["lingering"] = W._lingering_fsdp(model, alive)
                losses, grads = _train(model, batch)
            r["view_warnings"] = W._view_warnings(caught, model)
            r["text"] = str(model.dpcomm)
            groups = model.dpcomm.groups
            r["modules"] = [list(m) for m in groups.modules]
            r["order"] = list(groups.order)
            torch.set_rng_state(before)
            routed = modes[0] != {}  # parameters some rank may not use: DDP and FSDP2 told so
            if case.get("mp"):
                ref = _plain_fsdp(plain, r["modules"], r["order"], **fsdp_kw)
                ref.set_reduce_scatter_unused_params(routed)
            else:
                ref = DistributedDataParallel(plain, find_unused_parameters=routed)
            ref_losses, ref_grads = _train(ref, batch)
            r.update(
                losses=losses,
                ref_losses=ref_losses,
                grad_diff=_grad_diff(grads, ref_grads),
                param_diff=W._diff(W._params(model), W._params(ref)),
                replicas=W._same_on_all_ranks(W._fingerprint(model)),
            )
            del model, ref
        except Exception as exc:
            _error(r, exc)
        out.append(r)
    return out


def run_all(cases: list[dict[str, Any]], shard: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """One launch for every case: the ``wrap`` cases, then the ``shard`` cases."""
    return wrap_cases(cases), shard_cases(shard)
