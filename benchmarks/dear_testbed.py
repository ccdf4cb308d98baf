"""DeAR's schedule (``dear``) against PyTorch DDP and dpcomm's ``optimal`` all-reduce plan on the emulated
cluster, measured side by side and predicted, each next to its schedule's limit.

    sudo .venv/bin/python benchmarks/dear_testbed.py [--topologies star:4 bcube:2,2]
        [--models resnet20-cpu-b32@100mbit gpt2-tiny-cpu-b16@150mbit] [--iters 30] [--mtu 1500]
        [--out out/dear_testbed/results.json]

Needs root (network namespaces and ``tc``). Regime: network-bound. Per (topology, model) one emulated
cluster of its own (:mod:`dpcomm.testbed`: a namespace per server, Linux bridges, every link ``tc tbf``-capped
to the model's rate each way, TCP reno, gloo, MTU 1500) and one launch of :mod:`dpcomm.testbed.node` on every
server, as ``make demo`` does: each worker trains the model emulated from its shipped CPU trace
(``emulated:TRACE``, :mod:`dpcomm.trace.emulated`: the trace's layers and parameter sizes, real gradients on
real TCP, forward and backward sleeping the trace's times, so the two cores serve the network) and holds one
replica per schedule, ``ddp``, ``optimal`` and ``dear``, run interleaved iteration by iteration on the same
batches (:func:`dpcomm.train.compare_schedules`), so all three meet the same machine load. ``t_iter`` is
each schedule's median steady iteration. The cluster is removed after its launch, and on Ctrl-C, SIGTERM or a
failure too.

Predicted, as ``make demo`` does (:mod:`dpcomm.demo_report`): the simulator (:func:`dpcomm.sim.simulate`;
a ``dear`` plan is timed by :func:`dpcomm.sim.dear.simulate_dear`) of the plan each dpcomm schedule ran, on
the layer times it profiled, with one all-reduce cost ``T(M) = a + b M`` fitted to every schedule's profiled
all-reduces of the launch (``pooled_cost``; ``dear`` prices its halves with the reduce-scatter and
all-gather its replica timed while profiling), plus its measured optimizer step; DDP's default buckets
(1 MiB, then 25 MiB) as a plan on ``optimal``'s profile. ``limit``: the schedule's bound in the same model
on the same profile and cost (:func:`dpcomm.planner.dear.limits`): ``F + max(B, C)`` for the all-reduce
schedules (``ddp``, ``optimal``: no all-reduce plan is faster), and ``max(F, AG) + max(B, RS)`` for
``dear``, with ``C``, ``AG``, ``RS`` the whole model in one message and the update added to both.
``identical``: every rank's replica ended bitwise identical (sha256 of the parameters).
Below the table, per launch: the fit, both limits, dear's groups, and dear's halves *as run* (a line fitted
to every rank's reduce-scatters and all-gathers in the Chrome trace) against ``T(M)/2``, with the prediction
those would give: how far the halves in training were from their profiled price.

Models and rates (network-bound, the regime DeAR is for: communication the backward cannot hide):

- ResNet-20 (``resnet20-cpu-b32``: 39 layers, 1.08 MB of gradients, F 51 ms, B 78 ms) at 100 Mbit/s: one
  ring all-reduce of the model takes ~140 ms, 1.8x the backward (the ``make demo`` setting).
- GPT-2 tiny (``gpt2-tiny-cpu-b16``: 27 layers, 3.34 MB, F 29 ms, B 57 ms) at 150 Mbit/s: ~285 ms, 5x the
  backward. Not the 1.9x of ResNet-20's setting (400 Mbit/s): on this 2-core VM the emulated links stop being
  the bottleneck above ~200 Mbit/s. At 400 Mbit/s the workers' profiled all-reduce of 3.34 MB took 205-220
  ms (62-66 ns/B; the link's ceiling is 32 ns/B, ``8 x 1.5 / (rate x 0.936)``) while 834 KB took 40-45
  ns/B: the cores (TCP, tbf, gloo's sums for 4 servers on 2 cores, load ~5) set the pace, and the fitted
  cost came out ``a = 0`` with a per-byte cost no link has. At 150 Mbit/s the fit is the link's (85 ns/B
  against 85.5). 100 Mbit/s is network-bound too (~430 ms, 7.5x the backward) but leaves less to
  schedule: every schedule then waits on ``C``, predicted ``dear`` 0.92 of DDP against 0.90 here.

Topologies: ``star:4`` (one switch, ``make demo``'s) and ``bcube:2,2`` (BML's server-centric BCube: 4
servers, 2 NICs each, 2 levels of 2-port switches, relay routes between servers that differ in both digits).
dpcomm's testbed trains there with gloo: the default process group is bound to NIC 0 and reaches every
server through the relays (``tests/test_testbed.py`` checks gloo's all-reduce exact on it; ``dpcomm
validate``'s ``r20-bc22``/``gpt2-bc22`` train on it). Every schedule here moves its gradients with gloo's
ring (``ddp``, ``optimal``: gloo's all-reduce; ``dear``: dpcomm's ring reduce-scatter and all-gather on
gloo), rank ``r`` sending to ``r + 1``; on ``bcube:2,2`` the hops ``1 -> 2`` and ``3 -> 0`` are relayed
(``1 -> 3 -> 2``, ``3 -> 1 -> 0``), and each of the four flows still has every directed link to itself, so
the ring's bandwidth is the link's as on ``star:4``, but two of its flows cross a relay's kernel and share
links with the other flows' ACKs (the fitted all-reduce came out 5-20% slower per byte than on ``star:4``).
``star:8`` was the fallback (8 processes on 2 cores).

Goals: ``dear`` below the all-reduce limit and at most 0.70 of DDP's iteration time on ``star:4`` ResNet-20;
every row's prediction within 10% of its measurement. The end prints whether each held, then a markdown
table (first line the command, second the machine and its load) ready to paste into the docs. The JSON under
``--out`` (atomic write) holds every row, with the fit, profile and plan it came from; each launch's folder
beside it keeps the workers' logs, the node's full results (per-iteration records) and the Chrome traces
(``trace.<schedule>.json``, every rank's compute and communication).

Measured (2-core VM, quiet, 171 s; the table is in ``docs/dear.md``): every goal met. ``dear`` ran at 0.646
of DDP on ``star:4`` ResNet-20 (below the all-reduce limit, 164.8 < 191.7 ms) and 0.662 on ``bcube:2,2``;
every row within 5% of its prediction (worst -4.9%, ``star:4`` ResNet-20 ``dear``). ``dear`` is priced with
the halves its replica timed while profiling (:class:`~dpcomm.planner.dear.SplitCost`): on gloo they are
dpcomm's ring, not half of gloo's all-reduce (1.11-1.43x half of it on ``bcube:2,2`` in earlier runs, which
put ``dear``'s predictions 4-21% fast under a load of 2-14 from other jobs). What is left of the error is
the ranks' skew: ``dear`` waits for the slowest rank twice an iteration (its gathers need every forward
begun, its last reduce-scatter every backward done), an all-reduce plan once; on a loaded machine the four
workers' iterations drift 10-50 ms apart. On GPT-2 tiny ``dear`` can gain at most ``F`` (29 ms, 9%: its
limit is ``AG + RS = C`` against ``F + C`` with ``C`` 5x the backward); on ``bcube:2,2``, whose relayed
ring makes its halves dearer, its limit is above the all-reduce one and it ran 3% slower than DDP, as
``dpcomm plan``'s verdict would say.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from _common import loadavg, sigterm_exits

SCHEDULES = ("ddp", "optimal", "dear")
TOPOLOGIES = ("star:4", "bcube:2,2")
MODELS = ("resnet20-cpu-b32@100mbit", "gpt2-tiny-cpu-b16@150mbit")
PREFIX = "dt"
"""Testbed names ``dt<pid in hex>`` (:func:`dpcomm.testbed.owned.owned_name`): this process's own."""
GOAL_RATIO = 0.70
GOAL_ERROR = 0.10
COLUMNS = ("topology", "model", "rate", "schedule", "groups", "t_iter ms", "vs DDP", "predicted ms", "error",
           "limit ms", "identical")  # fmt: skip


def parse_model(text: str) -> tuple[str, str]:
    """``TRACE@RATE`` -> ``(trace, rate)``."""
    trace, sep, rate = text.partition("@")
    if not sep or not trace or not rate:
        raise argparse.ArgumentTypeError(f"expected TRACE@RATE (e.g. resnet20-cpu-b32@100mbit), got {text!r}")
    return trace, rate


def machine_line(load_start: str | None = None) -> str:
    import torch

    load = f"{load_start} at the start, {loadavg()} at the end" if load_start else loadavg()
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"load average {load}"
    )


def command_line() -> str:
    """The command as run (the interpreter and script relative to the working folder)."""
    exe = os.path.relpath(sys.executable) if sys.executable else "python"
    return shlex.join([exe, os.path.relpath(sys.argv[0]), *sys.argv[1:]])


# --- the demo's machinery, as small public wrappers -----------------------------------------------------


def fit_cost(results: list[Any]) -> Any:
    """The launch's one all-reduce cost (``make demo``'s :func:`dpcomm.demo_report.pooled_cost`)."""
    from dpcomm.demo_report import pooled_cost

    return pooled_cost(results)


def predictions(results: list[Any], cost: Any) -> dict[str, Any]:
    """The simulator's result per schedule, as ``make demo`` predicts (:mod:`dpcomm.demo_report`)."""
    from dpcomm.demo_report import _predictions

    return _predictions(results, cost)


def _profile_of(results: list[Any], r: Any) -> Any:
    """The trace the row's prediction used: its own profile, DDP's from ``optimal`` (as ``_predictions``)."""
    from dpcomm.trace.format import trace_from_dict

    if r.trace:
        return trace_from_dict(r.trace)
    ref = next((x for x in results if x.schedule == "optimal" and x.trace), None)
    ref = ref or next((x for x in results if x.trace), None)
    return trace_from_dict(ref.trace) if ref is not None else None


def schedule_limits(results: list[Any], r: Any, cost: Any) -> dict[str, float] | None:
    """:func:`dpcomm.planner.dear.limits` on the profile and update the row's prediction used."""
    from dpcomm.planner.dear import limits, split_cost

    trace = _profile_of(results, r)
    if trace is None or cost is None:
        return None
    return limits(trace, split_cost(cost, (r.cost or {}).get("halves")), r.nproc, r.update_s)


_EVENT = re.compile(r"^(reduce-scatter|all-gather) group \d+ \(layers [^,]+, (\d+) B\)$")


def measured_halves(r: Any) -> dict[str, Any] | None:
    """A ``dear`` run's own price of each half: ``T(M) = a + b M`` fitted (as ``pooled_cost`` fits, OLS,
    ``a, b >= 0``) to the median duration per size of its reduce-scatters and of its all-gathers, every rank's
    events in its Chrome trace; None without a trace or two sizes. The model prices each at half the
    all-reduce (:func:`dpcomm.planner.dear.rs_ag_costs`); this says how far the run's halves were from it."""
    import statistics

    from dpcomm.costmodel.base import LinearCost
    from dpcomm.costmodel.fit import fit_line

    if not r.chrome_trace or not Path(r.chrome_trace).exists():
        return None
    data = json.loads(Path(r.chrome_trace).read_text())
    by: dict[tuple[str, int], list[float]] = {}
    for e in data["traceEvents"] if isinstance(data, dict) else data:
        m = _EVENT.match(str(e.get("name", ""))) if e.get("ph") == "X" else None
        if m:
            by.setdefault((m.group(1), int(m.group(2))), []).append(e["dur"] / 1e6)
    out = {}
    for op in ("reduce-scatter", "all-gather"):
        pts = [(nb, statistics.median(ts)) for (o, nb), ts in sorted(by.items()) if o == op]
        if len(pts) < 2:
            return None
        out[op] = LinearCost(*fit_line(pts, weighting="ols", nonneg=True).coef)
    return out


def predict_with_halves(r: Any, halves: dict[str, Any]) -> float:
    """The ``dear`` prediction with the run's own reduce-scatter and all-gather costs in place of halves."""
    from dpcomm.plan import Plan
    from dpcomm.planner.dear import dear_times
    from dpcomm.trace.format import trace_from_dict

    t = dear_times(trace_from_dict(r.trace), Plan.from_dict(r.plan), halves["reduce-scatter"],
                   halves["all-gather"], r.nproc, r.update_s)  # fmt: skip
    return t.t_iter_s


def _groups_text(groups: list[list[int]]) -> str:
    return " ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def rows_of(key: dict[str, Any], results: list[Any]) -> list[dict[str, Any]]:
    """One row per schedule of a launch: measured, predicted, limits, replicas, and what they came from."""
    cost = fit_cost(results)
    sims = predictions(results, cost)
    ddp = next((r for r in results if r.schedule == "ddp"), None)
    rows = []
    for r in results:
        sim = sims.get(r.schedule)
        lim = schedule_limits(results, r, cost)
        plan = r.plan or {}
        groups = plan.get("groups") or ([list(e.layers) for e in sim.comm] if sim is not None else [])
        limit = None if lim is None else lim["dear" if r.schedule == "dear" else "allreduce"]
        prof = _profile_of(results, r)
        rows.append(
            {
                **key,
                "schedule": r.schedule,
                "kept": plan.get("schedule") or r.schedule,
                "groups": len(groups),
                "groups_text": _groups_text(groups),
                "t_iter_s": r.t_iter_s,
                "vs_ddp": r.t_iter_s / ddp.t_iter_s if ddp is not None else None,
                "predicted_s": sim.t_iter_s if sim is not None else None,
                "error": (sim.t_iter_s - r.t_iter_s) / r.t_iter_s if sim is not None else None,
                "limit_s": limit,
                "limit_allreduce_s": None if lim is None else lim["allreduce"],
                "limit_dear_s": None if lim is None else lim["dear"],
                "identical": len(set(r.params_sha256)) == 1,
                "nproc": r.nproc,
                "forward_s": r.forward_s,
                "backward_s": r.backward_s,
                "exposed_comm_s": r.exposed_comm_s,
                "update_s": r.update_s,
                "profile_forward_s": sum(x.forward_s for x in prof.layers) if prof is not None else None,
                "profile_backward_s": sum(x.backward_s for x in prof.layers) if prof is not None else None,
                "grad_bytes": r.grad_bytes,
                "cost_a_s": cost.a if cost is not None else None,
                "cost_b_s_per_byte": cost.b if cost is not None else None,
                "loss_final": r.loss_final,
            }
        )
        halves = measured_halves(r) if r.schedule == "dear" and r.trace and r.plan else None
        if halves is not None:
            own = predict_with_halves(r, halves)
            rows[-1]["halves"] = {op: {"a_s": c.a, "b_s_per_byte": c.b} for op, c in halves.items()}
            rows[-1]["predicted_own_halves_s"] = own
            rows[-1]["error_own_halves"] = (own - r.t_iter_s) / r.t_iter_s
    return rows


# --- the launches ---------------------------------------------------------------------------------------


def run_launch(args: argparse.Namespace, i: int, n: int, topology: str, trace: str, rate: str) -> dict:
    """Build ``topology`` at ``rate``, launch the node program on every server with the three schedules,
    take the testbed down (also on SIGTERM, Ctrl-C, an error), and return the launch's rows."""
    from dpcomm.testbed import TestbedConfig, down, launch_workers, parse_rate, up
    from dpcomm.testbed.node import ENV_TRACE
    from dpcomm.testbed.owned import owned_name
    from dpcomm.trace.shipped import find_trace
    from dpcomm.train import TrainResult

    key = {"topology": topology, "model": trace, "rate": rate}
    folder = Path(args.out).resolve().parent / f"{topology.replace(':', '').replace(',', '-')}_{trace}"
    folder.mkdir(parents=True, exist_ok=True)
    results_path = folder / "results.json"
    results_path.unlink(missing_ok=True)
    name = owned_name(PREFIX)
    batch = find_trace(trace).batch_size
    argv = [sys.executable, "-m", "dpcomm.testbed.node", "train", "--schedules", ",".join(SCHEDULES)]
    argv += ["--iters", str(args.iters), "--batch-size", str(batch), "--results", str(results_path)]
    argv += ["--timeout", "60", "--chrome-trace", str(folder / "trace.json")]
    cfg = TestbedConfig(name=name, topology=topology, rate_bps=parse_rate(rate), mtu=args.mtu)
    load0, t0 = loadavg(), time.perf_counter()
    print(f"[{i}/{n}] {topology} {trace} at {rate}: {', '.join(SCHEDULES)} side by side, {args.iters} "
          f"iterations, batch {batch}; load {load0} ...", flush=True)  # fmt: skip
    down(name)
    res = None
    try:
        state = up(cfg)
        res = launch_workers(
            state, argv, master_port=29470 + i, env={ENV_TRACE: trace}, timeout_s=args.timeout,
            out_dir=folder / "workers",
        )  # fmt: skip
    finally:
        # a second Ctrl-C or SIGTERM must not cut the teardown short
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            down(name)
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    wall = time.perf_counter() - t0
    meta = {**key, "launch_s": res.seconds, "wall_s": wall, "loadavg_before": load0,
            "loadavg_after": loadavg(), "returncodes": res.returncodes, "batch_size": batch,
            "folder": os.path.relpath(folder)}  # fmt: skip
    if not res.ok or not results_path.exists():
        err = [ln for ln in res.stderr(0).splitlines() if ln.strip() and not ln.startswith("[W")]
        meta["error"] = err[-1] if err else "no error message"
        print(f"[{i}/{n}] {topology} {trace}: FAILED after {wall:.0f} s, workers exited {res.returncodes}: "
              f"{meta['error']} (logs: {folder / 'workers'})", flush=True)  # fmt: skip
        return {"meta": meta, "rows": []}
    results = [TrainResult(**d) for d in json.loads(results_path.read_text())]
    rows = rows_of(key, results)
    by = {r["schedule"]: r for r in rows}
    summary = ", ".join(f"{s} {by[s]['t_iter_s'] * 1e3:.1f} ms" for s in SCHEDULES if s in by)
    print(f"[{i}/{n}] {topology} {trace}: done in {wall:.0f} s ({summary}); load {meta['loadavg_after']}",
          flush=True)  # fmt: skip
    return {"meta": meta, "rows": rows}


# --- the report -----------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def cells(row: dict[str, Any]) -> list[str]:
    kept = row["kept"]
    groups = str(row["groups"] or "-") + (f" (kept {kept})" if kept != row["schedule"] else "")
    return [
        row["topology"],
        row["model"],
        row["rate"],
        row["schedule"],
        groups,
        _ms(row["t_iter_s"]),
        "-" if row["vs_ddp"] is None else f"{row['vs_ddp']:.3f}",
        _ms(row["predicted_s"]),
        "-" if row["error"] is None else f"{row['error']:+.1%}",
        _ms(row["limit_s"]),
        "yes" if row["identical"] else "NO",
    ]


def markdown(data: dict[str, Any]) -> str:
    lines = [f"`{data['command']}`", "", data["machine"], ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(" --- " for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in data["rows"]]
    return "\n".join(lines)


def goals(rows: list[dict[str, Any]]) -> list[tuple[str, bool | None]]:
    """Each goal of the module docstring, met (True), missed (False) or not measured (None)."""
    out: list[tuple[str, bool | None]] = []
    d = next((r for r in rows if r["schedule"] == "dear" and r["topology"] == "star:4"
              and r["model"].startswith("resnet20")), None)  # fmt: skip
    what = "dear on star:4 ResNet-20"
    if d is None:
        out.append((f"{what} measured", None))
    else:
        lim, ratio = d["limit_allreduce_s"], d["vs_ddp"]
        below = None if lim is None else d["t_iter_s"] < lim
        out.append((f"{what} below the all-reduce limit ({_ms(d['t_iter_s'])} < {_ms(lim)} ms)", below))
        if ratio is None:
            out.append((f"{what} against DDP", None))
        else:
            out.append((f"{what} <= {GOAL_RATIO:.2f} of DDP ({ratio:.3f})", ratio <= GOAL_RATIO))
    errs = [r for r in rows if r["error"] is not None]
    worst = max(errs, key=lambda r: abs(r["error"]), default=None)
    text = f"every prediction within {GOAL_ERROR:.0%}"
    if worst is not None:
        text += f" (worst {worst['error']:+.1%}: {worst['topology']} {worst['model']} {worst['schedule']})"
    missing = len(errs) < len(rows) or not rows
    out.append((text, None if missing and not errs else all(abs(r["error"]) <= GOAL_ERROR for r in errs)))
    return out


def report(console: Any, data: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="dear against DDP and optimal on the emulated cluster, measured and predicted")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("topology", "model", "rate", "schedule") else "right")
    for r in data["rows"]:
        table.add_row(*cells(r))
    console.print(table)
    for m in data["launches"]:
        rows = [r for r in data["rows"] if r["topology"] == m["topology"] and r["model"] == m["model"]]
        if not rows:
            console.print(f"{m['topology']} {m['model']}: no result ({m.get('error')})", highlight=False)
            continue
        r0 = rows[0]
        lim = next((r for r in rows if r["schedule"] == "dear"), r0)
        a, b, grad = r0["cost_a_s"] or 0.0, r0["cost_b_s_per_byte"] or 0.0, r0["grad_bytes"]
        console.print(
            f"{m['topology']} {m['model']} at {m['rate']}: T(M) = {a * 1e3:.1f} ms + M x {b * 1e9:.0f} ns/B, "
            f"one all-reduce of {grad / 1e6:.2f} MB {_ms(a + b * grad)} ms; limits all-reduce "
            f"{_ms(lim['limit_allreduce_s'])} ms, dear {_ms(lim['limit_dear_s'])} ms; dear's groups "
            f"(backward order) {lim['groups_text']}; launch {m['launch_s']:.0f} s, load "
            f"{m['loadavg_before']} -> {m['loadavg_after']}.",
            highlight=False,
        )
        h = lim.get("halves")
        if h:
            rs, ag = h["reduce-scatter"], h["all-gather"]
            console.print(
                f"  dear's halves as run: reduce-scatter {rs['a_s'] * 1e3:.1f} ms + M x "
                f"{rs['b_s_per_byte'] * 1e9:.0f} ns/B, all-gather {ag['a_s'] * 1e3:.1f} ms + M x "
                f"{ag['b_s_per_byte'] * 1e9:.0f} ns/B, against half the all-reduce ({a * 500:.1f} ms + M x "
                f"{b * 5e8:.0f} ns/B); priced so, dear is predicted at "
                f"{_ms(lim['predicted_own_halves_s'])} ms ({lim['error_own_halves']:+.1%}).",
                highlight=False,
            )
    for text, ok in goals(data["rows"]):
        mark = "n/a" if ok is None else ("met" if ok else "MISSED")
        console.print(f"Goal: {text}: {mark}.", highlight=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES), help="default: star:4 bcube:2,2")
    ap.add_argument("--models", nargs="+", type=parse_model, default=[parse_model(m) for m in MODELS],
                    metavar="TRACE@RATE",
                    help=f"shipped traces and their link rates (default: {' '.join(MODELS)})")  # fmt: skip
    ap.add_argument("--iters", type=int, default=30, help="iterations per schedule (default 30, >= 16)")
    ap.add_argument("--mtu", type=int, default=1500, help="the emulated links' MTU (default 1500)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per launch (default 300)")
    ap.add_argument("--out", default="out/dear_testbed/results.json", help="the rows as JSON (atomic write)")
    ap.add_argument("--table", default=None, metavar="JSON", help="print a recorded JSON's tables, exit")
    args = ap.parse_args(argv)

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=True)
    if args.table:
        data = json.loads(Path(args.table).read_text())
        report(console, data)
        print(markdown(data))
        return 0
    if args.iters < 16:
        ap.error("--iters must be >= 16 (3 profiled and 9 timed iterations come before the steady ones)")
    if os.geteuid() != 0:
        print("dear_testbed: needs root (network namespaces and tc)", file=sys.stderr)
        return 2

    from dpcomm.errors import UserError
    from dpcomm.testbed.owned import remove_stale
    from dpcomm.utils.io import atomic_write_json, check_output_path

    try:
        check_output_path(args.out, make_folders=True)
    except UserError as exc:
        ap.error(str(exc))

    command, t0, load0 = command_line(), time.perf_counter(), loadavg()
    console.print(machine_line(), highlight=False)
    remove_stale(PREFIX)  # testbeds of runs killed outright (SIGKILL skips finally)
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    todo = [(t, m, r) for t in args.topologies for m, r in args.models]
    launches, rows = [], []
    try:
        for i, (topology, trace, rate) in enumerate(todo, 1):
            got = run_launch(args, i, len(todo), topology, trace, rate)
            launches.append(got["meta"])
            rows += got["rows"]
    except KeyboardInterrupt:
        print("dear_testbed: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if exc.code == 128 + signal.SIGTERM:
            print("dear_testbed: interrupted", file=sys.stderr)
        raise
    import torch

    data = {
        "command": command,
        "machine": machine_line(load0),
        "platform": platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "schedules": list(SCHEDULES),
        "iters": args.iters,
        "mtu": args.mtu,
        "wall_s": time.perf_counter() - t0,
        "launches": launches,
        "rows": rows,
        "goals": [{"goal": g, "met": ok} for g, ok in goals(rows)],
    }
    atomic_write_json(args.out, data)
    report(console, data)
    console.print(f"Rows: {args.out}; took {data['wall_s']:.0f} s.", highlight=False)
    print()
    print(markdown(data))
    return 0 if all(m.get("error") is None for m in launches) else 1


if __name__ == "__main__":
    sys.exit(main())
