"""Servers with several GPUs: the flow model against published nccl-tests all_reduce_perf tables, in-sample
and held-out, and its speed on 1,024 GPUs in 128 servers.

    .venv/bin/python benchmarks/netsim_multigpu.py [--skip-speed] [--round-trip] [--out docs]

Reads ``docs/data/netsim_multigpu_published.json`` (the published measurements, each with its source and
its split) and prices exactly those cases with the model's defaults: the case's topology (a preset or a
``gpus:`` spec with line rates and the achievable fractions of ``dpcomm.topology``), NCCL's own choice of
algorithm and protocol (``nccl``) or the one the run forced, NCCL's latency model for the start-up. Nothing
is fitted to a table here: a table is *in-sample* if the model or a preset was set while looking at it (the
JSON's ``tuned`` says what), *held-out* if it was only compared (set 1: the first held-out tables; sets 2
and later: those whose ``decided`` says their split was committed before any of their errors was computed).
For every row of 64 MiB and up it prints the measured busbw (nccl-tests: ``2 (P-1)/P * S / t``), the
model's, the error ``model / measured - 1`` and what ran, then the geometric mean of |error| per table,
per split and per held-out set, and the worst row of each. Then it prices one 100 MB allreduce on
``dgx-h100:128`` (1,024 GPUs) with every schedule, each in a fresh model, and
records the wall seconds. Writes ``<out>/data/netsim_multigpu.json``. ``--round-trip`` only fits each
published table of several servers on itself as ``dpcomm calibrate --from-nccl-tests`` does (this is fitting,
not validation) and prints what was fitted (the size ranges where one set of values did not reproduce the
table: ``dpcomm.sim.network.fit_ranges``) and the worst row of 64 MiB and up.
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
from dpcomm.sim.network.fit import LARGE
from dpcomm.sim.network.pricing import default_model

ROOT = Path(__file__).resolve().parent.parent
ALPHA = 1e-6  # s per message for the speed run only: about ASTRA-sim's 936.25 ns HGX-H100 link latency
SPEED_SPEC = "dgx-h100:128"  # 1,024 GPUs in 128 servers
PUBLISHED = ROOT / "docs/data/netsim_multigpu_published.json"
SPEED_ALGOS = ("nccl", "nccl-ring", "nccl-tree", "hierarchical", "ring", "be", "mst", "lp", "ps")


def busbw(nbytes: float, p: int, t: float) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s."""
    return 2 * (p - 1) / p * nbytes / t / 1e9


def seconds(row: dict, p: int) -> float:
    """A published row's out-of-place time: its ``time_us``, or, where the source prints only busbw
    (``busbw_GBps``), the time that busbw means on ``p`` ranks."""
    if "time_us" in row:
        return row["time_us"] * 1e-6
    return busbw(row["bytes"], p, 1.0) / row["busbw_GBps"]  # busbw is inversely proportional to time


def precise(row: dict) -> bool:
    """Whether a row's time is known to 0.5%: every timed row, and busbw-only rows with three significant
    digits (1.00 GB/s and up: the sources round busbw to 0.01 GB/s)."""
    return "time_us" in row or row["busbw_GBps"] >= 1.0


def _spec(case: dict, **fmt) -> str:
    """The case's topology with the NCCL and plugin versions its source states (``nccl=``, ``plugin=``: what
    EFA achieves depends on them, :mod:`dpcomm.topology.transports`)."""
    spec = case["topology"].format(**fmt)
    if case.get("nccl_version"):
        spec += f",nccl={case['nccl_version']}"
    if case.get("net_plugin"):
        spec += f",plugin={case['net_plugin']}"
    return spec


def _rows(case: dict) -> list[tuple[str, int, int, float]]:
    """``(topology, ranks, bytes, seconds)`` of a case's compared rows (64 MiB and up)."""
    if "per_server_rows" in case:
        return [
            (_spec(case, servers=r["servers"]), 8 * r["servers"], r["bytes"], r["time_us"] * 1e-6)
            for r in case["per_server_rows"]
        ]
    out = [(_spec(case), case["gpus"], r["bytes"], seconds(r, case["gpus"])) for r in case["rows"]]
    return [r for r in out if r[2] >= LARGE]


def _set(case: dict) -> str | None:
    """Which held-out set a held-out table belongs to: the JSON's ``decided`` names it (``held-out set 2:
    ...``: when its split was committed, before any of its errors was computed); without it, ``set 1``."""
    if case["split"] != "held-out":
        return None
    return case.get("decided", "held-out set 1").split(":")[0].removeprefix("held-out ")


def validate(published: dict) -> list[dict]:
    rows = []
    for case in published["cases"]:
        models: dict[str, object] = {}
        for spec, p, n, t in _rows(case):
            if spec not in models:
                models[spec] = default_model(make_fabric(spec, 10e9))
            sim, _ = simulate_allreduce(models[spec], case["algorithm"], n, ranks=p)
            measured = busbw(n, p, t)
            row = {
                "case": case["name"],
                "split": case["split"],
                "set": _set(case),
                "topology": spec,
                "gpus": p,
                "bytes": n,
                "measured_busbw": measured,
                "model_busbw": sim.busbw_GBps,
                "ran": sim.ran,
                "error": sim.busbw_GBps / measured - 1,
            }
            rows.append(row)
    return rows


def _fitted_what(fit) -> str:
    t = fit.topology
    what = f"nic_eff {t.nic_fraction:.3f}, intra_eff {t.intra_eff:.3f}"
    what += f", lat_scale {t.lat_scale:.3g}" if t.lat_scale is not None else ""
    what += f", channels {t.channels}" if t.channels else ""
    if t.ranges:  # calibrate's size ranges: the spec's values below the first, each range's from its size
        what = f"< {t.ranges[0].from_bytes >> 20} MiB: {t.algo or 'nccl'}, {what}"
        for r in t.ranges:
            own = ", ".join(f"{k} {getattr(r, k):.3g}" for k in ("lat_scale", "nic_eff", "intra_eff") if
                            getattr(r, k) is not None)  # fmt: skip
            ch = f" x{r.channels}" if r.channels else ""
            what += f"; from {r.from_bytes >> 20} MiB: {r.algo or 'nccl'}{ch}"
            what += f", {own}" if own else ""
    return what


def round_trip(published: dict) -> None:
    """Each table of several servers fitted on itself (calibrate's fit), and the whole published logs of
    tests/data: the algorithm, the fit, every row's residual (model and fitted), the worst of 4 KiB and up
    and of 64 MiB and up, and whether the fitted times grow with size."""
    from dpcomm.sim.network.fit import fit_nccl_tests
    from dpcomm.sim.network.nccl_tests import NcclTestsLog, read_log

    cases = []
    for c in published["cases"]:
        if not c.get("rows") or (c.get("gpus") or 1) <= 8:
            continue
        rows = tuple(sorted((r["bytes"], seconds(r, c["gpus"])) for r in c.get("latency_rows", []) + c["rows"]
                            if precise(r)))  # fmt: skip
        forced = None if c["algorithm"] == "nccl" else c["algorithm"]
        cases.append((c["name"], NcclTestsLog(rows=rows, ranks=c["gpus"]), c["topology"], forced))
    for name in sorted((ROOT / "tests/data").glob("nccl_tests_*.log")):
        cases.append((name.stem, read_log(name), "p4d:2", "nccl-ring"))  # their job forced the ring
    summary = []
    for name, log, spec, forced in cases:
        fit = fit_nccl_tests(log, spec, forced)
        version = f", NCCL {log.nccl_version}" if log.nccl_version else ""
        how = f"{fit.algorithm}{' (forced)' if forced else ''}"
        print(f"{name} ({spec}{version}): {how}, {_fitted_what(fit)}")
        print("| bytes | measured us | model us | fitted us | residual |")
        print("| --- | --- | --- | --- | --- |")
        for (n, m, g), g0 in zip(fit.rows, fit.model_rows, strict=True):
            print(f"| {n:,} | {m * 1e6:,.1f} | {g0 * 1e6:,.1f} | {g * 1e6:,.1f} | {g / m - 1:+.1%} |")
        small = max((abs(g / m - 1) for n, m, g in fit.rows if n >= 4096), default=0.0)
        large = max((abs(g / m - 1) for n, m, g in fit.rows if n >= LARGE), default=0.0)
        fitted = [g for _, _, g in fit.rows]
        summary.append((name, len(fit.rows), small, large, fitted == sorted(fitted)))
    print("| table | rows | worst row >= 4 KiB | worst row >= 64 MiB | monotone |")
    print("| --- | --- | --- | --- | --- |")
    for name, n, small, large, mono in summary:
        print(f"| {name} | {n} | {small:.1%} | {large:.1%} | {'yes' if mono else 'NO'} |", flush=True)


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


def summary(rows: list[dict]) -> dict:
    """Geomean |error| per table and per split, each split's median signed error, and its worst row."""
    out: dict = {"tables": {}, "splits": {}}
    for r in rows:
        out["tables"].setdefault(r["case"], []).append(abs(r["error"]))
    out["tables"] = {k: geomean(v) for k, v in out["tables"].items()}
    groups = [(s, lambda r, s=s: r["split"] == s) for s in ("in-sample", "held-out")]
    sets = sorted({r["set"] for r in rows if r["set"]})
    groups += [(f"held-out {k}", lambda r, k=k: r["set"] == k) for k in sets]
    for split, member in groups:
        part = [r for r in rows if member(r)]
        if part:
            worst = max(part, key=lambda r: abs(r["error"]))
            out["splits"][split] = {
                "rows": len(part),
                "geomean_abs_error": geomean([abs(r["error"]) for r in part]),
                "median_error": float(np.median([r["error"] for r in part])),  # > 0: the model is fast
                "worst": {k: worst[k] for k in ("case", "bytes", "error")},
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-speed", action="store_true", help="only the validation table")
    ap.add_argument("--round-trip", action="store_true", help="only calibrate's round trip on each table")
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for data/netsim_multigpu.json")
    ap.add_argument("--published", default=str(PUBLISHED), help="the published tables (JSON)")
    args = ap.parse_args()
    published = json.loads(Path(args.published).read_text())
    if args.round_trip:
        round_trip(published)
        return 0
    load0, stamp = loadavg(), time.strftime("%a %d %b %Y %H:%M UTC", time.gmtime())
    rows = validate(published)
    print("| split | case | GPUs | S (bytes) | measured busbw | model busbw | error | ran |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['split']} | {r['case']} | {r['gpus']} | {r['bytes']:,} | {r['measured_busbw']:.1f} "
            f"| {r['model_busbw']:.1f} | {r['error']:+.1%} | {r['ran']} |"
        )
    summ = summary(rows)
    for case, g in summ["tables"].items():
        print(f"table {case}: geomean |error| {g:.1%}")
    for split, v in summ["splits"].items():
        w = v["worst"]
        print(
            f"{split}: {v['rows']} rows, geomean |error| {v['geomean_abs_error']:.1%}, "
            f"median error {v['median_error']:+.1%}; "
            f"worst {w['error']:+.1%} ({w['case']}, {w['bytes']:,} B)"
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
                "validation": rows,
                "summary": summ,
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
