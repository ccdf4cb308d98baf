"""The LP paper's Table 2 (BSP-SGD Alg. 1-3 with LP, MST and BE collectives) redone on the emulated cluster.

    sudo .venv/bin/python benchmarks/reproduce_lp_table2.py            # ~5 min; writes the JSON below
    .venv/bin/python benchmarks/reproduce_lp_table2.py --report-only   # the tables from the JSON

The paper (Wang et al. 2017, sec. 4.2, Table 2): 4 K40m GPUs in one server, AlexNet (256 MB, compt 0.93 s)
and GoogLeNet (51 MB, compt 0.265 s); per iteration the communication not hidden (``comm``), the
computation (``compt``) and ``comm / (comm + compt)`` for MST Alg.1, BE Alg.1, BE Alg.3, LP Alg.1, LP Alg.2
and LP Alg.3. Here: ``star:4`` (one switch, every link shaped by ``tc tbf``), one process per server, each
model emulated (:mod:`dpcomm.trace.emulated`) from its analytic K80 layer shapes
(:mod:`dpcomm.trace.analytic`;
GoogLeNet the shipped ``googlenet-k80-b64``) with the layer times scaled so that ``t_f + t_b`` is Table 2's
``compt``; every (mode, collective) pair runs side by side in one launch (:mod:`dpcomm.testbed.node`'s
``bsp:MODE:COLLECTIVE:PLANNER`` schedules): modes ``lp-alg1`` (reduce per layer during backward, parameters
broadcast per layer during forward; plan ``wfbp``), ``lp-alg2`` (reduce, update on the root, broadcast; plan
``single``) and ``lp-alg3`` (allreduce, every rank updates, broadcast every 5 iterations; plan ``single``),
collectives ``lp``, ``mst``, ``be`` (:mod:`dpcomm.runtime.bsp`, :mod:`dpcomm.collectives`).

Scaling: the paper's link is the PCIe path between the GPUs; its effective rate is read off Table 2 itself:
LP Alg.2 moves the model once in a reduce and once in a broadcast (``T ~ 2 n beta``, LP Table 1, n >> b p),
0.057 s for AlexNet's 256 MB, so ``1 / beta ~ 9.0 GB/s`` (72 Gbit/s). With compute at the paper's times, the
gradient bytes are divided by ``k = 72 Gbit/s / R`` (R the testbed's rate), which keeps ``n beta / compt``.
The start-up ``alpha`` (per message) cannot be scaled and is reported.

Prediction per pair: the closed form of the mode (:func:`predict_mode`) with the compute of the trace and each
collective's alpha-beta-gamma cost (LP Table 1, :func:`dpcomm.costmodel.collective.collective_cost`) on the
testbed's link model (``beta`` from the rate and TCP's goodput, ``alpha`` = 45 us) -- and the same with the
run's own ``alpha`` (``--alpha-from-run``: the start-up fitted to the profiled all-reduces of the run).
Writes ``docs/reproductions/lp_table2.json`` atomically; the testbed (``lp<pid hex>``) is removed at the end,
on an error or SIGTERM too. Needs root.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import loadavg
from _paper_testbed import results, run_launches, scaled_trace, testbed_name

NODES = 4
MODES = ("lp-alg1", "lp-alg2", "lp-alg3")
COLLECTIVES = ("lp", "mst", "be")
PLANNER = {"lp-alg1": "wfbp", "lp-alg2": "single", "lp-alg3": "single"}
BROADCAST_EVERY = 5  # lp-alg3 (DataParallel's default, the paper's "every 5 iterations")
PAPER_LINK_BPS = 8 * 256e6 * 2 / 0.057  # LP Alg.2, AlexNet: 2 x 256 MB in 0.057 s -> 72 Gbit/s
MODELS = {  # Table 2's compt (s) and model size (MB) per model
    "alexnet": {"trace": "analytic:alexnet", "compt_s": 0.93, "paper_mb": 256},
    "googlenet": {"trace": "googlenet-k80-b64", "compt_s": 0.265, "paper_mb": 51},
}
# Table 2: (comm s, compt s, comm %) per column; LP Alg.1's comm is missing from the extracted text and is
# derived from its % and compt (comm = compt * pct / (1 - pct)), which the body text confirms (10% / 11% of
# BE / MST Alg.1 for AlexNet, 6% / 43% for GoogLeNet).
PAPER = {
    "alexnet": {
        ("lp-alg1", "mst"): (0.77, 0.92, 45.5),
        ("lp-alg1", "be"): (1.05, 0.94, 52.7),
        ("lp-alg3", "be"): (0.22, 0.93, 18.9),
        ("lp-alg1", "lp"): (0.084, 0.93, 8.3),
        ("lp-alg2", "lp"): (0.057, 0.94, 5.7),
        ("lp-alg3", "lp"): (0.011, 0.93, 1.2),
    },
    "googlenet": {
        ("lp-alg1", "mst"): (0.046, 0.267, 14.7),
        ("lp-alg1", "be"): (0.334, 0.264, 55.9),
        ("lp-alg3", "be"): (0.137, 0.263, 34.3),
        ("lp-alg1", "lp"): (0.020, 0.265, 7.0),
        ("lp-alg2", "lp"): (0.016, 0.26, 5.8),
        ("lp-alg3", "lp"): (0.010, 0.263, 3.7),
    },
}
OUT = Path(__file__).resolve().parents[1] / "docs" / "reproductions" / "lp_table2.json"


def schedule(mode: str, collective: str) -> str:
    return f"bsp:{mode}:{collective}:{PLANNER[mode]}"


def predict_mode(trace: Any, mode: str, collective: str, net: Any, update_s: float = 0.0) -> float:
    """One iteration of ``mode`` on ``NODES`` ranks: compute from ``trace`` (4-byte parameters), each
    collective's time from its cost model on ``net`` (:mod:`dpcomm.runtime.bsp` for the modes).

    - ``lp-alg2``: ``t_f + t_b + T_reduce(S) + u + T_bcast(S)``;
    - ``lp-alg3``: ``t_f + t_b + T_allreduce(S) + u + T_bcast(S) / 5``;
    - ``lp-alg1``: forward with layer ``i+1``'s broadcast queued when layer ``i`` starts (one communication
      thread, in order; a layer starts when its parameters arrived), then backward with one reduce per layer
      queued when its gradient is ready (MG-WFBP Eq. 6-8 with the reduce's cost), then ``u``.
    """
    from dpcomm.costmodel.collective import collective_cost

    def cost(op: str, nbytes: float) -> float:
        return collective_cost(op, collective, nbytes, NODES, net)

    sizes = [4 * max(1, layer.params) for layer in trace.layers]
    total = sum(sizes)
    t_f = sum(layer.forward_s for layer in trace.layers)
    t_b = sum(layer.backward_s for layer in trace.layers)
    if mode == "lp-alg2":
        return t_f + t_b + cost("reduce", total) + update_s + cost("broadcast", total)
    if mode == "lp-alg3":
        return t_f + t_b + cost("allreduce", total) + update_s + cost("broadcast", total) / BROADCAST_EVERY
    comm_end, f_end, submitted = 0.0, 0.0, 0
    ends: list[float] = []
    for i, layer in enumerate(trace.layers):
        hook = f_end  # layer i's pre-hook: queue the broadcasts of layers <= i + 1
        while submitted <= min(i + 1, len(sizes) - 1):
            comm_end = max(comm_end, hook) + cost("broadcast", sizes[submitted])
            ends.append(comm_end)
            submitted += 1
        f_end = max(hook, ends[i]) + layer.forward_s
    t = f_end
    for i in reversed(range(len(sizes))):  # gradient of layer i ready after its backward
        t += trace.layers[i].backward_s
        comm_end = max(comm_end, t) + cost("reduce", sizes[i])
    return max(t, comm_end) + update_s


def _trace(spec: str) -> Any:
    if spec.startswith("analytic:"):
        from dpcomm.trace.analytic import analytic_trace

        return analytic_trace(spec.split(":", 1)[1], 256, "k80")
    from dpcomm.trace.shipped import find_trace

    return find_trace(spec)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from dpcomm.testbed import parse_rate
    from dpcomm.testbed.config import link_network
    from dpcomm.trace.format import save_trace

    rate_bps = parse_rate(args.rate)
    k = PAPER_LINK_BPS / rate_bps / args.time_scale  # k s = 72 Gbit/s / R keeps n beta / compt
    net = link_network(rate_bps, args.mtu)
    tmp = Path(tempfile.mkdtemp(prefix="lp-table2-"))
    pairs = [(m, c) for m in MODES for c in COLLECTIVES]
    models, launches = {}, []
    for name in args.models.split(","):
        spec = MODELS[name]
        base = _trace(spec["trace"])
        st = scaled_trace(base, time_scale=1.0, byte_scale=k, total_s=spec["compt_s"] * args.time_scale)
        path = save_trace(st, tmp / f"{name}.json")
        models[name] = {
            "trace": spec["trace"],
            "layers": len(st.layers),
            "grad_bytes_unscaled": 4 * sum(layer.params for layer in base.layers),
            "grad_bytes_scaled": 4 * sum(max(1, layer.params) for layer in st.layers),
            "compt_s": sum(layer.forward_s + layer.backward_s for layer in st.layers),
            "predicted_link": {f"{m}/{c}": predict_mode(st, m, c, net) for m, c in pairs},
        }
        launches.append(
            {"key": name, "trace": path, "schedules": [schedule(m, c) for m, c in pairs], "iters": args.iters}
        )
    rows = run_launches(
        name=args.name or testbed_name("lp"),
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
        st = scaled_trace(_trace(MODELS[row["key"]]["trace"]), time_scale=1.0, byte_scale=k,
                          total_s=MODELS[row["key"]]["compt_s"] * args.time_scale)  # fmt: skip
        alphas = [r["cost"]["a"] for r in m.get("results", []) if (r.get("cost") or {}).get("a")]
        if alphas:  # the run's start-up: the median of the fits, as an allreduce's a = 2 (P-1) alpha
            a = sorted(alphas)[len(alphas) // 2]
            m["run_alpha"] = a / (2 * (NODES - 1))
            net_run = dataclasses.replace(net, alpha=m["run_alpha"])
            m["predicted_run_alpha"] = {}
            for r in m["results"]:
                _, mode, coll, _ = r["schedule"].split(":")
                m["predicted_run_alpha"][f"{mode}/{coll}"] = predict_mode(
                    st, mode, coll, net_run, update_s=r["update_s"]
                )
        for r in m.get("results", []):
            r.pop("records", None)
            r.pop("log", None)
            r.pop("trace", None)
    return results(
        args,
        tmp,
        f"star:{NODES}",
        byte_scale=k,
        time_scale=args.time_scale,
        paper_link_bps=PAPER_LINK_BPS,
        link_network={"alpha": net.alpha, "beta": net.beta},
        iters=args.iters,
        models=models,
    )


RATIOS = (
    (("lp-alg1", "be"), ("lp-alg1", "lp")),
    (("lp-alg1", "mst"), ("lp-alg1", "lp")),
    (("lp-alg1", "lp"), ("lp-alg3", "lp")),
    (("lp-alg2", "lp"), ("lp-alg3", "lp")),
)
"""Ratios of comm that the paper's text quotes or Table 2 shows (numerator, denominator)."""


def _col(key: tuple[str, str]) -> str:
    """Table 2's column name of ``(mode, collective)``: ``LP Alg.1``."""
    return f"{key[1].upper()} Alg.{key[0][-1]}"


def report(data: dict[str, Any]) -> str:
    """Per model: each (mode, collective) measured, predicted and Table 2's numbers; then the orders."""
    lines = []
    for name, m in data["models"].items():
        compt = m["compt_s"]
        paper = PAPER.get(name, {})
        lines += [
            f"**{name}** ({m['layers']} layers, {m['grad_bytes_scaled'] / 1e3:.0f} KB of gradients, paper "
            f"{MODELS[name]['paper_mb']} MB; compt {compt * 1e3:.0f} ms; load {m.get('loadavg_before')} -> "
            f"{m.get('loadavg_after')}, CPU busy {(m.get('cpu_busy_share') or 0):.0%})",
            "",
            "| mode | collective | t_iter (ms) | comm = t_iter - compt (ms) | comm % | predicted t_iter, "
            "link alpha (ms) | predicted, run alpha (ms) | error (run alpha) | Table 2 comm (s) | "
            "Table 2 comm % |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in m.get("results", []):
            _, mode, coll, _ = r["schedule"].split(":")
            key = f"{mode}/{coll}"
            t = r["t_iter_s"]
            comm = t - compt
            pl = m["predicted_link"][key]
            pr = (m.get("predicted_run_alpha") or {}).get(key)
            p = paper.get((mode, coll))
            lines.append(
                f"| {mode} | {coll} | {t * 1e3:.0f} | {comm * 1e3:.0f} | {comm / t:.1%} | {pl * 1e3:.0f} | "
                + (f"{pr * 1e3:.0f} | {(pr - t) / t:+.1%} | " if pr else "- | - | ")
                + (f"{p[0]:.3f} | {p[2]:.1f}% |" if p else "- | - |")
            )
        res = {tuple(r["schedule"].split(":")[1:3]): r["t_iter_s"] - compt for r in m.get("results", [])}
        if res and paper:
            common = [k for k in paper if k in res]
            order_paper = " < ".join(_col(k) for k in sorted(common, key=lambda k: paper[k][0]))
            order_ours = " < ".join(_col(k) for k in sorted(common, key=lambda k: res[k]))
            lines += ["", f"Order of comm, Table 2's columns: paper {order_paper}; here {order_ours}."]
            ratios = []
            for a, b in RATIOS:
                if a in res and b in res and res[b] > 0:
                    ratios.append(
                        f"comm {_col(a)} / {_col(b)}: paper {paper[a][0] / paper[b][0]:.2f}, "
                        f"here {res[a] / res[b]:.2f}"
                    )
            lines += [f"{'; '.join(ratios)}."] if ratios else []
        if m.get("run_alpha"):
            lines.append(f"Run alpha (fitted to the profiled all-reduces): {m['run_alpha'] * 1e3:.2f} ms.")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from dpcomm.utils.io import atomic_write_json, read_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="alexnet, googlenet")
    p.add_argument("--rate", default="100mbit", help="link rate of the testbed (default 100mbit)")
    p.add_argument("--time-scale", type=float, default=1.0, help="compute multiplier (1: Table 2's compt)")
    p.add_argument("--mtu", type=int, default=9000, help="jumbo frames: fewer packets for the 2 cores")
    p.add_argument("--iters", type=int, default=16, help="3 profiled, then steady")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    p.add_argument("--name", default=None, help="testbed name (default lp<pid hex>)")
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
