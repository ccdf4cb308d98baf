"""MG-WFBP's 8-node K80 experiment (Shi & Chu, sec. V-B) redone on the emulated cluster, with predictions.

    sudo .venv/bin/python benchmarks/reproduce_mgwfbp_testbed.py            # ~10 min; writes the JSON below
    .venv/bin/python benchmarks/reproduce_mgwfbp_testbed.py --report-only   # the tables from the JSON

The paper: 8 servers (one K80 each) on 10 GbE, GoogLeNet b64 and ResNet-50 b32, WFBP, SyncEASGD (``single``)
and MG-WFBP; "MG-WFBP achieves about 1.2x and 1.36x speedups compared to WFBP and SyncEASGD respectively".
Here: ``star:8`` (:mod:`dpcomm.testbed`, one switch, every link shaped by ``tc tbf``), one process per server,
the model emulated from the K80 trace (:mod:`dpcomm.trace.emulated`: real parameters and all-reduces, compute
that sleeps the trace's times), every schedule side by side in one launch (:mod:`dpcomm.testbed.node`).

Scaling (docs/reproductions/mgwfbp_testbed.md derives it): a ring all-reduce's bandwidth term is
``b M = 2 (N-1)/N * 8 M / R``; compute is ``t_f + t_b``. Their ratio is kept when the link rate ``R`` is
divided by ``c = 10 Gbit/s / R`` and ``M / (t_f + t_b)`` by ``c`` too: gradient bytes divided by ``k`` and
compute times multiplied by ``s`` with ``k s = c`` (``--time-scale s``; ``k`` follows). The start-up ``a``
(per all-reduce) cannot be scaled: it is what TCP, gloo and the 2 shared cores give; it is measured and
reported, and the simulator's prediction uses it.

Predictions, per schedule: *run* (the simulator on the run's own profiled layer times and the all-reduce
``a + b M`` fitted to every schedule's profiled all-reduces, as ``make demo``), *link* (the scaled trace on
the testbed's link model: ``beta`` from the rate and TCP's goodput, ``alpha`` = 45 us), and *paper* (the
unscaled K80 trace on the ``10gbe`` preset at N = 8: what the simulator says of the paper's own cluster).
Writes ``docs/reproductions/mgwfbp_testbed.json`` atomically; the testbed (``mg<pid hex>``) is removed at the
end, on an error or SIGTERM too. Needs root.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import loadavg
from _paper_testbed import results, run_launches, scaled_trace, testbed_name

MODELS = ("googlenet-k80-b64", "resnet50-k80-b32")
SCHEDULES = ("wfbp", "single", "mgwfbp", "optimal", "ddp")
NODES = 8
PAPER_RATE_BPS = 10e9  # 10 GbE
PAPER = {"mgwfbp/wfbp": 1.2, "mgwfbp/single": 1.36}  # sec. V-B, both models ("about")
OUT = Path(__file__).resolve().parents[1] / "docs" / "reproductions" / "mgwfbp_testbed.json"


def _ring_cost(net: Any, nodes: int) -> Any:
    from dpcomm.costmodel.base import LinearCost

    return LinearCost(2 * (nodes - 1) * net.alpha, 2 * (nodes - 1) / nodes * net.beta)


def predict_link(trace: Any, net: Any, schedules: list[str]) -> dict[str, float]:
    """t_iter per schedule of the scaled trace on a link model (plans made on that model)."""
    from dpcomm.demo_sim import ddp_plan
    from dpcomm.planner import make_plan
    from dpcomm.sim import simulate

    cost = _ring_cost(net, NODES)
    out = {}
    for s in schedules:
        plan = ddp_plan(trace, cost, NODES) if s == "ddp" else make_plan(s, trace, cost, NODES)
        out[s] = simulate(trace, plan, cost, NODES).t_iter_s
    return out


def predict_run(results: list[dict[str, Any]]) -> tuple[dict[str, float], Any]:
    """t_iter per schedule: each run plan on its own profiled trace, one all-reduce cost pooled over every
    schedule's profiled all-reduces (:func:`dpcomm.demo_report.pooled_cost`); DDP's buckets on ``optimal``'s
    profiled trace."""
    from dpcomm.demo_report import pooled_cost
    from dpcomm.demo_sim import ddp_plan
    from dpcomm.plan import Plan
    from dpcomm.sim import simulate
    from dpcomm.trace.format import trace_from_dict
    from dpcomm.train import TrainResult

    rs = [TrainResult(**r) for r in results]
    cost = pooled_cost(rs)
    out: dict[str, float] = {}
    if cost is None:
        return out, None
    for r in rs:
        if r.trace and r.plan:
            out[r.schedule] = simulate(
                trace_from_dict(r.trace), Plan.from_dict(r.plan), cost, r.nproc, update_s=r.update_s
            ).t_iter_s
    ref = next((r for r in rs if r.schedule == "optimal" and r.trace), None)
    if ref is not None and any(r.schedule == "ddp" for r in rs):
        trace = trace_from_dict(ref.trace)
        plan = ddp_plan(trace, cost, NODES)
        out["ddp"] = simulate(trace, plan, cost, NODES, update_s=ref.update_s).t_iter_s
    return out, cost


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from dpcomm.costmodel.network import PRESETS
    from dpcomm.testbed import parse_rate
    from dpcomm.testbed.config import link_network
    from dpcomm.trace.format import save_trace
    from dpcomm.trace.shipped import find_trace

    rate_bps = parse_rate(args.rate)
    c = PAPER_RATE_BPS / rate_bps
    k = c / args.time_scale
    net = link_network(rate_bps, args.mtu)
    tmp = Path(tempfile.mkdtemp(prefix="mgwfbp-testbed-"))
    models, launches = {}, []
    for spec in args.models.split(","):
        trace = find_trace(spec)
        st = scaled_trace(trace, time_scale=args.time_scale, byte_scale=k)
        path = save_trace(st, tmp / f"{spec}.json")
        schedules = args.schedules.split(",")
        models[spec] = {
            "layers": len(trace.layers),
            "grad_bytes": 4 * sum(l.params for l in trace.layers),
            "grad_bytes_scaled": 4 * sum(l.params for l in st.layers),
            "t_f_plus_t_b_s": sum(l.forward_s + l.backward_s for l in trace.layers),
            "t_f_plus_t_b_scaled_s": sum(l.forward_s + l.backward_s for l in st.layers),
            "predicted_link": predict_link(st, net, schedules),
            "predicted_paper": predict_link(trace, PRESETS["10gbe"], schedules),
        }
        launches.append({"key": spec, "trace": path, "schedules": schedules, "iters": args.iters})
    rows = run_launches(
        name=args.name or testbed_name("mg"),
        topology=f"star:{NODES}",
        rate=args.rate,
        mtu=args.mtu,
        launches=launches,
        out=tmp,
        timeout_s=args.timeout,
    )
    for row in rows:
        m = models[row["key"]]
        m.update({k2: v for k2, v in row.items() if k2 != "key"})
        if "results" in row:
            m["predicted_run"], cost = predict_run(row["results"])
            m["run_cost"] = {"a": cost.a, "b": cost.b} if cost is not None else None
            for r in m["results"]:  # keep the JSON small: records and traces are in the worker logs
                r.pop("records", None)
                r.pop("log", None)
    return results(
        args,
        tmp,
        f"star:{NODES}",
        time_scale=args.time_scale,
        byte_scale=k,
        rate_scale=c,
        link_network={"alpha": net.alpha, "beta": net.beta},
        iters=args.iters,
        models=models,
    )


def _t(m: dict[str, Any], s: str) -> float | None:
    r = next((r for r in m.get("results", []) if r["schedule"] == s), None)
    return r["t_iter_s"] if r else None


def report(data: dict[str, Any]) -> str:
    """Markdown tables: per model the measured t_iter and the three predictions per schedule, then the
    speedups next to the paper's."""
    lines = []
    for spec, m in data["models"].items():
        lines += [
            f"**{spec}** ({m['layers']} layers, {m['grad_bytes_scaled'] / 1e6:.3f} MB of gradients "
            f"(paper scale {m['grad_bytes'] / 1e6:.1f} MB), "
            f"t_f + t_b = {m['t_f_plus_t_b_scaled_s'] * 1e3:.0f} ms; "
            f"load {m.get('loadavg_before')} -> {m.get('loadavg_after')}, CPU busy "
            f"{(m.get('cpu_busy_share') or 0):.0%})",
            "",
            "| schedule | groups | t_iter measured (ms) | exposed comm (ms) | predicted, run (ms) | error | "
            "predicted, link (ms) | paper scale (ms, x scale) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        s_time = data["time_scale"]
        for r in m.get("results", []):
            s = r["schedule"]
            groups = len((r.get("plan") or {}).get("groups") or []) or "-"
            kept = (r.get("plan") or {}).get("schedule")
            name = s + (f" (kept {kept})" if kept and kept != s else "")
            pr = m.get("predicted_run", {}).get(s)
            err = f"{(pr - r['t_iter_s']) / r['t_iter_s']:+.1%}" if pr else "-"
            pr_text = f"{pr * 1e3:.0f} | {err}" if pr else "- | -"
            lines.append(
                f"| {name} | {groups} | {r['t_iter_s'] * 1e3:.0f} | {r['exposed_comm_s'] * 1e3:.0f} | "
                f"{pr_text} | {m['predicted_link'][s] * 1e3:.0f} | "
                f"{m['predicted_paper'][s] * s_time * 1e3:.0f} |"
            )
        if m.get("run_cost"):
            a, b = m["run_cost"]["a"], m["run_cost"]["b"]
            lines.append(f"\nFitted all-reduce of this run: a = {a * 1e3:.2f} ms, b = {b * 1e9:.1f} ns/B.")
        lines.append("")
    lines += [
        "| model | ratio | paper (8 K80, 10 GbE) | measured | predicted, run | predicted, link "
        "| paper scale |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec, m in data["models"].items():
        for other, label in (("wfbp", "MG-WFBP / WFBP"), ("single", "MG-WFBP / SyncEASGD")):
            meas = (_t(m, other) or math.nan) / (_t(m, "mgwfbp") or math.nan)
            run = m.get("predicted_run", {})
            prun = run.get(other, math.nan) / run.get("mgwfbp", math.nan) if run else math.nan
            link = m["predicted_link"][other] / m["predicted_link"]["mgwfbp"]
            pap = m["predicted_paper"][other] / m["predicted_paper"]["mgwfbp"]
            lines.append(
                f"| {spec} | {label} | {PAPER['mgwfbp/' + other]:.2f} | {meas:.3f} | {prun:.3f} | "
                f"{link:.3f} | {pap:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from dpcomm.utils.io import atomic_write_json, read_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="shipped traces (K80)")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--rate", default="100mbit", help="link rate of the testbed (default 100mbit)")
    p.add_argument(
        "--time-scale", type=float, default=3.0, help="compute time multiplier s (bytes are divided by c/s)"
    )
    p.add_argument("--mtu", type=int, default=9000, help="jumbo frames: fewer packets for the 2 cores")
    p.add_argument("--iters", type=int, default=22, help=">= 22: 3 profiled, 9 timed, then steady")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    p.add_argument("--name", default=None, help="testbed name (default mg<pid hex>)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--report-only", action="store_true", help="print the tables of --out, run nothing")
    args = p.parse_args(argv)
    if args.report_only:
        print(report(read_json(args.out)))
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    data = measure(args)
    atomic_write_json(args.out, data)
    print(report(data))
    print(f"wrote {args.out}; load average now {loadavg()}")
    return 0 if all("results" in m for m in data["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
