"""The GPU check of dpcomm: every CUDA code path on one GPU, in at most 8 minutes on one H100.

One GPU cannot hold a multi-rank NCCL group (NCCL refuses two ranks on one device), so this runs what one
GPU can: NCCL at world size 1 (rank 0's group of one) and gloo on CUDA tensors for ``--ranks`` P = 2-4
ranks sharing the GPU (real multi-rank collectives on CUDA memory). Each case is isolated: a failure is
recorded with the first line of its error and the next case runs.

1. ``profile``: zoo models in fp32 and under bf16 autocast, layer by layer (CUDA events): the units' sum
   (scaled to the profile's own hookless iterations, :mod:`dpcomm.trace.shares`) within 3% of an iteration
   timed apart (:func:`dpcomm.timing.now` around forward and backward); the hooked sum beside it.
2. ``timing``: a collective queued behind device work (``torch.cuda._sleep``) and timed by
   :func:`dpcomm.timing.time_calls` counts that work; the host alone (what the loop read before) does not.
3. ``collectives``: all-reduce and broadcast timed nccl-tests' way (back to back after one barrier),
   4 KiB to 64 MiB: seconds, algbw, busbw (``2(P-1)/P`` for all-reduce) and the fitted ``a + b M`` beside
   them with its error per size; NCCL at 1 rank (``-nccl1``), gloo on CUDA tensors at P (``-gloo``).
4. ``wrap``: :func:`dpcomm.ddp.wrap` with ``mgwfbp`` (measured cost, timed trial): DDP's buckets are the
   plan's groups (a recording comm hook), losses equal to plain DDP's.
5. ``shard``: :func:`dpcomm.fsdp.shard` with ``optimal``: losses equal to plain DDP's.
6. ``runtime``: ``dpcomm.DataParallel`` with ``wfbp``, ``mgwfbp``, ``optimal`` (P ranks): replicas
   identical, losses equal to DDP's, the measured iteration times.
7. ``ps``: the parameter server (co-located, ``ibatch`` pulls, P workers): replicas identical, losses
   equal to DDP's (momentum SGD in both).

Training cases run gpt2-tiny in float32 from one seed, each rank its own batch, 8 iterations, and compare
every rank's losses with plain DDP's on the same group within ``LOSS_REL``. On a GPU (writes the JSON)::

    PYTHONPATH=src python3 benchmarks/gpu_check.py [--ranks 2] [--json docs/data/gpu_check.json]

Without one: ``--cpu`` runs the same launch on CPU tensors (gloo everywhere); ``--dry-run`` runs every case
in this process at world size 1 on the CPU with tiny sizes (the fast test runs it; writes only ``--json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
LOSS_REL = 1e-4
"""Losses of a schedule and of plain DDP agree within this (relative; fp32, sums in other orders)."""
BUDGET_S = 480.0
"""The whole check's limit (8 minutes); a case that would start later is recorded as skipped."""
PROFILED = {"resnet50": 32, "gpt2": 8, "bert-base": 32, "vit-b16": 64, "resnet20": 128, "gpt2-tiny": 64}
"""Zoo model -> batch size profiled (the sizes of ``benchmarks/gpu_traces.py``)."""
MODEL, LR, MOMENTUM = "gpt2-tiny", 0.05, 0.9
SCHEDULES = ("wfbp", "mgwfbp", "optimal")


@dataclass(slots=True, kw_only=True)
class Ctx:
    """What every case of one rank reads."""

    device: torch.device
    rank: int
    world: int
    solo: Any
    """Rank 0's group of one (NCCL on a GPU, gloo on the CPU); None on other ranks."""
    sizes: list[int]
    """Message sizes of the timed collectives, bytes."""
    iters: int
    """Timed calls per size."""
    batch: int
    seq: int
    """Training batches: ``batch`` sequences of ``seq`` tokens."""
    train_iters: int
    """Training iterations per case (every rank's losses compared with DDP's)."""
    profile_iters: int
    deadline: float
    """``time.time()`` after which no case starts."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _run(name: str, fn: Any, ctx: Ctx, group: Any, skip: bool) -> dict[str, Any]:
    """One case, isolated: ``{"case", "ok", "seconds", ...details}`` or its error."""
    if skip:
        return {"case": name, "ok": None, "skipped": "the 8-minute budget ran out"}
    t0 = time.perf_counter()
    try:
        out = fn(ctx, group)
        ok = all(out.get("checks", {}).values())
        return {"case": name, "ok": ok, "seconds": round(time.perf_counter() - t0, 2), **out}
    except Exception as exc:  # noqa: BLE001 - recorded; the next case runs
        print(f"[rank {ctx.rank}] {name} failed:\n{traceback.format_exc()}", file=sys.stderr)
        return {
            "case": name,
            "ok": False,
            "seconds": round(time.perf_counter() - t0, 2),
            "error": _first_line(exc),
        }


# ------------------------------------------------------------------------------------------------ the cases


def profile_case(device: torch.device, models: dict[str, int]) -> dict[str, Any]:
    """Each model's units against an independent hookless iteration, in fp32 and under bf16 autocast."""
    from dpcomm.models import example_input, get_model
    from dpcomm.timing import now
    from dpcomm.trace.profiler import default_loss, profile
    from dpcomm.trace.shares import TOLERANCE

    rows, checks = {}, {}
    for name, batch in models.items():
        for amp in (None, "bf16"):  # fp32, and mixed precision as GPU users train (parameters stay fp32)
            torch.manual_seed(0)
            model = get_model(name).to(device)
            x = example_input(name, batch, device=device)
            trace = profile(model, x, iters=5, warmup=2, device=device, model_name=name, autocast=amp)
            ctx = (
                torch.autocast(device.type, dtype=torch.bfloat16)
                if amp
                else torch.autocast(device.type, enabled=False)
            )
            for _ in range(2):  # the same passes, timed whole: host clock after the device finished
                with ctx:
                    loss = default_loss(model(x))
                loss.backward()
            t0 = now(device)
            for _ in range(5):
                model.zero_grad(set_to_none=True)
                with ctx:
                    loss = default_loss(model(x))
                loss.backward()
            iteration_s = (now(device) - t0) / 5
            layers_s = trace.t_f + trace.t_b
            hooked_s = trace.extra["hooked_forward_s"] + trace.extra["hooked_backward_s"]
            key = f"{name}-{amp or 'fp32'}"
            rows[key] = {"batch": batch, "layers": trace.num_layers, "layers_s": layers_s,
                         "hooked_s": hooked_s, "iteration_s": iteration_s, "ratio": layers_s / iteration_s,
                         "hooked_ratio": hooked_s / iteration_s, "device": trace.device}  # fmt: skip
            # the units add up to an iteration timed apart from the profile (docs/traces.md); the CPU: the
            # machine's load decides
            checks[key] = abs(layers_s / iteration_s - 1) <= TOLERANCE or device.type == "cpu"
            del model
    return {"models": rows, "checks": checks}


def timing_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """A collective queued behind ``busy_s`` of device work: time_calls counts it, the host alone does not."""
    from dpcomm.timing import synchronize, time_calls

    dev, busy_s = ctx.device, 0.02
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10**7)
        end.record()
        end.synchronize()
        cycles = int(10**7 * busy_s / (start.elapsed_time(end) / 1e3))

        def busy() -> None:
            torch.cuda._sleep(cycles)  # spins the GPU: work the host only queues
    else:

        def busy() -> None:
            time.sleep(busy_s)  # the CPU: done when the call returns

    x = torch.ones(1024, device=dev)

    def call() -> Any:
        busy()
        return dist.all_reduce(x, group=group, async_op=True)

    timed = time_calls(call, 3, barrier="none", device=dev)
    host = []
    for _ in range(3):  # the old loop: the clock read when the call returns
        t0 = time.perf_counter()
        work = call()
        host.append(time.perf_counter() - t0)
        work.wait()
        synchronize(dev)
    checks = {"counts_the_queued_work": min(timed) >= 0.9 * busy_s}
    if dev.type == "cuda":
        checks["the_host_alone_does_not"] = statistics.median(host) < 0.5 * busy_s
    return {"busy_s": busy_s, "timed_s": timed, "host_s": host, "checks": checks}


def collectives_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """nccl-tests' loop per op and size, and the fitted ``a + b M`` (MG-WFBP Eq. 9) beside it."""
    from dpcomm.collectives.benchmark import busbw_factor
    from dpcomm.planner.autoplan import fit_linear
    from dpcomm.timing import rank_input, time_collective

    P = dist.get_world_size(group)
    x = rank_input(1000, dist.get_rank(group), device=ctx.device)
    dist.all_reduce(x, group=group)
    exact = torch.equal(x.cpu(), sum(rank_input(1000, r) for r in range(P)))
    out: dict[str, Any] = {
        "world": P,
        "backend": str(dist.get_backend(group)),
        "checks": {"exact_sums": exact},
    }
    for op in ("allreduce", "broadcast"):
        secs = time_collective(group, op, ctx.sizes, ctx.iters, warmup=2, barrier="once", device=ctx.device)
        cost = fit_linear(list(zip(ctx.sizes, secs, strict=True)))
        rows = []
        for m, t in zip(ctx.sizes, secs, strict=True):
            algbw = m / t / 1e9
            fit = cost.a + cost.b * m
            busbw = algbw * busbw_factor(op, P)
            rows.append({"bytes": m, "time_s": t, "algbw_GBps": algbw, "busbw_GBps": busbw, "fit_s": fit,
                         "fit_error": (fit - t) / t})  # fmt: skip
        out[op] = {"a_s": cost.a, "b_s_per_byte": cost.b, "rows": rows}
        out["checks"][f"{op}_positive"] = all(t > 0 for t in secs)
    return out


def _data(ctx: Ctx) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1 + ctx.rank)  # each rank its own batch: the averaged gradient matters
    x = torch.randint(0, 256, (ctx.batch, ctx.seq), generator=g)
    return x.to(ctx.device), torch.randint(0, 256, (ctx.batch, ctx.seq), generator=g).to(ctx.device)


def _model(ctx: Ctx) -> torch.nn.Module:
    from dpcomm.models import get_model

    torch.manual_seed(0)
    return get_model(MODEL).to(ctx.device)


_REFERENCE: dict[int, list[float]] = {}
"""Plain DDP's losses per group (by ``id``), computed once per run (:func:`run_cases` clears it)."""


def _ddp_losses(ctx: Ctx, group: Any) -> list[float]:
    """Plain DDP's losses on ``group`` (the reference every training case is compared with)."""
    from torch.nn.parallel import DistributedDataParallel

    from dpcomm.models.loss import classification_loss

    key = id(group)
    if key not in _REFERENCE:
        x, y = _data(ctx)
        ddp = DistributedDataParallel(_model(ctx), process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
        _REFERENCE[key] = [
            _step(ddp, opt, lambda: classification_loss(ddp(x), y)) for _ in range(ctx.train_iters)
        ]
    return _REFERENCE[key]


def _step(model: Any, opt: Any, loss: Any, step: Any = None) -> float:
    opt.zero_grad(set_to_none=True)
    value = loss()
    value.backward()
    (step or opt.step)()
    return float(value.detach())


def _close(losses: list[float], ref: list[float]) -> bool:
    return len(losses) == len(ref) and all(
        abs(a - b) <= LOSS_REL * max(1.0, abs(b)) for a, b in zip(losses, ref, strict=True)
    )


def _same_everywhere(model: torch.nn.Module, group: Any) -> bool:
    """Every rank of ``group`` holds the same parameters (sha256 of their bytes)."""
    flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])
    mine = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return len(set(every)) == 1


def wrap_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """DDP with mgwfbp's buckets (measured cost, timed trial) against plain DDP."""
    from dpcomm.ddp import wrap
    from dpcomm.models.loss import classification_loss

    x, y = _data(ctx)
    model = _model(ctx)
    ddp = wrap(
        model, "mgwfbp", example=x, process_group=group, profile_iters=ctx.profile_iters, verify_iters=1
    )
    w = ddp.dpcomm
    named = dict(model.named_parameters())
    unit = {id(named[n]): u for u, layer in enumerate(w.trace.layers) for n in layer.param_names}
    seen: list[tuple[int, ...]] = []
    P = dist.get_world_size(group)

    def hook(state, bucket):  # no annotations: DDP compares them with its classes
        seen.append(tuple(sorted({unit[id(p)] for p in bucket.parameters()})))
        t = bucket.buffer().div_(P)
        return dist.all_reduce(t, group=group, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for _ in range(ctx.train_iters):
        seen.clear()
        losses.append(_step(ddp, opt, lambda: classification_loss(ddp(x), y)))
    planned = sorted(tuple(sorted(g)) for g in w.plan.groups)
    return {"plan": [list(g) for g in w.plan.groups], "buckets": [list(b) for b in seen], "cost": str(w.cost),
            "trial_s": w.trial, "losses": losses, "ddp_losses": _ddp_losses(ctx, group),
            "checks": {"buckets_as_planned": sorted(seen) == planned,
                       "loss_equals_ddp": _close(losses, _ddp_losses(ctx, group)),
                       "replicas_identical": _same_everywhere(model, group)}}  # fmt: skip


def shard_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """FSDP2 with optimal's units against plain DDP."""
    from dpcomm.fsdp import shard
    from dpcomm.models.loss import classification_loss

    x, y = _data(ctx)
    model = shard(
        _model(ctx),
        "optimal",
        example=x,
        process_group=group,
        profile_iters=ctx.profile_iters,
        verify_iters=1,
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = [_step(model, opt, lambda: classification_loss(model(x), y)) for _ in range(ctx.train_iters)]
    plan = model.dpcomm.plan
    return {"units": [list(u) for u in plan.units], "depth": plan.depth, "losses": losses,
            "ddp_losses": _ddp_losses(ctx, group),
            "checks": {"loss_equals_ddp": _close(losses, _ddp_losses(ctx, group))}}  # fmt: skip


def runtime_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """dpcomm's own runtime with each schedule (native all-reduce) against plain DDP."""
    out: dict[str, Any] = {"checks": {}, "ddp_losses": _ddp_losses(ctx, group)}
    for name in SCHEDULES:
        model, out[name] = _runtime_run(ctx, group, name)
        out["checks"][f"{name}_loss_equals_ddp"] = _close(out[name]["losses"], _ddp_losses(ctx, group))
        out["checks"][f"{name}_replicas_identical"] = _same_everywhere(model, group)
    return out


def _runtime_run(ctx: Ctx, group: Any, schedule: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    from dpcomm.models.loss import classification_loss
    from dpcomm.train.online import DataParallel

    x, y = _data(ctx)
    model = _model(ctx)
    dp = DataParallel(model, plan=schedule, collective="native", process_group=group,
                      profile_iters=ctx.profile_iters, verify_iters=1)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    try:
        losses = [
            _step(dp, opt, lambda: classification_loss(dp(x), y), lambda: dp.step(opt))
            for _ in range(ctx.train_iters)
        ]
    finally:
        dp.close()
    steady = [r.total_s for r in dp.records if r.phase.name == "STEADY"]
    return model, {"plan": [list(g) for g in dp.plan.groups], "losses": losses, "cost": str(dp.cost),
                   "steady_total_s": steady, "phases": [r.phase.name for r in dp.records]}  # fmt: skip


def ps_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """The co-located parameter server (ibatch pulls, probed on the device) against plain DDP."""
    from dpcomm.ps.rank import PsRank
    from dpcomm.ps.spec import PsSpec

    x, y = _data(ctx)
    model = _model(ctx)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    spec = PsSpec(pull="ibatch", probe_rounds=1)
    ps = PsRank(
        model, opt, spec, rank=ctx.rank, workers=ctx.world, sample=x, stop=ctx.train_iters, group=group
    )
    try:
        losses = [ps.iteration(x, y) for _ in range(ctx.train_iters)]
        ps.finish()
    finally:
        ps.close()
    return {"batches": [list(b) for b in ps.pull_plan.batches], "losses": losses,
            "ddp_losses": _ddp_losses(ctx, group),
            "forward_s": [r["forward_s"] for r in ps.records],
            "checks": {"loss_equals_ddp": _close(losses, _ddp_losses(ctx, group)),
                       "replicas_identical": _same_everywhere(model, group)}}  # fmt: skip


def ddp_case(ctx: Ctx, group: Any) -> dict[str, Any]:
    """Plain DDP, the reference of the training cases: its losses (finite)."""
    losses = _ddp_losses(ctx, group)
    return {"losses": losses, "checks": {"finite": all(map(math.isfinite, losses))}}


CASES = [
    ("timing", timing_case),
    ("collectives", collectives_case),
    ("ddp", ddp_case),
    ("wrap", wrap_case),
    ("shard", shard_case),
]
"""Run on both groups: rank 0's group of one (``-nccl1``) and every rank (``-gloo``)."""
WORLD_ONLY = [("runtime", runtime_case), ("ps", ps_case)]


def run_cases(ctx: Ctx) -> list[dict[str, Any]]:
    """Every case of this rank: the world's first (every rank, gloo), then rank 0's group of one."""
    out = []
    _REFERENCE.clear()
    for name, fn in CASES + WORLD_ONLY:
        box = [time.time() > ctx.deadline]
        dist.broadcast_object_list(box, src=0)  # every rank skips alike
        out.append(_run(f"{name}-gloo", fn, ctx, None, box[0]))
    if ctx.solo is not None:  # rank 0 of a launch
        for name, fn in CASES:
            out.append(_run(f"{name}-nccl1", fn, ctx, ctx.solo, time.time() > ctx.deadline))
    return out


def _worker(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """One launched rank: the process group, the device, rank 0's group of one, the cases."""
    from dpcomm.launch import init_worker

    rank, world = init_worker(timeout_s=300)
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())  # one GPU: every rank on it
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # ranks share the cores: one torch thread each, as the tests' workers do
    solo = dist.new_group([0], backend="nccl" if device.type == "cuda" else "gloo")  # every rank calls it
    ctx = Ctx(device=device, rank=rank, world=world, solo=solo if rank == 0 else None, **cfg["ctx"])
    try:
        return run_cases(ctx)
    finally:
        dist.destroy_process_group()


def _merge(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rank 0's record of each case, ``ok`` only where every rank that ran it was."""
    merged = []
    for case in per_rank[0]:
        others = [c for r in per_rank[1:] for c in r if c["case"] == case["case"]]
        errors = [c.get("error") for c in others if c.get("error")]
        ok = case["ok"] if case["ok"] is None else case["ok"] and all(c["ok"] for c in others)
        merged.append({**case, "ok": ok, **({"other_ranks_errors": errors} if errors else {})})
    return merged


def _machine(device: torch.device) -> dict[str, Any]:
    out = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.machine(),
           "cpus": os.cpu_count()}  # fmt: skip
    if device.type == "cuda":
        nccl = torch.cuda.nccl.version()
        out |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2, help="gloo ranks sharing the GPU (2-4)")
    p.add_argument("--json", default=None, help="output file (default on a GPU: docs/data/gpu_check.json)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="the same launch on CPU tensors (gloo everywhere)")
    mode.add_argument("--dry-run", action="store_true", help="every case in this process, world size 1, CPU")
    p.add_argument("--small", action="store_true", help="tiny sizes and runs (implied by --cpu, --dry-run)")
    args = p.parse_args(argv)
    if not 1 <= args.ranks <= 4:
        print("gpu_check: error: --ranks must be 1-4", file=sys.stderr)
        return 2
    gpu = not (args.cpu or args.dry_run)
    if gpu and not torch.cuda.is_available():
        print("gpu_check: error: no CUDA device (torch.cuda.is_available() is False); use --cpu or --dry-run",
              file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device("cuda" if gpu else "cpu")
    t0 = time.time()
    small = args.small or not gpu
    sizes = [4096, 65536] if small else [4 << 10 << 2 * k for k in range(8)]  # 4 KiB ... 64 MiB
    ctx = dict(sizes=sizes, iters=2 if small else 10, batch=2 if small else 8, seq=16 if small else 64,
               train_iters=3 if args.dry_run else 5 if small else 8, profile_iters=1 if small else 2,
               deadline=t0 + BUDGET_S - 60)  # fmt: skip
    cases = [_run("profile", lambda c, g: profile_case(device, {"lenet5": 4} if small else PROFILED),
                  Ctx(device=device, rank=0, world=1, solo=None, **ctx), None, False)]  # fmt: skip
    if args.dry_run:  # this process, world size 1: the default group is rank 0's group of one too
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            cases += run_cases(Ctx(device=device, rank=0, world=1, solo=None, **ctx))
        finally:
            dist.destroy_process_group()
    else:
        from dpcomm.launch import launch

        cases += _merge(launch(_worker, args.ranks, {"device": device.type, "ctx": ctx}))
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": " ".join(["python3 benchmarks/gpu_check.py", *given]),
              "mode": "gpu" if gpu else "cpu" if args.cpu else "dry-run",
              "ranks": 1 if args.dry_run else args.ranks,
              "machine": _machine(device), "wall_s": round(time.time() - t0, 1), "loss_rel": LOSS_REL,
              "cases": cases}  # fmt: skip
    path = args.json or (str(ROOT / "docs/data/gpu_check.json") if gpu and not small else None)
    if path:
        Path(path).write_text(json.dumps(result, indent=1) + "\n")
    for c in cases:
        state = "skipped" if c["ok"] is None else "ok" if c["ok"] else "FAILED"
        failed = [k for k, v in c.get("checks", {}).items() if not v]
        print(
            f"{c['case']:<18} {state:<8} {c.get('seconds', 0):>6.1f} s  "
            f"{c.get('error', '')}{' '.join(failed)}"
        )
    print(f"{result['wall_s']:.0f} s in all" + (f"; wrote {path}" if path else ""))
    return 0 if all(c["ok"] is not False for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
