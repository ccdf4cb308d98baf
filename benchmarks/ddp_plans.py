"""Stock PyTorch DDP with dpcomm's plans, side by side in one run: DDP's default buckets (``ddp``), DDP built
by ``dpcomm.ddp.wrap`` with the ``mgwfbp`` and ``optimal`` plans (``ddp:mgwfbp``, ``ddp:optimal``), and
dpcomm's own runtime with the same planners (``mgwfbp``, ``optimal``).

    .venv/bin/python benchmarks/ddp_plans.py [--nproc 2] [--models lenet5,resnet20] [--batch-size 32]
        [--iters 40] [--threads 1] [--out docs/data/ddp_plans.json]
    # on the emulated cluster (root): one worker per server, links of --rate
    .venv/bin/python benchmarks/ddp_plans.py --testbed star:4 --rate 100mbit --models lenet5,resnet20

For each model, one launch of the workers holds one replica per schedule and runs them interleaved,
iteration by iteration on the same batches (:func:`dpcomm.train.compare_schedules`, what ``dpcomm train``
runs), so all see the same machine load. ``t_iter`` is the median over the steady iterations (planning,
profiling and the timed trials of candidate plans excluded), as ``dpcomm train`` reports it. Every
planner-backed schedule plans on the workers: ``ddp:X`` inside ``wrap`` during its first iteration (profile,
price the all-reduce, plan, then time the plan, ``single`` and DDP's default buckets as real DDP modules and
keep the fastest), the runtime during its first iterations.

On one machine (loopback) the workers' cores also do the reductions: the CPU-bound regime, where overlap buys
little and fewer, larger messages cost less CPU. Numbers there say nothing about a real network. With
``--testbed`` every worker runs in its own emulated server (``dpcomm testbed``), so the all-reduces cross
rate-capped links: the regime where communication is exposed and plans matter.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

SCHEDULES = ("ddp", "ddp:mgwfbp", "ddp:optimal", "mgwfbp", "optimal")


def _kept(r) -> str:
    plan = r.plan or {}
    groups = plan.get("groups") or []
    return f"{plan.get('schedule', '-')}/{len(groups)}" if groups else "default"


def _rows(args: argparse.Namespace, launch: dict) -> list[dict]:
    """Every model's comparison on the workers ``launch`` describes; prints a table (node 0)."""
    from dpcomm.train import TrainConfig, compare_schedules

    rows = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        cfg = TrainConfig(
            model=model, iters=args.iters, batch_size=args.batch_size, threads=args.threads, progress=False,
            **launch,
        )  # fmt: skip
        results = compare_schedules(cfg, list(SCHEDULES))
        base = results[0].t_iter_s
        print(f"{model}: t_iter ms (ratio to ddp), plan kept/groups")
        for r in results:
            print(
                f"  {r.schedule:12s} {r.t_iter_s * 1e3:8.2f} ({r.t_iter_s / base:.3f}x)  exposed "
                f"{r.exposed_comm_s * 1e3:6.2f} ms  {_kept(r)}"
            )
            rows.append(
                {"model": model, "schedule": r.schedule, "t_iter_s": r.t_iter_s,
                 "ratio_to_ddp": r.t_iter_s / base, "exposed_comm_s": r.exposed_comm_s, "plan": r.plan,
                 "log": r.log[:4]}
            )  # fmt: skip
        sys.stdout.flush()
    return rows


def _on_testbed(args: argparse.Namespace, argv: list[str]) -> tuple[list[dict], dict]:
    """Build the testbed, run this script on every server (``--node``), read node 0's rows, tear down."""
    import json

    from _common import sigterm_exits
    from dpcomm.testbed import TestbedConfig, down, launch_workers, parse_rate, up

    cfg = TestbedConfig(name="ddpplan", topology=args.testbed, rate_bps=parse_rate(args.rate), mtu=args.mtu)
    down(cfg.name)
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    state = up(cfg)
    try:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--node", "--models", args.models]
        cmd += [
            "--batch-size",
            str(args.batch_size),
            "--iters",
            str(args.iters),
            "--threads",
            str(args.threads),
        ]
        res = launch_workers(state, cmd, timeout_s=args.timeout)
        text = res.stdout(0)
        print(text, end="")
        lines = [ln for ln in text.splitlines() if ln.startswith("ROWS ")]
        if not res.ok or not lines:
            raise SystemExit(f"testbed run failed: {(res.stderr(0).strip().splitlines() or ['?'])[-1]}")
        rows = json.loads(lines[-1][5:])
    finally:
        down(cfg.name)
    where = {"testbed": args.testbed, "rate": args.rate, "mtu": args.mtu, "workers": len(state["servers"])}
    return rows, where


def main(argv: list[str] | None = None) -> int:
    from _common import loadavg
    from dpcomm.launch import add_launch_arguments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="workers on loopback (one per server on a testbed)")
    ap.add_argument("--models", default="lenet5,resnet20")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=40, help="iterations per schedule (planning included)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--testbed", default=None, help="run on an emulated cluster of this topology (root)")
    ap.add_argument("--rate", default="100mbit", help="link rate with --testbed")
    ap.add_argument("--mtu", type=int, default=1500, help="MTU with --testbed")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole testbed run")
    ap.add_argument("--node", action="store_true", help=argparse.SUPPRESS)  # one testbed server's process
    add_launch_arguments(ap)  # the testbed appends them to --node runs
    ap.add_argument("--out", default=None, help="JSON file to write")
    args = ap.parse_args(argv)
    if args.node:
        import json

        launch = {"nproc": 1, "nnodes": int(args.nnodes), "node_rank": int(args.node_rank)}
        launch |= {"master_addr": args.master_addr, "master_port": int(args.master_port)}
        rows = _rows(args, launch)
        if launch["node_rank"] == 0:
            print("ROWS " + json.dumps(rows), flush=True)
        return 0
    before = loadavg()
    if args.testbed:
        rows, where = _on_testbed(args, argv if argv is not None else sys.argv[1:])
        machine = f"{os.cpu_count()}-core CPU VM ({platform.machine()}), emulated cluster, gloo"
    else:
        rows, where = _rows(args, {"nproc": args.nproc}), {"loopback": True, "workers": args.nproc}
        machine = f"{os.cpu_count()}-core CPU VM ({platform.machine()}), loopback, gloo"
    after = loadavg()
    meta = {
        "command": "benchmarks/ddp_plans.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine,
        **where,
        "loadavg_before": before,
        "loadavg_after": after,
        "torch": __import__("torch").__version__,
        "batch_size": args.batch_size,
        "iters": args.iters,
        "threads": args.threads,
        "date": __import__("datetime").date.today().isoformat(),
    }
    print(f"load average before {before}, after {after}")
    if args.out:
        from dpcomm.utils.io import atomic_write_json

        atomic_write_json(args.out, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
