"""FSDP2 plans measured side by side on the emulated cluster, each next to the model's prediction:
``optimal`` against ``per-block``, ``whole``, ``per-layer`` and the best ``size:X`` at several memory
budgets, for an emulated transformer and an emulated CNN (issue 30, item 5).

    sudo .venv/bin/python benchmarks/fsdp_testbed.py --testbed star:4 --rate 100mbit \\
        --models gpt2-tiny-cpu-b16,resnet20-cpu-b32 --repeats 2 --out docs/data/fsdp/testbed.json

Regime: network-bound. Every worker is one emulated server (``dpcomm testbed``: namespaces, a bridge,
``tc tbf`` links of ``--rate``) and the model computes by sleeping a shipped trace's times (the model
:class:`NestedEmulated` below: :mod:`dpcomm.trace.emulated`'s layers under the trace's own module names,
so ``per-block`` finds the blocks ``h.0``, ``layers.3``), so the two cores are left to gloo's TCP.

Per model and repeat, one launch of the workers holds one FSDP2 replica per (planner, budget) and runs
them interleaved, iteration by iteration (:func:`dpcomm.train.compare_schedules`), so all see the same
machine load. Each replica plans on the workers (:func:`dpcomm.fsdp.shard`: the emulated units timed,
all-gather and reduce-scatter timed on the shaped links and fitted to ``a + b B``), with
``verify_iters=0``: the planned plan runs as planned (``optimal`` is not swapped for ``per-block`` by the
trial), so what is measured is the planner's plan. ``t_iter`` is the median of the steady iterations.
The prediction is :func:`dpcomm.planner.fsdp_model.fsdp_time` of the plan as run, under the model the
plan was made with (``overlap="gathers"`` on CPU: :func:`dpcomm.fsdp.shard` makes FSDP2's all-gathers
asynchronous there, the reduce-scatters block), on the workers' trace and fitted costs (from the result's
log), plus the measured optimizer step (the model's ``u``). Column ``streams``: the same plan under the
GPU model (every collective on a stream of its own), for comparison.

Budgets (unsharded parameter bytes): ``none``; ``block`` (``per-block``'s peak with FSDP2's defaults,
prefetch 1 and reshard); ``tight`` (``per-block``'s peak without prefetch: its largest unit). A
planner whose plan cannot fit a budget (``whole`` under any) is reported as such and not run. ``size:X``:
the ``X`` of a grid (16 KiB .. 4 MiB) whose plan the model, on the testbed's nominal ring costs, finds
fastest at that budget.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

ENV_TRACE = "DPCOMM_FSDP_BENCH_TRACE"
"""The shipped trace whose nested emulated model the workers train (also read by spawned workers)."""
PREFIX = "fsdp-emulated:"
METHODS = ("per-block", "optimal", "whole", "per-layer", "size")
SIZES = tuple(16 << (10 + k) for k in range(9))  # 16 KiB .. 4 MiB
_COST = re.compile(
    r"all-gather LinearCost\(a=([^,]+), b=([^)]+)\), reduce-scatter LinearCost\(a=([^,]+), b=([^)]+)\)"
)


def nested_emulated(trace: Any, num_classes: int = 10) -> Any:
    """An emulated model (:class:`dpcomm.trace.emulated.EmulatedLayer` per trace layer) whose modules carry
    the trace's names: ``h.0.attn.c_attn`` is leaf ``c_attn`` of container ``h.0.attn``. A container's
    forward runs its children in order, so FSDP2's hooks on a container (a ``per-block`` unit) fire."""
    from torch import nn

    from dpcomm.trace.emulated import EmulatedLayer

    class Seq(nn.Module):
        def forward(self, h):
            for child in self.children():
                h = child(h)
            return h

    class NestedEmulated(Seq):
        def forward(self, x):
            import torch

            return super().forward(torch.zeros(x.shape[0], num_classes))

    root = NestedEmulated()
    for layer in trace.layers:
        *path, leaf = layer.name.split(".")
        parent = root
        for part in path:
            if part not in parent._modules:
                parent.add_module(part, Seq())
            parent = parent._modules[part]
        parent.add_module(leaf, EmulatedLayer(layer.params, layer.forward_s, layer.backward_s))
    order = [n for n, m in root.named_modules() if isinstance(m, EmulatedLayer)]
    if order != [x.name for x in trace.layers]:
        raise ValueError(f"{trace.model}: the trace's modules are not contiguous by name")
    return root


def register(spec: str) -> str:
    """Add ``fsdp-emulated:SPEC`` to the model zoo (idempotent); the model name."""
    from dpcomm.models import MODELS, ModelSpec
    from dpcomm.trace import find_trace

    spec = spec.removeprefix(PREFIX)
    name = PREFIX + spec
    if name not in MODELS:
        trace = find_trace(spec)
        MODELS[name] = ModelSpec(
            name=name, build=lambda classes: nested_emulated(trace, classes or 10), input_shape=(1,),
            num_classes=10, params=sum(max(1, x.params) for x in trace.layers),
            description=f"{trace.model}'s trace {spec}, module names kept, compute that sleeps its times",
        )  # fmt: skip
    return name


if os.environ.get(ENV_TRACE):  # spawned training workers import this file as __mp_main__
    register(os.environ[ENV_TRACE])


def _modules(spec: str) -> Any:
    """The planner's view of the emulated model: the trace, each layer at least one element (as built)."""
    from dataclasses import replace

    from dpcomm.planner.fsdp import Modules
    from dpcomm.trace import find_trace

    tr = find_trace(spec)
    tr = replace(tr, dtype_bytes=4, layers=tuple(replace(x, params=max(1, x.params)) for x in tr.layers))
    return tr, Modules.from_trace(tr)


def cases(spec: str, rate_bps: int, mtu: int, world: int, max_depth: int) -> list[dict[str, Any]]:
    """``[{budget, bytes, method, schedule | error}]`` for one model: the schedules to run, and the plans
    that cannot fit (decided on sizes alone, so the workers would refuse them too)."""
    from dpcomm.errors import UserError
    from dpcomm.planner.fsdp import plan_fsdp, ring_costs
    from dpcomm.testbed.config import link_network

    tr, mods = _modules(spec)
    ag, rs = ring_costs(link_network(rate_bps, mtu), world)
    block = plan_fsdp("per-block", tr, ag, rs, depth=1, reshard=True, overlap="gathers")
    out = []
    tight = plan_fsdp(
        "per-block", tr, ag, rs, depth=0, reshard=True, overlap="gathers"
    )  # its largest block alone
    for label, M in (("none", None), ("block", block.peak_bytes), ("tight", tight.peak_bytes)):
        for meth in METHODS:
            row = {"budget": label, "bytes": M, "method": meth}
            if meth == "size":
                best = None
                for s in SIZES:
                    try:
                        p = plan_fsdp(
                            f"size:{s}", tr, ag, rs, memory=M, max_depth=max_depth, overlap="gathers"
                        )
                    except UserError:
                        continue
                    if best is None or p.time_s < best[1] - 1e-12:
                        best = (s, p.time_s)
                if best is None:
                    out.append(row | {"error": "no size in the grid fits"})
                    continue
                meth = row["method"] = f"size:{best[0] // 1024}KB"
            try:
                plan_fsdp(meth, tr, ag, rs, memory=M, max_depth=max_depth, overlap="gathers")
            except UserError as exc:
                out.append(row | {"error": str(exc)})
                continue
            out.append(row | {"schedule": f"fsdp:{meth}" + ("" if M is None else f",memory={M}")})
    return out


def predict(r: Any) -> dict[str, Any]:
    """The model's ``t_iter`` of the plan as run, on the workers' trace and fitted costs, plus the
    measured optimizer step; the costs as fitted."""
    from dpcomm.costmodel.base import LinearCost
    from dpcomm.planner.fsdp import Modules, fsdp_time
    from dpcomm.trace.format import trace_from_dict

    m = next((_COST.search(line) for line in r.log if _COST.search(line)), None)
    if m is None or r.trace is None or r.plan is None:
        return {"predicted_s": None}
    ag, rs = LinearCost(float(m[1]), float(m[2])), LinearCost(float(m[3]), float(m[4]))
    f, b, w = Modules.from_trace(trace_from_dict(r.trace)).arrays
    p = r.plan
    units = [tuple(u) for u in p["units"]]
    d, re_ = p["depth"], p["reshard_after_forward"]
    t = fsdp_time(units, f, b, w, ag, rs, depth=d, reshard=re_, overlap="gathers")
    streams = fsdp_time(units, f, b, w, ag, rs, depth=d, reshard=re_, overlap="streams")
    return {
        "predicted_s": float(t) + r.update_s,
        "streams_s": float(streams) + r.update_s,
        "ag": [ag.a, ag.b],
        "rs": [rs.a, rs.b],
        "compute_s": float(f.sum() + b.sum()),
    }


def _predict(r: Any) -> dict[str, Any]:
    try:
        return predict(r)
    except Exception as exc:  # keep the measurement; say why there is no prediction
        return {"predicted_s": None, "predict_error": repr(exc)}


def _node(args: argparse.Namespace) -> int:
    """One server's process: every case of one model in one launch; node 0 prints the rows."""
    from dpcomm.train import TrainConfig, compare_schedules

    todo = json.loads(args.cases)
    cfg = TrainConfig(
        model=register(args.model), iters=args.iters, batch_size=args.batch_size, threads=1, progress=False,
        verify_iters=0, nproc=1, nnodes=int(args.nnodes), node_rank=int(args.node_rank),
        master_addr=args.master_addr, master_port=int(args.master_port), timeout_s=120.0,
    )  # fmt: skip
    results = compare_schedules(cfg, [c["schedule"] for c in todo])
    if cfg.node_rank == 0:
        rows = []
        for c, r in zip(todo, results, strict=True):
            from dpcomm.train.report import steady

            iters = [x["total_s"] for x in steady(r.records)]
            rows.append(
                c | {"t_iter_s": r.t_iter_s, "iters_s": iters, "update_s": r.update_s, "plan": r.plan,
                     "units": len(r.plan["units"]) if r.plan else None, "log": r.log[:3]} | _predict(r)
            )  # fmt: skip
        if rows:
            rows[0]["trace"] = results[0].trace  # for the Pareto plot
        print("ROWS " + json.dumps(rows), flush=True)
    return 0


def _launch(args: argparse.Namespace, state: dict[str, Any], spec: str, todo: list[dict]) -> list[dict]:
    from dpcomm.testbed import launch_workers

    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--node",
        "--model",
        spec,
        "--cases",
        json.dumps(todo),
    ]
    cmd += ["--iters", str(args.iters), "--batch-size", str(args.batch_size)]
    env = {ENV_TRACE: spec}
    res = launch_workers(state, cmd, env=env, timeout_s=args.timeout)
    lines = [ln for ln in res.stdout(0).splitlines() if ln.startswith("ROWS ")]
    if not res.ok or not lines:
        tail = "\n".join(res.stderr(0).strip().splitlines()[-15:])
        raise SystemExit(f"testbed run failed:\n{tail}")
    return json.loads(lines[-1][5:])


def table(data: dict[str, Any]) -> str:
    """The markdown table of a recorded run: per model, budget and planner, the median over repeats of
    measured and predicted ``t_iter``, the spread of the measured medians, the error, the ratio to
    ``per-block``."""
    runs: dict[tuple, list[dict]] = {}
    for row in data["rows"]:
        runs.setdefault((row["model"], row["budget"], row["method"]), []).append(row)
    lines = [
        "| model | budget | planner | units | d | reshard | measured ms (spread) | predicted ms | error "
        "| streams ms | error | vs per-block measured | vs per-block predicted |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    med = {k: statistics.median(r["t_iter_s"] for r in v) for k, v in runs.items() if "t_iter_s" in v[0]}
    pred = {
        k: statistics.median(r["predicted_s"] for r in v)
        for k, v in runs.items()
        if v[0].get("predicted_s") is not None
    }
    gpu = {
        k: statistics.median(r["streams_s"] for r in v)
        for k, v in runs.items()
        if v[0].get("streams_s") is not None
    }
    for (model, budget, meth), v in runs.items():
        key = (model, budget, meth)
        mib = "none" if v[0]["bytes"] is None else f"{v[0]['bytes'] / 2**20:.2f} MiB"
        if "error" in v[0]:
            lines.append(f"| {model} | {budget} ({mib}) | {meth} | {v[0]['error']} | | | | | | | | | |")
            continue
        p = v[0]["plan"]
        ms = [r["t_iter_s"] * 1e3 for r in v]
        spread = f"{min(ms):.0f}-{max(ms):.0f}"
        base = (model, budget, "per-block")
        vs = f"{med[key] / med[base]:.3f}" if base in med else "-"
        vsp = f"{pred[key] / pred[base]:.3f}" if base in pred and key in pred else "-"
        err = f"{(pred[key] - med[key]) / med[key] * 100:+.1f}%" if key in pred else "-"
        pms = f"{pred[key] * 1e3:.0f}" if key in pred else "-"
        gpus = (
            f"{gpu[key] * 1e3:.0f} | {(gpu[key] - med[key]) / med[key] * 100:+.1f}%"
            if key in gpu
            else "- | -"
        )
        lines.append(
            f"| {model} | {budget} ({mib}) | {meth} | {len(p['units'])} | {p['depth']} | "
            f"{'yes' if p['reshard_after_forward'] else 'no'} | {med[key] * 1e3:.0f} ({spread}) | {pms} | "
            f"{err} | {gpus} | {vs} | {vsp} |"
        )
    return "\n".join(lines)


def pareto(data: dict[str, Any], spec: str, path: str) -> None:
    """The model's front of ``optimal`` for ``spec`` (first launch's trace and fitted costs; modelled time
    against the unsharded-parameter peak) with every measured run of ``spec`` as a point at its plan's
    peak: measured median (filled) and modelled (open), drawn to ``path``."""
    import io

    from matplotlib.figure import Figure

    from dpcomm.costmodel.base import LinearCost
    from dpcomm.planner.fsdp import Modules, pareto_front, peak_memory
    from dpcomm.trace.format import trace_from_dict
    from dpcomm.utils.io import atomic_write_bytes

    row = next(r for r in data["rows"] if r["model"] == spec and r.get("trace") is not None)
    tr = trace_from_dict(row["trace"])
    ag, rs = LinearCost(*row["ag"]), LinearCost(*row["rs"])
    u = statistics.median(r["update_s"] for r in data["rows"] if r["model"] == spec and "update_s" in r)
    front = pareto_front(tr, ag, rs, update_s=u, max_depth=data["meta"]["max_depth"], overlap="gathers")
    m = Modules.from_trace(tr).arrays[2]
    fig = Figure(figsize=(8.4, 4.2))
    ax = fig.add_subplot()
    mib = [p / 2**20 for p, _, _ in front]
    ms = [t * 1e3 for _, t, _ in front]
    ax.step(
        [*mib, mib[-1] * 1.05], [*ms, ms[-1]], where="post", color="black", label="optimal, modelled front"
    )
    runs: dict[str, list[dict]] = {}
    for r in data["rows"]:
        if r["model"] == spec and "t_iter_s" in r:
            runs.setdefault(r["method"].split(":")[0], []).append(r)
    for k, (meth, rs_) in enumerate(sorted(runs.items())):
        color = f"C{k}"
        pk, meas, pred = [], [], []
        for r in rs_:
            p = r["plan"]
            units = [tuple(x) for x in p["units"]]
            pk.append(peak_memory(units, m, depth=p["depth"], reshard=p["reshard_after_forward"]) / 2**20)
            meas.append(r["t_iter_s"] * 1e3)
            pred.append(r["predicted_s"] * 1e3)
        ax.plot(pk, meas, "o", color=color, label=f"{meth} measured")
        ax.plot(pk, pred, "o", mfc="none", color=color, label=f"{meth} modelled")
    ax.set_xlabel("unsharded parameters at peak (MiB)")
    ax.set_ylabel("iteration time (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.subplots_adjust(right=0.74)
    meta = data["meta"]
    ax.set_title(f"{spec}: FSDP2 on {meta['testbed']} at {meta['rate']} (emulated compute)", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())
    print(f"{spec}: front of {len(front)} points and {sum(map(len, runs.values()))} runs drawn to {path}")


def main(argv: list[str] | None = None) -> int:
    from _common import loadavg
    from dpcomm.launch import add_launch_arguments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-tiny-cpu-b16,resnet20-cpu-b32", help="shipped traces")
    ap.add_argument("--testbed", default="star:4")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--iters", type=int, default=12, help="iterations per replica (the first plans)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="launches per model")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    ap.add_argument("--out", default=None, help="JSON file to write")
    ap.add_argument("--pareto", default=None, help="PNG of the first model's front (from --out's data)")
    ap.add_argument("--table", default=None, help="print the table of a recorded JSON and exit")
    ap.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=1, help=argparse.SUPPRESS)  # the testbed appends it
    add_launch_arguments(ap)
    args = ap.parse_args(argv)
    if args.node:
        return _node(args)
    if args.table:
        data = json.loads(Path(args.table).read_text())
        print(table(data))
        if args.pareto:
            pareto(data, data["rows"][0]["model"], args.pareto)
        return 0
    from _common import sigterm_exits
    from dpcomm.planner.fsdp import FSDP_MAX_DEPTH
    from dpcomm.testbed import TestbedConfig, down, parse_rate, up

    tb = TestbedConfig(name="fsdpbm", topology=args.testbed, rate_bps=parse_rate(args.rate), mtu=args.mtu)
    before = loadavg()
    rows: list[dict] = []
    down(tb.name)
    sigterm_exits()
    state = up(tb)
    try:
        world = len(state["servers"])
        for spec in [m.strip() for m in args.models.split(",") if m.strip()]:
            todo = cases(spec, tb.rate_bps, tb.mtu, world, FSDP_MAX_DEPTH)
            skipped = [c | {"model": spec} for c in todo if "error" in c]
            rows += skipped
            run = [c for c in todo if "schedule" in c]
            for rep in range(args.repeats):
                got = _launch(args, state, spec, run)
                rows += [r | {"model": spec, "repeat": rep} for r in got]
                for r in got:
                    pr = r.get("predicted_s")
                    print(f"{spec} rep {rep} {r['budget']:5s} {r['method']:10s} measured "
                          f"{r['t_iter_s'] * 1e3:7.1f} ms  predicted "
                          f"{pr * 1e3 if pr else float('nan'):7.1f} ms", flush=True)  # fmt: skip
    finally:
        down(tb.name)
    meta = {
        "command": "benchmarks/fsdp_testbed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.cpu_count()}-core CPU VM ({platform.machine()}), emulated cluster, gloo",
        "testbed": args.testbed, "rate": args.rate, "mtu": args.mtu, "workers": world,
        "torch": __import__("torch").__version__, "python": platform.python_version(),
        "batch_size": args.batch_size, "iters": args.iters, "repeats": args.repeats,
        "max_depth": FSDP_MAX_DEPTH, "overlap": "gathers",
        "loadavg_before": before, "loadavg_after": loadavg(),
        "date": __import__("datetime").date.today().isoformat(),
    }  # fmt: skip
    data = {"meta": meta, "rows": rows}
    print(table(data))
    if args.out:
        from dpcomm.utils.io import atomic_write_json

        atomic_write_json(args.out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
