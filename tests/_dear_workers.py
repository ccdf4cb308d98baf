"""Workers of tests/test_dear_runtime.py: the ``dear`` schedule against an all-reduce plan of the same groups,
on real gloo ranks, each rank its own data."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError
from dpcomm.launch import init_worker
from dpcomm.plan import Plan
from dpcomm.runtime.data_parallel import DataParallel

IN, OUT = 8, 4


class Net(nn.Module):
    """Four learnable layers, 1,940 parameters: chunks of 2-4 ranks cut through tensors."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(IN, 32), nn.Linear(32, 32)
        self.fc3, self.fc4 = nn.Linear(32, 16), nn.Linear(16, OUT)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc4(torch.relu(self.fc3(x)))


def _batch(it: int, rank: int, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * it + rank)  # each rank its own data
    return torch.randn(n, IN, generator=g), torch.randint(0, OUT, (n,), generator=g)


def _flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def _optimizer(case: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    if case.get("groups"):  # two param groups: their own lr and weight decay
        first = [*model.fc1.parameters(), *model.fc2.parameters()]
        rest = [*model.fc3.parameters(), *model.fc4.parameters()]
        spec = [{"params": first, "lr": 0.01, "weight_decay": 0.1}, {"params": rest, "lr": 0.003}]
        return torch.optim.AdamW(spec, lr=0.005, weight_decay=0.01)
    if case.get("adamw"):
        return torch.optim.AdamW(model.parameters(), lr=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


class _Run:
    """One replica: model, optimizer, scheduler, scaler and its DataParallel."""

    def __init__(self, case: dict[str, Any], init: nn.Module, plan: Any, collective: str):
        self.case = case
        self.model = copy.deepcopy(init)
        self.opt = _optimizer(case, self.model)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, 2, 0.5) if case.get("groups") else None
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if case.get("scaler") else None
        self.dp = DataParallel(self.model, plan, collective) if isinstance(plan, Plan) else None
        if self.dp is None:  # a planner name: planned on the workers (profiled with all-reduces first)
            from dpcomm.train.online import DataParallel as Planned

            self.dp = Planned(self.model, plan=plan, collective=collective, profile_iters=2, verify_iters=0)

    def iteration(self, it: int, rank: int) -> float:
        x, y = _batch(it, rank)
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.dp(x), y)
        if self.scaler is not None:
            if it == self.case.get("inf_at") and rank == 1:  # one rank overflows: every rank skips the step
                loss = loss * float("inf")
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self.case.get("clip"):
            if self.scaler is not None:
                self.dp.unscale_(self.opt, self.scaler)
            self.dp.clip_grad_norm_(self.case["clip"])
        self.dp.step(self.opt, self.scaler)
        if self.scaler is not None:
            self.scaler.update()
        if self.sched is not None:
            self.sched.step()
        return float(loss.detach())

    def state(self) -> dict[str, Any]:
        self.dp.consolidate_optimizer()
        out = {"model": copy.deepcopy(self.dp.state_dict()), "opt": copy.deepcopy(self.opt.state_dict())}
        if self.sched is not None:
            out["sched"] = self.sched.state_dict()
        if self.scaler is not None:
            out["scaler"] = self.scaler.state_dict()
        return out

    def load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        if self.sched is not None:
            self.sched.load_state_dict(state["sched"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])


def run_case(case: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    init = Net()
    L, steps, coll = 4, case.get("steps", 6), case.get("collective", "ring")
    sizes = case.get("sizes", [2, 1, 1])
    ref_plan = Plan.from_sizes("optimal", sizes, L)
    dear_plan = case.get("plan") or Plan.from_sizes("dear", sizes, L)
    out: dict[str, Any] = {"error": None}
    try:
        ref, run = _Run(case, init, ref_plan, coll), _Run(case, init, dear_plan, coll)
        for it in range(steps):
            ref.iteration(it, rank)
            run.iteration(it, rank)
            if case.get("resume") == it + 1:  # checkpoint, then a fresh replica resumes from it
                state = run.state()
                run.dp.close()
                run = _Run(case, init, dear_plan, coll)
                run.load(state)
                out["resumed_state_keys"] = sorted(state["opt"]["state"].get(0, {}))
        if case.get("eval"):  # evaluate the module itself after the last step: eval() flushes the gathers
            x, _ = _batch(999, 0)
            with torch.no_grad():
                out["stale_diff"] = float((run.model(x) - ref.model(x)).abs().max())
            run.dp.eval()
            ref.dp.eval()
            with torch.no_grad():
                out["eval_diff"] = float((run.model(x) - ref.model(x)).abs().max())
        run.dp.flush()
        a, b = _flat(run.model), _flat(ref.model)
        out["rel"] = float((a - b).abs().max() / b.abs().max())
        out["sha"] = hashlib.sha256(a.numpy().tobytes()).hexdigest()
        out["shard_state"] = sum(
            t.numel() for st in run.dp._sync_grads.shards._opt.state.values() for t in st.values() if t.dim()
        )
        out["params"] = a.numel()
        if getattr(run.dp, "planner", None) is not None:  # planned on the workers: its halves as measured
            out["halves"] = sorted(run.dp.planner.half_points)
            out["split"] = type(run.dp.cost).__name__
        if run.scaler is not None:
            out["scales"] = [run.scaler.get_scale(), ref.scaler.get_scale()]
        if case.get("resume"):  # the resumed run against one that never stopped
            straight = _Run(case, init, dear_plan, coll)
            for it in range(steps):
                straight.iteration(it, rank)
            straight.dp.flush()
            out["resume_bitwise"] = bool(torch.equal(_flat(straight.model), a))
            straight.dp.close()
        run.dp.close()
        ref.dp.close()
    except (UserError, RuntimeError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def run_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rank, world = init_worker(timeout_s=30)
    torch.set_num_threads(1)
    results = []
    for case in cases:
        results.append(run_case(case, rank, world))
        dist.barrier()
    dist.destroy_process_group()
    return results
