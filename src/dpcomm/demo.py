"""``make demo``: where communication is exposed, a dpcomm plan beats PyTorch DDP, measured in one run.

Where the machine allows it (Linux, root, ``ip`` and ``tc``, network namespaces), the demo builds an emulated
cluster (:mod:`dpcomm.testbed`): ``star:4``, four servers in network namespaces on one switch, every link
capped at 100 Mbit/s each way by ``tc tbf``, TCP reno, gloo. Each server runs one worker
(:mod:`dpcomm.testbed.node`) that trains ResNet-20 emulated from its shipped CPU trace (``emulated:
resnet20-cpu-b32``, :mod:`dpcomm.trace.emulated`: the trace's 39 layers and 1.08 MB of gradients, real
tensors on real TCP, forward and backward sleeping the trace's times), so the machine's two cores serve the
network rather than compute. In that one launch every worker holds one replica per schedule and runs them
interleaved, iteration by iteration on the same batches (:func:`dpcomm.train.compare_schedules`):

- ``ddp``: PyTorch's DistributedDataParallel with its default buckets (1 MiB first, then 25 MiB);
- ``wfbp``: one all-reduce per layer as soon as its gradient is ready (wait-free backpropagation);
- ``single``: one all-reduce after backward (SyncEASGD);
- ``mgwfbp``: MG-WFBP Algorithm 1's merged groups, planned on the workers from profiled iterations;
- ``optimal``: the exact best partition into contiguous groups under the same model;
- ``dear``: DeAR's schedule, each group reduce-scattered in backward and all-gathered in the next forward
  (each layer waits for its group), the optimizer stepping each rank's shard; its groups are the exact best
  under the same model (:mod:`dpcomm.planner.dear`).

It prints, per schedule, the measured median iteration time, the simulator's prediction (MG-WFBP Eq. 6-8)
from the run's own profiled layer times and an all-reduce cost fitted to every schedule's profiled
all-reduces (:func:`pooled_cost`), and the error; then writes the measured
timeline (``timeline.png``, rank 0's last iteration per schedule), the simulated one (``simulated.png``)
and the Chrome traces (``trace.<schedule>.json``) under ``--out``. The testbed gets a name of its own
(``dm<pid in hex>``) and is removed at the end, on Ctrl-C, SIGTERM or a failure too.

Where the machine does not allow it, one line says why and :mod:`dpcomm.demo_sim` shows the simulator's
answer for a real cluster (GoogLeNet on 8-64 nodes of 10 GbE) instead.

On the 2-core VM (load 4-10 from other jobs), nine runs put dpcomm's best plan at 0.759-0.779 of DDP's
iteration time (``optimal`` every time but once), ``mgwfbp`` at 0.77-0.92 (its greedy merge keeps 2 to 4
groups; once its timed trial kept DDP's buckets), in 64-97 s in all.

Run: ``python -m dpcomm.demo [--simulate] [--rate 100mbit] [--iters 30] [--out out/demo]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dpcomm.demo_report import TOPOLOGY, pooled_cost, report
from dpcomm.testbed.owned import loadavg, owned_name, remove_stale

__all__ = ["SCHEDULES", "TRACE", "cluster_unavailable", "main", "pooled_cost", "testbed_name"]

SCHEDULES = ("ddp", "wfbp", "single", "mgwfbp", "optimal", "dear")
TRACE = "resnet20-cpu-b32"
"""The shipped trace the emulated model follows (ResNet-20, batch 32, measured on this kind of CPU)."""


def _machine() -> str:
    import torch

    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"load average {loadavg()}"
    )


def cluster_unavailable() -> str | None:
    """Why this machine cannot build the emulated cluster (one line), or None when it can try."""
    if sys.platform != "linux":
        return f"the emulated cluster needs Linux network namespaces (this is {sys.platform})"
    from dpcomm.testbed.shell import TestbedError, netns_list, require

    try:
        require()  # root, ip and tc
        netns_list()
    except TestbedError as exc:
        return str(exc)
    return None


def testbed_name(pid: int | None = None) -> str:
    """This process's testbed name, ``dm`` and the pid in hex (at most 8 characters: pids are < 2**22)."""
    return owned_name("dm", pid)


def _remove_stale() -> None:
    """Take down the testbeds of demos killed outright (:func:`dpcomm.testbed.owned.remove_stale`)."""
    remove_stale("dm")


def run_cluster(args: argparse.Namespace, console: Any, t0: float) -> int:
    """Build the testbed, launch :mod:`dpcomm.testbed.node` on every server, take the testbed down, report."""
    from dpcomm.testbed import TestbedConfig, TestbedError, down, launch_workers, parse_rate, up
    from dpcomm.testbed.node import ENV_TRACE
    from dpcomm.train import TrainResult

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results_path.unlink(missing_ok=True)
    name = testbed_name()
    cfg = TestbedConfig(name=name, topology=TOPOLOGY, rate_bps=parse_rate(args.rate))
    argv = [sys.executable, "-m", "dpcomm.testbed.node", "train", "--schedules", ",".join(SCHEDULES)]
    argv += ["--iters", str(args.iters), "--results", str(results_path), "--timeout", "60"]
    argv += ["--chrome-trace", str(out / "trace.json")]
    _remove_stale()
    old_term = signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        try:
            state = up(cfg)
        except TestbedError as exc:  # e.g. namespaces refused inside a container
            return _fallback(console, str(exc), out)
        console.print(
            f"Emulated cluster '{name}': {TOPOLOGY}, 4 servers (network namespaces) on one switch, every "
            f"link {args.rate} each way (tc tbf), TCP reno, gloo. Model: ResNet-20 emulated from the shipped "
            f"trace {TRACE}: 39 layers, 1.08 MB of gradients, forward and backward sleep the trace's times "
            f"(the cores serve the network). Schedules {', '.join(SCHEDULES)} side by side in one launch, "
            f"{args.iters} iterations each...",
            highlight=False,
        )
        res = launch_workers(
            state, argv, env={ENV_TRACE: TRACE}, timeout_s=args.timeout, out_dir=out / "workers"
        )
    finally:
        # a second Ctrl-C or SIGTERM must not cut the teardown short
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            down(name)
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    console.print(f"Testbed '{name}' removed; the launch took {res.seconds:.0f} s.", highlight=False)
    if not res.ok or not results_path.exists():
        err = [ln for ln in res.stderr(0).splitlines() if ln.strip() and not ln.startswith("[W")]
        last = err[-1] if err else "no error message"
        print(f"dpcomm demo: error: workers exited {res.returncodes}: {last} (logs: {out / 'workers'})",
              file=sys.stderr)  # fmt: skip
        return 1
    results = [TrainResult(**d) for d in json.loads(results_path.read_text())]
    report(console, results, out, args.rate)
    console.print(f"Took {time.perf_counter() - t0:.0f} s; load average now {loadavg()}.", highlight=False)
    return 0


def _fallback(console: Any, why: str, out: Path) -> int:
    from dpcomm.demo_sim import show

    console.print(
        f"No emulated cluster here: {why}. Showing the simulator's answer for a real cluster instead.",
        highlight=False,
    )
    return show(console, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpcomm.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="skip the emulated cluster: simulator only")
    parser.add_argument(
        "--rate", default="100mbit", help="link rate of the emulated cluster (default 100mbit)"
    )
    parser.add_argument("--iters", type=int, default=30, help="iterations per schedule (default 30, >= 16)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds for the whole launch (default 300)"
    )
    parser.add_argument(
        "--out", default="out/demo", help="folder for the timelines and traces (default out/demo)"
    )
    args = parser.parse_args(argv)
    if args.iters < 16:
        parser.error("--iters must be >= 16 (3 profiled and 9 timed iterations come before the steady ones)")

    from rich.console import Console

    from dpcomm.errors import UserError

    console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)  # prose: one line each
    t0 = time.perf_counter()
    console.print(
        "[bold]dpcomm demo[/bold]: when communication is exposed, how do gradient schedules compare with "
        "PyTorch DDP, measured and simulated?",
    )
    console.print(_machine(), highlight=False)
    out = Path(args.out)
    why = "--simulate was given" if args.simulate else cluster_unavailable()
    if why is not None:
        return _fallback(console, why, out)
    try:
        return run_cluster(args, console, t0)
    except KeyboardInterrupt:
        print("dpcomm demo: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if exc.code == 128 + signal.SIGTERM:  # our SIGTERM handler, after the teardown
            print("dpcomm demo: interrupted", file=sys.stderr)
        raise
    except UserError as exc:
        print(f"dpcomm demo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
