"""Stock PyTorch DDP with dpcomm's plans, side by side in one run: DDP's default buckets, DDP built by
``dpcomm.ddp.wrap`` with the ``mgwfbp`` and ``optimal`` plans, and dpcomm's own runtime
(``dpcomm.DataParallel``) running the same ``mgwfbp`` plan.

    .venv/bin/python benchmarks/ddp_plans.py [--nproc 2] [--models lenet5,resnet20] [--batch-size 32]
        [--iters 30] [--warmup 5] [--threads 1] [--out docs/data/ddp_plans.json]

For each model, one launch of ``--nproc`` gloo workers on loopback holds the four replicas (each its own copy
of the model, same seed) and runs them interleaved, one iteration each in turn on the same batch, so all see
the same machine load. ``t_iter`` is forward + backward (communication included) + ``optimizer.step()``, the
median over ``--iters`` iterations after ``--warmup``, as the slowest rank saw it. The DDP buckets are checked
against the plan (DDP's logging data, after the rebuild). Planning itself (``wrap`` profiles
the layers and times the all-reduce on the workers) is not in ``t_iter``.

On one machine (loopback) the workers' cores also do the reductions: the CPU-bound regime, where overlap buys
little and fewer, larger messages cost less CPU. Numbers there say nothing about a real network.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

REPLICAS = ("ddp", "ddp+mgwfbp", "ddp+optimal", "dpcomm mgwfbp")
"""``dpcomm mgwfbp`` is ``dpcomm.DataParallel(plan="mgwfbp")``: it profiles and times its candidates during
its first iterations (3 profiled, then 3 each for up to 3 candidates), so ``--warmup`` must cover them."""
"""Names in the table, in the order they run."""


def _ddp_groups(ddp, layer_of: dict[int, int]) -> list[list[int]]:
    """DDP's rebuilt buckets as layer lists (communication order), from its logging data."""
    params = [
        p for _, m in ddp.module.named_modules() for p in m.parameters(recurse=False) if p.requires_grad
    ]
    seen, uniq = set(), []
    for p in params:  # DDP's reducer order: modules in registration order, shared parameters once
        if id(p) not in seen:
            seen.add(id(p))
            uniq.append(p)
    text = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices", "")
    out = []
    for bucket in str(text).split(","):
        out.append(sorted({layer_of[id(uniq[int(i)])] for i in bucket.split()}))
    return out


def worker(model_name: str, batch: int, iters: int, warmup: int, threads: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from dpcomm.ddp import wrap
    from dpcomm.launch import init_worker
    from dpcomm.models import example_input, get_model, num_classes
    from dpcomm.models.layers import layer_params, learnable_layers
    from dpcomm.train.online import DataParallel

    rank, world = init_worker()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base = get_model(model_name)
    torch.manual_seed(1 + rank)
    x = example_input(model_name, batch)
    y = torch.randint(0, num_classes(model_name), (batch,))
    reps, info = {}, {}
    reps["ddp"] = DistributedDataParallel(copy.deepcopy(base))
    for s in ("mgwfbp", "optimal"):
        t0 = time.perf_counter()
        ddp = wrap(copy.deepcopy(base), s, example=x)
        w = ddp.dpcomm
        info[s] = {
            "plan_s": time.perf_counter() - t0, "kept": w.plan.schedule, "trial_s": w.trial,
            "groups": [list(g) for g in w.plan.groups],
        }  # fmt: skip
        reps[f"ddp+{s}"] = ddp
    reps["dpcomm mgwfbp"] = DataParallel(copy.deepcopy(base), plan="mgwfbp")
    opts = {k: torch.optim.SGD(r.parameters(), lr=0.01, momentum=0.9) for k, r in reps.items()}
    times: dict[str, list[float]] = {k: [] for k in reps}
    for it in range(warmup + iters):
        for k, rep in reps.items():
            opts[k].zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            F.cross_entropy(rep(x), y).backward()
            rep.step(opts[k]) if isinstance(rep, DataParallel) else opts[k].step()
            if it >= warmup:
                times[k].append(time.perf_counter() - t0)
    for s in (
        "mgwfbp",
        "optimal",
    ):  # DDP's rebuilt buckets (its logging data has them after a few iterations)
        m = reps[f"ddp+{s}"].module
        layer_of = {id(p): i for i, ps in enumerate(layer_params(m, learnable_layers(m, x))) for p in ps}
        info[s]["ddp_buckets_equal_plan"] = _ddp_groups(reps[f"ddp+{s}"], layer_of) == info[s]["groups"]
    med = torch.tensor([statistics.median(times[k]) for k in reps], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    dp = reps["dpcomm mgwfbp"]
    info["dpcomm"] = {"kept": dp.plan.schedule, "groups": [list(g) for g in dp.plan.groups]}
    dp.close()
    return {"t_iter_s": dict(zip(reps, med.tolist(), strict=True)), "plans": info, "world": world}


def main(argv: list[str] | None = None) -> int:
    from dpcomm.launch import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--models", default="lenet5,resnet20")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=15, help="untimed iterations (dpcomm's planning included)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--out", default=None, help="JSON file to write")
    args = ap.parse_args(argv)
    load_before = open("/proc/loadavg").read().split()[:3]
    rows = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        res = launch(worker, args.nproc, model, args.batch_size, args.iters, args.warmup, args.threads)[0]
        rows.append({"model": model, **res})
        t = res["t_iter_s"]
        cells = "  ".join(f"{k} {t[k] * 1e3:8.2f} ms ({t[k] / t['ddp']:.3f}x)" for k in REPLICAS)
        groups = {s: f"{p['kept']} ({len(p['groups'])} groups)" for s, p in res["plans"].items()}
        ok = all(p["ddp_buckets_equal_plan"] for s, p in res["plans"].items() if s != "dpcomm")
        print(f"{model:9s} {cells}\n          plans kept {groups}; DDP buckets == plan: {ok}", flush=True)
    meta = {
        "command": "benchmarks/ddp_plans.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.cpu_count()}-core CPU VM ({platform.machine()}, {platform.node()})",
        "loadavg_before": load_before,
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "torch": __import__("torch").__version__,
        "nproc": args.nproc,
        "batch_size": args.batch_size,
        "iters": args.iters,
        "threads": args.threads,
    }
    print(f"load average before {' '.join(load_before)}, after {' '.join(meta['loadavg_after'])}")
    if args.out:
        from dpcomm.utils.io import atomic_write_json

        atomic_write_json(args.out, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
