"""Worker functions for tests/test_ddp.py (module level: the launcher spawns workers that import them).

``bucket_cases`` wraps zoo models in DDP with every planner's plan and reads DDP's real buckets through a
recording comm hook (``GradBucket.parameters()``), two iterations each. ``unit_cases`` does the same through
``dpcomm.ddp.wrap`` for transformers (GPT-2 from the zoo; a hand-written GPT with a tied embedding, a frozen
LayerNorm and an unused head under ``find_unused_parameters=True``) and trains each next to plain DDP.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dpcomm.costmodel.base import LinearCost
from dpcomm.launch import init_worker

COST = LinearCost(a=2e-4, b=2e-9)
"""An all-reduce price (seconds, seconds per byte) under which mgwfbp and optimal merge some layers."""


class SplitUse(nn.Module):
    """The root owns two parameters, one used first and one near the end: its gradients are ready at two
    times, with layers ``a`` and ``b`` in between, so DDP cannot cut between those layers."""

    def __init__(self) -> None:
        super().__init__()
        self.pre, self.post = nn.Parameter(torch.ones(8)), nn.Parameter(torch.ones(8))
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x * self.pre)) * self.post)


class HandGPT(nn.Module):
    """A user's small GPT: ``nn.MultiheadAttention``, the output projection tied to the token embedding
    (used first and last), a frozen LayerNorm, and a classification head the loss never uses."""

    def __init__(self, vocab: int = 32, dim: int = 16, ctx: int = 8) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.ln_1 = nn.LayerNorm(dim).requires_grad_(False)  # frozen
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied
        self.cls_head = nn.Linear(dim, 3)  # unused

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        h = self.ln_1(x)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        x = x + self.mlp(self.ln_2(x))
        return self.lm_head(self.ln_f(x))


def _model(name: str, batch: int) -> tuple[nn.Module, torch.Tensor]:
    from dpcomm.models import example_input, get_model

    torch.manual_seed(0)
    if name == "splituse":
        return SplitUse(), torch.randn(batch, 8)
    if name == "handgpt":
        return HandGPT(), torch.randint(0, 32, (batch, 8))
    if name == "googlenet":  # 224x224 costs seconds per step on CPU; the layers do not depend on the size
        return get_model(name), torch.randn(batch, 3, 64, 64)
    return get_model(name), example_input(name, batch)


def _layer_of(model: nn.Module, example: Any) -> dict[int, int]:
    """Unit index of every trainable parameter (the units a plan for this model indexes)."""
    from dpcomm.trace.units import gradient_units, unit_params

    return {id(p): i for i, ps in enumerate(unit_params(model, gradient_units(model, example))) for p in ps}


def _recording_hook(log: list[tuple[int, ...]], layer_of: dict[int, int]):
    sizes: dict[int, int] = {}
    for l in layer_of.values():
        sizes[l] = sizes.get(l, 0) + 1

    def hook(state, bucket):  # no annotations: DDP compares them with the classes, not with strings
        got = [layer_of[id(p)] for p in bucket.parameters()]
        units = tuple(sorted(set(got)))
        whole = len(got) == len(set(map(id, bucket.parameters()))) == sum(sizes[l] for l in units)
        log.append(units if whole else ("partial", *units))  # a bucket holding part of a unit shows
        t = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    return hook


def _run_and_record(
    ddp: DistributedDataParallel, example: Any, layer_of: dict[int, int], iters: int = 2, step: Any = None
):
    """DDP's buckets (unit tuples) per iteration; with ``step(ddp) -> loss`` that trains instead, also the
    losses."""
    from dpcomm.trace.profiler import default_loss

    seen: list[list[tuple[int, ...]]] = []
    losses: list[float] = []
    log: list[tuple[int, ...]] = []
    ddp.register_comm_hook(None, _recording_hook(log, layer_of))
    for _ in range(iters):
        log.clear()
        if step is None:
            default_loss(ddp(example)).backward()
        else:
            losses.append(step(ddp))
        seen.append(list(log))
    return (seen, losses) if step is not None else seen


def _trainer(x: torch.Tensor):
    """``step(ddp) -> loss``: one SGD step of next-token cross-entropy on ``x`` (a fresh optimizer per DDP,
    made on first use; plain SGD keeps no state across steps, so two DDPs from equal weights stay equal)."""
    import torch.nn.functional as F

    def step(ddp: nn.Module) -> float:
        for p in ddp.parameters():
            p.grad = None
        logits = ddp(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        with torch.no_grad():
            for p in ddp.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)
        return float(loss)

    return step


def unit_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case (model, schedule, DDP keyword arguments): ``dpcomm.ddp.wrap`` with that planner (no timed
    trial), DDP's real buckets per iteration as unit tuples, the plan's groups, and the training losses of
    the wrapped DDP and of plain DDP from the same weights on this rank's batch."""
    import copy

    from dpcomm.ddp import wrap

    rank, _ = init_worker()
    torch.set_num_threads(1)
    out = []
    for case in cases:
        model, _ = _model(case["model"], 2)
        torch.manual_seed(1 + rank)  # each rank its own batch: the averaged gradient matters
        vocab = 256 if case["model"] == "gpt2-tiny" else 32
        x = torch.randint(0, vocab, (2, 9))
        plain = copy.deepcopy(model)
        kwargs = case.get("ddp", {})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ddp = wrap(
                model, case["schedule"], example=x[:, :-1], network="10gbe", profile_iters=1, verify_iters=0,
                **kwargs,
            )  # fmt: skip
        w = ddp.dpcomm
        names = dict(model.named_parameters())
        layer_of = {id(names[n]): u for u, x_ in enumerate(w.trace.layers) for n in x_.param_names}
        seen, losses = _run_and_record(ddp, x, layer_of, iters=3, step=_trainer(x))
        ref = DistributedDataParallel(plain, **kwargs)
        ref_losses = [_trainer(x)(ref) for _ in range(3)]
        out.append(
            {
                "requested": [list(g) for g in w.caps.requested.groups],
                "plan": [list(g) for g in w.caps.plan.groups],
                "units": [(u.name, list(u.param_names), u.unused) for u in w.trace.layers],
                "walk": w.caps.walk,
                "dropped": list(w.caps.dropped),
                "warnings": [str(m.message) for m in caught if "dpcomm" in str(m.message)],
                "seen": [[list(g) for g in it] for it in seen],
                "losses": losses,
                "ref_losses": ref_losses,
            }
        )
        del ddp, ref
    return out


def bucket_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: the plan asked for, the plan DDP runs, and DDP's buckets per iteration (layer tuples)."""
    from dpcomm.ddp import bucket_caps, wrap
    from dpcomm.ddp.planning import sizes_trace as _sizes_trace
    from dpcomm.planner import make_plan
    from dpcomm.trace.analytic import analytic_trace

    init_worker()
    torch.set_num_threads(1)  # two workers on a small machine: more threads spin against each other
    out = []
    for case in cases:
        model, x = _model(case["model"], case.get("batch", 2))
        if case["model"] == "splituse":
            from dpcomm.trace.units import gradient_units

            trace = _sizes_trace(model, gradient_units(model, x), "splituse")
        else:
            trace = analytic_trace(case["model"], 2, "cpu")
        walk = case.get("ddp", {})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if case.get("on_workers"):
                ddp = wrap(model, case["schedule"], example=x, profile_iters=1)
                requested = ddp.dpcomm.caps.requested
            else:
                requested = make_plan(case["schedule"], trace, COST, dist.get_world_size())
                caps = bucket_caps(requested, model, example=x, trace=trace, cost=COST, nodes=2, **walk)
                ddp = DistributedDataParallel(model, **caps.ddp_kwargs(), **walk)
                ddp.dpcomm_caps = caps
        caps = ddp.dpcomm.caps if case.get("on_workers") else ddp.dpcomm_caps
        seen = _run_and_record(ddp, x, _layer_of(model, x))
        out.append(
            {
                "requested": [list(g) for g in requested.groups],
                "plan": [list(g) for g in caps.plan.groups],
                "sha": caps.plan.sha256(),
                "note": caps.note,
                "extra_s": caps.extra_s,
                "warnings": [str(w.message) for w in caught if "dpcomm" in str(w.message)],
                "seen": [[list(g) for g in it] for it in seen],
            }
        )
        del ddp
    return out
