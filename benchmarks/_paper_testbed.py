"""What the two paper reproductions on the emulated cluster share: scaled traces, one launch per model on a
testbed of their own (always removed), the machine's description.

Used by ``reproduce_mgwfbp_testbed.py`` and ``reproduce_lp_table2.py``; the per-server program is
:mod:`dpcomm.testbed.node` (``train``, with its ``bsp:MODE:COLLECTIVE:PLANNER`` schedules).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from _common import busy_share, cpu_ticks, loadavg, sigterm_exits, without_folder

__all__ = ["NODE", "machine", "run_launches", "scaled_trace", "testbed_name"]

NODE = ["-m", "dpcomm.testbed.node", "train"]
"""The node program's arguments after the interpreter."""


def testbed_name(prefix: str) -> str:
    """A testbed name of this process's own (``prefix`` and the pid in hex, at most 8 characters)."""
    return f"{prefix}{os.getpid():x}"[:8]


def machine() -> dict[str, Any]:
    import torch

    return {
        "machine": f"2-core VM ({platform.machine()}), {os.cpu_count()} CPU cores",
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def results(args: Any, scratch: Path, topology: str, **fields: Any) -> dict[str, Any]:
    """A reproduction's results file: the command, the machine, the load at the end, the testbed
    (``topology``, ``args.rate``, ``args.mtu``) and ``fields``, without the ``scratch`` folder's path."""
    head = {"command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]), **machine()}
    head |= {"loadavg_end": loadavg(), "topology": topology, "rate": args.rate, "mtu": args.mtu}
    return without_folder(head | fields, scratch)


def scaled_trace(trace: Any, *, time_scale: float, byte_scale: float, total_s: float | None = None) -> Any:
    """``trace`` with every layer's times multiplied by ``time_scale`` (or scaled to sum to ``total_s``) and
    its parameter count divided by ``byte_scale`` (rounded, at least 1 element)."""
    if total_s is not None:
        time_scale = total_s / sum(l.forward_s + l.backward_s for l in trace.layers)
    layers = tuple(
        dataclasses.replace(
            l,
            params=max(1, round(l.params / byte_scale)),
            forward_s=l.forward_s * time_scale,
            backward_s=l.backward_s * time_scale,
            param_names=(),
        )
        for l in trace.layers
    )
    extra = {**trace.extra, "time_scale": time_scale, "byte_scale": byte_scale}
    return dataclasses.replace(trace, layers=layers, extra=extra)


def run_launches(
    *,
    name: str,
    topology: str,
    rate: str,
    mtu: int,
    launches: list[dict[str, Any]],
    out: Path,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Build the testbed ``name``, run each launch (``{"key", "trace", "schedules", "iters"}``: the node
    program on every server with the trace file), take the testbed down (also on SIGTERM or an error).
    Returns per launch the results (TrainResult dicts) with the load average and CPU share around it."""
    from dpcomm.testbed import TestbedConfig, down, launch_workers, parse_rate, up
    from dpcomm.testbed.node import ENV_TRACE

    sigterm_exits()
    cfg = TestbedConfig(name=name, topology=topology, rate_bps=parse_rate(rate), mtu=mtu)
    rows = []
    try:
        state = up(cfg)
        for i, job in enumerate(launches):
            results = out / f"{job['key']}.results.json"
            results.unlink(missing_ok=True)
            argv = [sys.executable, *NODE, "--schedules", ",".join(job["schedules"])]
            argv += ["--iters", str(job["iters"]), "--results", str(results), "--batch-size", "1"]
            argv += job.get("extra_argv", [])
            load0, ticks0, t0 = loadavg(), cpu_ticks(), time.time()
            res = launch_workers(
                state,
                argv,
                master_port=29600 + i,
                env={ENV_TRACE: str(job["trace"])},
                timeout_s=timeout_s,
                out_dir=out / f"{job['key']}.workers",
            )
            row = {
                "key": job["key"],
                "loadavg_before": load0,
                "loadavg_after": loadavg(),
                "cpu_busy_share": busy_share(ticks0, cpu_ticks()),
                "launch_s": res.seconds,
                "started_unix": t0,
                "returncodes": res.returncodes,
            }
            if res.ok and results.exists():
                row["results"] = json.loads(results.read_text())
            else:
                err = [ln for ln in res.stderr(0).splitlines() if ln.strip() and not ln.startswith("[W")]
                row["error"] = err[-1] if err else "no error message"
            print(f"{job['key']}: {res.seconds:.0f} s, load {row['loadavg_before']} -> {row['loadavg_after']}"
                  + (f", ERROR {row['error']}" if "error" in row else ""), flush=True)  # fmt: skip
            rows.append(row)
    finally:
        down(name)
    return rows
