"""``make demo``: real data-parallel training on this machine, every schedule side by side in one run.

Four gloo workers (started by torch's elastic agent, as ``torchrun`` would) train LeNet-5 on scikit-learn's
handwritten digits. Each worker holds one replica per schedule (``wfbp``, ``single``, ``mgwfbp``,
``optimal`` and PyTorch's DistributedDataParallel with its default buckets) and runs them interleaved,
iteration by iteration on the same batches, so all five see the same machine load:

1. the MG-WFBP plan the runtime made after profiling the first iterations (MG-WFBP Alg. 1-2), and the plan
   it kept after timing that one against ``single`` and DDP's buckets;
2. a table of median iteration time, forward/backward, exposed communication, ratio to DDP, loss, test
   accuracy, and whether the four replicas ended bitwise identical;
3. the simulator's prediction for each plan from that run's own profiled trace and measured all-reduce cost,
   next to the measured time;
4. a timeline figure of real iterations (rank 0, compute and communication rows) for every schedule, and
   the simulator's timeline of the MG-WFBP plan; both under ``out/demo/``.

Run: ``python -m dpcomm.demo [--epochs E] [--nproc P] [--out DIR]`` (``make demo`` uses the defaults).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

__all__ = ["main"]

SCHEDULES = ["wfbp", "single", "mgwfbp", "optimal", "ddp"]


def _machine() -> str:
    import torch

    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    return (
        f"{platform.machine()} {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"load average {' '.join(load)} (other jobs on this machine slow every schedule alike)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpcomm.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="workers (default 4)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the digits (default 2)")
    parser.add_argument("--batch-size", type=int, default=16, help="per worker (default 16)")
    parser.add_argument("--out", default="out/demo", help="folder for the figures and traces")
    args = parser.parse_args(argv)

    from rich.console import Console

    from dpcomm.errors import UserError
    from dpcomm.launch import WorkerFailure
    from dpcomm.train import TrainConfig, compare_schedules, predict, summary_table

    console = Console(width=None if sys.stdout.isatty() else 150)
    out = Path(args.out)
    console.print(f"[bold]dpcomm demo[/bold]: {args.nproc} workers train LeNet-5 on the digits, schedules "
                  f"{', '.join(SCHEDULES)} interleaved in one run")  # fmt: skip
    console.print(_machine(), highlight=False)
    cfg = TrainConfig(
        model="lenet5",
        data="digits",
        nproc=args.nproc,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=0.05,
        schedule="mgwfbp",
        chrome_trace=str(out / "trace.json"),
    )
    t0 = time.perf_counter()
    try:
        results = compare_schedules(cfg, SCHEDULES)
    except (UserError, WorkerFailure) as exc:
        print(f"dpcomm demo: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UserError) else 1
    wall = time.perf_counter() - t0
    by = {r.schedule: r for r in results}

    mg = by["mgwfbp"]
    console.print(
        "\n[bold]MG-WFBP plan[/bold] (made by the runtime from the profiled iterations, then timed against "
        "single and DDP's buckets):"
    )
    for line in mg.log:
        console.print("  " + line, highlight=False, markup=False)
    groups = mg.plan["groups"] if mg.plan else []
    kept = mg.plan["schedule"] if mg.plan else "-"
    console.print(
        f"  kept {kept}: groups in communication order (layer L-1 first): {groups}", highlight=False
    )

    console.print()
    console.print(summary_table(results, title=f"LeNet-5 on digits, {args.nproc} workers, {mg.iterations} "
                                               f"iterations each ({wall:.0f} s in all)"))  # fmt: skip

    console.print(
        "\n[bold]Simulator vs measurement[/bold] (same profiled trace and measured all-reduce cost):"
    )
    sims = {}
    for r in results:
        sim = predict(r)
        if sim is None:
            continue
        sims[r.schedule] = sim
        err = (sim.t_iter_s - r.t_iter_s) / r.t_iter_s
        console.print(
            f"  {r.schedule:8s} measured {r.t_iter_s * 1e3:7.1f} ms   "
            f"predicted {sim.t_iter_s * 1e3:7.1f} ms   error {err:+.0%}",
            highlight=False,
        )

    from dpcomm.runtime.timeline import plot_measured_timeline

    traces = {r.schedule: r.chrome_trace for r in results if r.chrome_trace}
    fig = plot_measured_timeline(
        traces,
        out / "timeline.png",
        iterations=1,
        title="the last measured iteration of each schedule, rank 0",
    )
    console.print(f"\nTimeline of real iterations: {fig}", highlight=False)
    if "mgwfbp" in sims:
        from dpcomm.sim.timeline import plot_timeline

        sim_fig = plot_timeline(
            [sims["mgwfbp"]], out / "simulated_mgwfbp.png", title="simulated MG-WFBP plan"
        )
        console.print(f"Simulated MG-WFBP timeline:  {sim_fig}", highlight=False)
    console.print(f"Chrome traces (chrome://tracing, Perfetto): {out}/trace.<schedule>.json", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
