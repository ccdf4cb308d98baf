"""Worker functions for tests/test_runtime.py (module level: the launcher spawns workers that import them).

One launch runs many cases back to back on one process group. Every case trains a small model for a few
iterations on a global batch split across ranks and reports, per rank, a hash of the final parameters and,
on rank 0, the largest difference to single-process SGD on the whole batch (the reference).
"""

from __future__ import annotations

import copy
import hashlib
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError
from dpcomm.launch import init_worker
from dpcomm.plan import Plan
from dpcomm.train.online import DataParallel

IN, OUT = 8, 4


class MLP(nn.Module):
    """Four learnable layers; ``skip`` leaves one out of the forward (an unused layer)."""

    def __init__(self, skip: bool = False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(IN, 32), nn.Linear(32, 32)
        self.fc3, self.fc4 = nn.Linear(32, 16), nn.Linear(16, OUT)
        self.skip = skip

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        if not self.skip:
            x = torch.relu(self.fc2(x))
        return self.fc4(torch.relu(self.fc3(x)))


class Tied(nn.Module):
    """``fc2`` reuses ``fc1``'s weight transposed-free (same shape): a shared parameter used twice."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, 16)
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)
        self.fc2.weight = self.fc1.weight
        self.out = nn.Linear(16, OUT)

    def forward(self, x):
        x = torch.relu(self.inp(x))
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.out(x)


class BN(nn.Module):
    """Batch norm: float32 running statistics and an int64 counter, broadcast from the root every forward."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(IN, 16), nn.BatchNorm1d(16), nn.Linear(16, OUT)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


MODELS = {"mlp": MLP, "mlp-skip": lambda: MLP(skip=True), "tied": Tied, "bn": BN}


def _batch(it: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + it)
    return torch.randn(n, IN, generator=g).to(dtype), torch.randint(0, OUT, (n,), generator=g)


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in module.parameters()])


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def _opt(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _reference(model: nn.Module, iters: int, n: int, dtype: torch.dtype, clip: float | None) -> torch.Tensor:
    """Single-process SGD on the whole global batch, the same number of steps."""
    opt = _opt(model.parameters())
    for it in range(iters):
        x, y = _batch(it, n, dtype)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).float(), y).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return _flat(model)


def _tamper(plan: Plan, rank: int) -> Plan:
    """Test hook: rank 1 pretends it received a one-group plan."""
    return Plan.from_sizes("tampered", [plan.num_layers], plan.num_layers) if rank == 1 else plan


def run_case(case: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Train one case; returns ``{"sha": [per rank], "diff": float (rank 0), "error": str | None, ...}``."""
    pg = None
    if "group" in case:  # train on a sub-group of the world; the other ranks sit this case out
        pg = dist.new_group(case["group"])
        if rank not in case["group"]:
            return {"error": None, "rank": rank, "outside": True}
        rank, world = dist.get_rank(pg), len(case["group"])
    iters, per_rank, micro = case.get("iters", 20), case.get("batch", 6), case.get("micro", 1)
    dtype = case.get("dtype", torch.float32)
    torch.manual_seed(rank)  # different initial weights per rank: the start-up broadcast must fix that
    model = MODELS[case.get("model", "mlp")]().to(dtype)
    plan = case["plan"]
    if isinstance(plan, list):  # one plan per rank (mismatch test)
        plan = plan[rank]
    kw = {
        k: case[k]
        for k in (
            "mode",
            "allow_unused",
            "reduce_dtype",
            "profile_iters",
            "broadcast_every",
            "network",
            "root",
            "verify_iters",
        )
        if k in case
    }
    out: dict[str, Any] = {"error": None, "log": [], "rank": rank}
    kw["log"] = out["log"].append
    DataParallel._tamper_plan = _tamper if case.get("tamper") else None
    try:
        coll = case.get("collective", "native")
        dp = DataParallel(model, plan=plan, collective=coll, process_group=pg, **kw)
        ref_model = copy.deepcopy(dp.module) if rank == 0 else None
        seen: list[str] = []  # the running mean batch norm starts each forward from (root's, after broadcast)
        if isinstance(model, BN):
            model.bn.register_forward_pre_hook(
                lambda m, _i: seen.append(_sha(m.running_mean.detach().clone()))
            )
        if case.get("double_wrap"):
            try:
                DataParallel(model, plan=plan)
            except UserError as exc:
                out["double_wrap"] = str(exc)
        opt = _opt(dp.parameters())
        n = per_rank * world
        for it in range(iters):
            x, y = _batch(it, n, dtype)
            x, y = x[rank * per_rank : (rank + 1) * per_rank], y[rank * per_rank : (rank + 1) * per_rank]
            opt.zero_grad()
            m = per_rank // micro
            for k in range(micro):
                xs, ys = x[k * m : (k + 1) * m], y[k * m : (k + 1) * m]
                if k < micro - 1:
                    with dp.no_sync():
                        (nn.functional.cross_entropy(dp(xs).float(), ys) / micro).backward()
                else:
                    (nn.functional.cross_entropy(dp(xs).float(), ys) / micro).backward()
            if case.get("clip"):  # averaged gradients are visible after synchronize(), before step()
                dp.synchronize()
                nn.utils.clip_grad_norm_(dp.parameters(), case["clip"])
            dp.step(opt)
        if case.get("mode") == "lp-alg1" or seen:
            dp.sync_params()
        out["bn_seen"] = seen[-1] if seen else None
        if case.get("inspect"):
            last = dp.spans[-1]
            bwd_end = [s for s in last if s.name == "backward"][-1].end
            comm = [s for s in last if s.row == "comm"]
            out["comm_labels"] = [s.name for s in comm]
            out["queued_in_backward"] = [s.args["queued"] < bwd_end for s in comm]
            out["record"] = dp.records[-1].to_dict()
            if case.get("trace"):
                path = dp.write_chrome_trace(case["trace"])
                out["trace"] = str(path) if path else None
        out["plan"] = dp.plan.to_dict() if dp.plan else None
        out["record_plans"] = [(str(r.phase), r.plan) for r in dp.records]
        if dp.trace is not None:
            out["trace_layers"] = [(la.params, la.forward_s, la.backward_s) for la in dp.trace.layers]
            out["cost"] = (dp.cost.a, dp.cost.b)
            out["cost_points"] = dp.cost_points
        out["records"] = len(dp.records)
        out["buffer_bytes"] = dp.grad_buffer_bytes
        out["grad_bytes"] = sum(p.numel() * p.element_size() for p in dp.module.parameters())
        flat = _flat(dp.module)
        state = torch.cat([t.detach().double().reshape(-1) for t in dp.state_dict().values()])
        shas: list[Any] = [None] * world
        dist.all_gather_object(shas, (_sha(flat), _sha(state)), group=pg)
        out["sha"], out["state_sha"] = [a for a, _ in shas], [b for _, b in shas]
        out["state_keys"] = sorted(dp.state_dict())
        if rank == 0 and not case.get("no_reference"):
            ref = _reference(ref_model, iters, n, dtype, case.get("clip"))
            out["diff"] = float((flat - ref).abs().max())
            out["scale"] = float(ref.abs().max())
        dp.close()
    except (UserError, RuntimeError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def run_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rank, world = init_worker(timeout_s=30)
    torch.set_num_threads(1)  # several workers share few cores
    results = []
    for case in cases:
        t0 = time.perf_counter()
        res = run_case(case, rank, world)
        res["seconds"] = time.perf_counter() - t0
        results.append(res)
        dist.barrier()
    dist.destroy_process_group()
    return results


def kill_worker(victim: int, result_dir: str, timeout_s: float) -> None:
    """Train; ``victim`` dies abruptly at iteration 3; the others must fail with a clear error, not hang."""
    rank, world = init_worker(timeout_s=timeout_s)
    torch.manual_seed(0)
    dp = DataParallel(MLP(), plan=Plan.from_sizes("wfbp", [1, 1, 1, 1], 4), collective="native")
    opt = _opt(dp.parameters())
    t0 = time.perf_counter()
    try:
        for it in range(1000):
            if rank == victim and it == 3:
                os._exit(17)
            x, y = _batch(it, 4, torch.float32)
            opt.zero_grad()
            nn.functional.cross_entropy(dp(x), y).backward()
            dp.step(opt)
        msg = "finished without error"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        msg = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as fh:
        fh.write(f"{time.perf_counter() - t0:.3f}\n{msg}\n")
    os._exit(0)
