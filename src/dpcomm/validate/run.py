"""Run one validation case on the emulated cluster: build a testbed of its own, launch the node program
(:mod:`dpcomm.testbed.node`: ``train`` for a training case, ``allreduce`` for a multi-GPU one) on every
server, take the testbed down (always), keep the results.

:func:`run_case` is the library call (``dpcomm validate`` and anyone measuring schedules side by side on
the emulated cluster): it returns the case's record, a plain dict ``{"case", "results", "machine",
"launch_s"}`` whose ``results`` are the :class:`~dpcomm.train.TrainResult` dicts of every schedule (of a
multi-GPU case: one row per algorithm and size, :mod:`dpcomm.testbed.node`), and
writes it atomically to ``<out>/<case>.json``, so a rerun with the same ``out`` skips the cases already
measured (:func:`load_record`). The testbed is named ``vl<pid in hex>``; it is removed on return, on an
error, on Ctrl-C and on SIGTERM (a second signal does not cut the teardown short), and a later run removes
the testbed of a run that was killed outright (:func:`remove_stale`).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcomm.errors import UserError
from dpcomm.testbed.owned import loadavg, owned_name
from dpcomm.testbed.owned import remove_stale as _remove_owned
from dpcomm.validate.cases import Case

__all__ = [
    "cluster_unavailable",
    "load_record",
    "loadavg",
    "machine",
    "remove_stale",
    "run_case",
    "testbed_name",
]

_PREFIX = "vl"


def machine() -> dict[str, Any]:
    """What the results were measured on."""
    import torch

    return {"arch": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version()}  # fmt: skip


def cluster_unavailable() -> str | None:
    """Why this machine cannot build the emulated cluster (one line), or None when it can try."""
    from dpcomm.demo import cluster_unavailable as why

    return why()


def testbed_name(pid: int | None = None) -> str:
    """``vl`` and the pid in hex (at most 8 characters: pids are < 2**22)."""
    return owned_name(_PREFIX, pid)


def remove_stale() -> None:
    """Take down testbeds of validate runs killed outright (:func:`dpcomm.testbed.owned.remove_stale`)."""
    _remove_owned(_PREFIX)


def load_record(out: Path, case: Case) -> dict[str, Any] | None:
    """The record of ``case`` a previous run left in ``out`` (None: none, unreadable, or of another case
    definition)."""
    path = Path(out) / f"{case.name}.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and rec.get("case") == case.to_dict() and rec.get("results")
    return rec if ok else None


def run_case(
    case: Case,
    out: str | os.PathLike,
    *,
    timeout_s: float = 900.0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure ``case`` (module docstring); returns its record. A failed launch is a :class:`UserError`
    naming the workers' last error line and their logs."""
    from dpcomm.testbed import TestbedConfig, down, launch_workers, parse_rate, up
    from dpcomm.testbed.node import ENV_TRACE

    out = Path(out).resolve()
    work = out / case.name
    work.mkdir(parents=True, exist_ok=True)
    name = testbed_name()
    intra = parse_rate(case.intra_rate) if case.intra_rate else None
    cfg = TestbedConfig(name=name, topology=case.topology, rate_bps=parse_rate(case.rate), gpus=case.gpus,
                        intra_rate_bps=intra)  # fmt: skip
    remove_stale()
    before = loadavg()
    main = threading.current_thread() is threading.main_thread()
    old_term = signal.getsignal(signal.SIGTERM) if main else None
    if main and not callable(old_term):  # the dpcomm CLI has its own handler (an exception): keep it
        signal.signal(signal.SIGTERM, _exit_on_term)
    results, seconds = [], []
    try:
        state = up(cfg)
        if log:
            ranks = f", {case.gpus} ranks per server, loopback {case.intra_rate}" if case.gpus > 1 else ""
            log(f"testbed '{name}' up: {case.topology} at {case.rate}{ranks}")
        for i, group in enumerate(launches(case)):
            where = work / f"launch{i}"
            where.mkdir(exist_ok=True)
            results_path = where / "results.json"
            results_path.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "dpcomm.testbed.node", *node_args(case, group)]
            argv += ["--results", str(results_path)]
            res = launch_workers(state, argv, master_port=29400 + i, env={ENV_TRACE: case.trace},
                                 timeout_s=timeout_s, out_dir=where)  # fmt: skip
            if not res.ok or not results_path.exists():
                err = [ln for ln in res.stderr(0).splitlines() if ln.strip() and not ln.startswith("[W")]
                raise UserError(f"case {case.name}: workers exited {res.returncodes}: "
                                f"{err[-1] if err else 'no error message'} (logs: {where})")  # fmt: skip
            results += json.loads(results_path.read_text())
            seconds.append(res.seconds)
            if log:
                log(f"launch {i + 1}: {', '.join(group)} in {res.seconds:.0f} s")
    finally:
        _down(name, down, main, old_term)
    if log:
        log(f"testbed '{name}' removed")
    from dpcomm.utils.io import atomic_write_json

    order = {s: i for i, s in enumerate(case.schedules)}
    if case.kind == "train":
        results.sort(key=lambda r: order.get(r["schedule"], len(order)))
    record = {
        "case": case.to_dict(),
        "machine": {**machine(), "loadavg_before": before, "loadavg_after": loadavg()},
        "launch_s": seconds,
        "results": results,
    }
    atomic_write_json(out / f"{case.name}.json", record)
    return record


def node_args(case: Case, group: tuple[str, ...]) -> list[str]:
    """The node program's arguments for one launch of ``case`` (``group``: its schedules or algorithms)."""
    if case.kind == "allreduce":
        return ["allreduce", "--algorithms", ",".join(group), "--sizes", ",".join(case.sizes),
                "--iters", str(case.iters)]  # fmt: skip
    model = ["--model", case.model] if case.model else []
    model += ["--compile", case.compile] if case.compile else []
    return ["train", "--schedules", ",".join(group), "--collective", case.collective, "--mode", case.mode,
            "--iters", str(case.iters), "--batch-size", str(case.batch_size), *model]  # fmt: skip


def launches(case: Case) -> list[tuple[str, ...]]:
    """The launches of a case: every schedule side by side in one, except the parameter server's, each in a
    launch of its own. A PS worker posts the next iteration's pulls at the end of its iteration (BSP: the
    servers have the update), so their bytes are on the wire while the *next replica* of an interleaved run
    computes: the PS's own iteration then looks shorter than it is and its neighbour's longer (measured on
    ``star:4``, 100 Mbit/s: ``fsdp:per-block`` run after ``ps:ibatch`` spent 195 ms in forward against
    140 ms for ``fsdp:optimal`` running the very same one-unit plan next to it; docs/validate.md). A
    multi-GPU case's algorithms run in one launch, one after another; a compiled case's schedules each in
    a launch of its own."""
    if case.kind == "allreduce":
        return [case.algorithms]
    if case.compile:  # one compiled DDP per process (Case.compile)
        return [(s,) for s in case.schedules]
    ps = tuple(s for s in case.schedules if s.strip().startswith("ps:"))
    rest = tuple(s for s in case.schedules if s not in ps)
    return ([rest] if rest else []) + [(s,) for s in ps]


def _exit_on_term(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _down(name: str, down: Callable[[str], None], main: bool, old_term: Any) -> None:
    """``down(name)`` with Ctrl-C and SIGTERM held off (a second signal must not cut it short)."""
    if not main:
        down(name)
        return
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        down(name)
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
