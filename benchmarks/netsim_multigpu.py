"""Servers with several GPUs: the flow model against published nccl-tests all_reduce_perf tables, and its
speed on 1,024 GPUs in 128 servers.

    .venv/bin/python benchmarks/netsim_multigpu.py [--skip-speed] [--out docs]

Reads ``docs/data/netsim_multigpu_published.json`` (the published measurements, each with its source) and
simulates exactly those cases: the same topology (a ``gpus:``/``dgx-*`` spec), GPU count and sizes. The
topologies carry the line (datasheet) rates and NCCL's published achievable fraction of them
(``intra_eff``, ``nic_eff``; sources in the JSON and in ``dpcomm.topology.multigpu``). Alpha is per case
and never read from the compared rows: where the table has its smallest sizes (``latency_rows``, 8 B to
64 KB: nccl-tests' latency-bound rows), a least-squares line ``t = a + S/b`` through them gives the
start-up at the smallest size, and alpha is set so that the faster schedule's all-reduce of that size
takes that long (:func:`alpha_from_small`); otherwise the case names its alpha and the reason. For each
compared row it prints the measured busbw (nccl-tests: ``2 (P-1)/P * S / t``), the simulated busbw of
``nccl-ring`` and ``nccl-tree``, and the error ``simulated / measured - 1`` of the algorithm the case names
(``auto``: the faster of the two, as NCCL's tuner would pick; the tables do not say which ran), and, where
the table comes with a published simulator's numbers (ASTRA-sim's HGX-H100 validation), that simulator's
error next to ours. Then it prices one 100 MB allreduce on ``dgx-h100:128`` (1,024 GPUs) with every
schedule, each in a fresh model, and records the wall seconds. Writes ``<out>/data/netsim_multigpu.json``.

What the model leaves out (so what the errors contain): the LL/LL128 protocols and their selection by size
(the achievable rates above are the Simple protocol's), NVLink SHARP (NVLS) and CollNet/SHARP in-network
reduction, the GPU's reduction kernels and memory bandwidth, PCIe between GPU and NIC, TCP (A3 Mega's
GPUDirect-TCPXO) or InfiniBand transport behaviour beyond a start-up and a rate, and the pipelining of
chunks inside a ring step.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from _common import loadavg
from dpcomm.sim.network import FlowModel, make_fabric, simulate_allreduce

ROOT = Path(__file__).resolve().parent.parent
ALPHA = 1e-6  # s per message for the speed run only: about ASTRA-sim's 936.25 ns HGX-H100 link latency
SCHEDULES = ("nccl-ring", "nccl-tree")
SPEED_SPEC = "dgx-h100:128"  # 1,024 GPUs in 128 servers
SPEED_ALGOS = ("hierarchical", "nccl-ring", "nccl-tree", "ring", "be", "mst", "lp", "ps")


def busbw(nbytes: float, p: int, t: float) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s."""
    return 2 * (p - 1) / p * nbytes / t / 1e9


def startup_s(rows: list[dict]) -> float:
    """Seconds at the smallest size of the least-squares line ``t = a + S/b`` through ``rows``."""
    x = np.array([r["bytes"] for r in rows], dtype=float)
    y = np.array([r["time_us"] for r in rows]) * 1e-6
    slope, a = np.polyfit(x, y, 1)
    return float(a + slope * x.min())


def alpha_from_small(spec: str, p: int, nbytes: int, t_meas: float, algos: tuple[str, ...]) -> float:
    """The alpha at which the fastest of ``algos`` all-reduces ``nbytes`` in ``t_meas`` seconds.

    A schedule's time is linear in alpha, ``t0 + k alpha`` (``k``: its messages in sequence), so the
    fastest one's time is ``min_s (t0_s + k_s alpha)``, which equals ``t_meas`` at ``alpha = max_s
    (t_meas - t0_s) / k_s``."""
    best = 0.0
    for algo in algos:
        t0, t1 = (
            simulate_allreduce(FlowModel(make_fabric(spec, 10e9), alpha_s=a), algo, nbytes, ranks=p)[0].time_s
            for a in (0.0, 1.0)
        )
        best = max(best, (t_meas - t0) / (t1 - t0))
    return best


def case_alpha(case: dict) -> tuple[float, dict]:
    """``(alpha, how)`` of a published case: from its latency-bound rows, or as the case states it."""
    if "latency_rows" not in case:
        return float(case["alpha_s"]), {"alpha_s": float(case["alpha_s"]), "from": "stated in the case"}
    algos = SCHEDULES if case["algorithm"] == "auto" else (case["algorithm"],)
    small = min(r["bytes"] for r in case["latency_rows"])
    t_small = startup_s(case["latency_rows"])
    alpha = alpha_from_small(case["topology"], case["gpus"], small, t_small, algos)
    sizes = sorted(r["bytes"] for r in case["latency_rows"])
    how = {"alpha_s": alpha, "from": f"latency rows {sizes[0]}..{sizes[-1]} B", "startup_s": t_small}
    return alpha, how


def validate(published: dict) -> tuple[list[dict], list[dict]]:
    rows, alphas = [], []
    for case in published["cases"]:
        alpha, how = case_alpha(case)
        alphas.append({"case": case["name"], **how})
        model = FlowModel(make_fabric(case["topology"], 10e9), alpha_s=alpha)
        p = case["gpus"]
        for r in case["rows"]:
            n = r["bytes"]
            sim = {a: simulate_allreduce(model, a, n, ranks=p)[0].time_s for a in SCHEDULES}
            pick = case["algorithm"] if case["algorithm"] != "auto" else min(sim, key=sim.get)
            measured = busbw(n, p, r["time_us"] * 1e-6)
            ours = busbw(n, p, sim[pick])
            row = {
                "case": case["name"],
                "gpus": p,
                "bytes": n,
                "measured_busbw": measured,
                "ring_busbw": busbw(n, p, sim["nccl-ring"]),
                "tree_busbw": busbw(n, p, sim["nccl-tree"]),
                "algorithm": pick,
                "error": ours / measured - 1,
            }
            if "published_sim_time_us" in r:
                row["published_sim_error"] = busbw(n, p, r["published_sim_time_us"] * 1e-6) / measured - 1
            rows.append(row)
    return rows, alphas


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(values, 1e-6)))))


def speed() -> list[dict]:
    out = []
    for algo in SPEED_ALGOS:
        model = FlowModel(make_fabric(SPEED_SPEC, 10e9), alpha_s=ALPHA)  # fresh: no cache carried over
        t0 = time.perf_counter()
        row, _ = simulate_allreduce(model, algo, 100_000_000)
        wall = time.perf_counter() - t0
        out.append({"algorithm": algo, "wall_s": wall, "busbw": row.busbw_GBps, "solves": model.rate_solves})
        print(
            f"  {algo:13s} {wall:6.2f} s wall   busbw {row.busbw_GBps:7.1f} GB/s   solves {model.rate_solves}"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-speed", action="store_true", help="only the validation table")
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for data/netsim_multigpu.json")
    args = ap.parse_args()
    published = json.loads((ROOT / "docs/data/netsim_multigpu_published.json").read_text())
    load0, stamp = loadavg(), time.strftime("%a %d %b %Y %H:%M UTC", time.gmtime())
    rows, alphas = validate(published)
    for a in alphas:
        extra = f", start-up {a['startup_s'] * 1e6:.1f} us" if "startup_s" in a else ""
        print(f"alpha {a['case']}: {a['alpha_s'] * 1e6:.3f} us per message ({a['from']}{extra})")
    print(
        "| case | GPUs | S | measured busbw | nccl-ring | nccl-tree | error (algorithm) "
        "| published sim. error |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        pub = f"{r['published_sim_error']:+.1%}" if "published_sim_error" in r else ""
        print(
            f"| {r['case']} | {r['gpus']} | {r['bytes']:,} | {r['measured_busbw']:.1f} "
            f"| {r['ring_busbw']:.1f} | {r['tree_busbw']:.1f} "
            f"| {r['error']:+.1%} ({r['algorithm']}) | {pub} |"
        )
    geo = geomean([abs(r["error"]) for r in rows])
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(f"geomean |error| {geo:.1%}; worst {worst['error']:+.1%} ({worst['case']}, {worst['bytes']:,} B)")
    pub_rows = [r for r in rows if "published_sim_error" in r]
    geo_pub = {}
    if pub_rows:
        geo_pub = {
            "ours": geomean([abs(r["error"]) for r in pub_rows]),
            "published_sim": geomean([abs(r["published_sim_error"]) for r in pub_rows]),
        }
        print(
            f"on the {len(pub_rows)} rows with ASTRA-sim's prediction: geomean |error| ours "
            f"{geo_pub['ours']:.1%}, ASTRA-sim {geo_pub['published_sim']:.1%}"
        )
    timing = []
    if not args.skip_speed:
        print(f"speed: one 100 MB allreduce on {SPEED_SPEC} (1,024 GPUs), fresh model each")
        timing = speed()
    load1 = loadavg()
    print(f"load {load0} before, {load1} after; {stamp}; Python {platform.python_version()}")
    out = Path(args.out) / "data" / "netsim_multigpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": "benchmarks/netsim_multigpu.py",
                "when": stamp,
                "load_before": load0,
                "load_after": load1,
                "alpha": alphas,
                "validation": rows,
                "geomean_abs_error": geo,
                "geomean_abs_error_where_published_sim": geo_pub,
                "speed_alpha_s": ALPHA,
                "speed_topology": SPEED_SPEC,
                "speed": timing,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
