"""Collectives side by side on local workers: the numbers and figures of docs/collectives.md.

    .venv/bin/python benchmarks/collectives.py [--quick] [--out docs]

Four measurements, each one :func:`dpcomm.collectives.benchmark.run_bench` launch per worker count (gloo on
127.0.0.1, every result checked against torch.distributed's own collective):

1. time vs message size, every algorithm and op at P = 4 (the LP paper's Fig. 3 on 4 GPUs);
2. ring vs native throughput for allreduce of >= 16 MB at P = 2 and 4 (goal: ring >= 0.9x native);
3. time vs P = 2, 3, 4, 6, 8 at 4 MB, every algorithm and op (the LP paper's Fig. 4):
   LP's busbw should stay flat as P grows (Theorem 3.1) until the CPUs run out;
4. extra resident memory of one call per algorithm and op (goal: at most one message, 1.0x).

Every case runs 3 sweeps in its launch (2 in the P sweep) and keeps its best (the machine is shared: load
comes in bursts). It prints each table and the ratios, fits alpha/beta/gamma to (1) and says how well
each formula predicts its own rows, writes the raw rows to ``<out>/data/collectives_bench.json`` and the
figures ``<out>/collectives_size.png`` and ``<out>/collectives_scaling.png``. A 2-core machine shared with
other jobs is CPU-bound on loopback: read the numbers as relative, and note the load average printed first.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from _common import loadavg
from dpcomm.collectives.bench_fit import features, fit_network
from dpcomm.collectives.benchmark import BenchConfig, run_bench
from dpcomm.collectives.memory import measure_memory
from dpcomm.ops import OPS
from dpcomm.utils.io import atomic_write_json

ALGOS = ("ring", "lp", "mst", "be", "bcube", "ps", "native")


def _bench(nproc: int, algos, ops, sizes, iters: int, warmup: int = 1, repeat: int = 3) -> list[dict]:
    algos = tuple(a for a in algos if a != "bcube" or nproc in (4, 8, 9, 16))
    t0 = time.time()
    cfg = BenchConfig(
        nproc=nproc,
        algos=algos,
        ops=tuple(ops),
        sizes=tuple(sizes),
        iters=iters,
        warmup=warmup,
        repeat=repeat,
        check=True,
    )
    res = run_bench(cfg)
    print(f"  P={nproc}: {len(res.rows)} rows in {time.time() - t0:.0f} s, load {loadavg()}", flush=True)
    bad = [r for r in res.rows if r.check != "ok"]
    if bad:
        raise SystemExit(f"check failed: {[(r.op, r.algo, r.bytes) for r in bad]}")
    return [r.to_dict() for r in res.rows]


def _table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print(f"{'op':<10} {'algo':<7} {'P':>2} {'bytes':>10} {'time':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for r in rows:
        print(
            f"{r['op']:<10} {r['algo']:<7} {r['nproc']:>2} {r['bytes']:>10} {r['time_s'] * 1e3:>9.3f}ms "
            f"{r['algbw_GBps']:>11.4f} {r['busbw_GBps']:>11.4f}"
        )


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f}" if t < 1 else f"{t * 1e3:.0f}"


def markdown(data: dict) -> str:
    """The tables of docs/collectives.md from the rows this script writes."""
    lines = []
    size_rows, scale_rows = data["size_rows"], data["scale_rows"]
    sizes = sorted({r["bytes"] for r in size_rows})
    for op in OPS:
        lines += [f"\n**{op}, P = 4: time in ms (busbw GB/s for the largest size)**\n"]
        lines.append("| algo | " + " | ".join(_size_label(b) for b in sizes) + " |")
        lines.append("| --- |" + " ---: |" * len(sizes))
        for algo in ALGOS:
            got = {r["bytes"]: r for r in size_rows if r["op"] == op and r["algo"] == algo}
            if got:
                cells = [_ms(got[b]["time_s"]) if b in got else "" for b in sizes]
                cells[-1] += f" ({got[sizes[-1]]['busbw_GBps']:.3f})" if sizes[-1] in got else ""
                lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    procs = sorted({r["nproc"] for r in scale_rows})
    nbytes = scale_rows[0]["bytes"] if scale_rows else 0
    for op in OPS:
        lines += [f"\n**{op}, {_size_label(nbytes)}: busbw in GB/s vs P**\n"]
        lines.append("| algo | " + " | ".join(f"P={p}" for p in procs) + " |")
        lines.append("| --- |" + " ---: |" * len(procs))
        for algo in ALGOS:
            got = {r["nproc"]: r for r in scale_rows if r["op"] == op and r["algo"] == algo}
            if got:
                lines.append(
                    f"| {algo} | "
                    + " | ".join(f"{got[p]['busbw_GBps']:.3f}" if p in got else "" for p in procs)
                    + " |"
                )
    lines += [
        "\n**ring vs native, allreduce**\n",
        "| P | bytes | ring / native throughput |",
        "| ---: | ---: | ---: |",
    ]
    lines += [
        f"| {x['nproc']} | {_size_label(x['bytes'])} | {x['ring_over_native']:.2f}x |"
        for x in data["ring_over_native"]
    ]
    fit = data["fit"]
    coef = (fit["alpha_s"], fit["beta_s_per_byte"], fit["gamma_s_per_byte"])
    big = max(sizes)
    lines += [
        f"\n**measured vs the cost model with the fitted network, {_size_label(big)}, P = 4 (ms)**\n",
        "| algo | " + " | ".join(f"{op} measured | predicted" for op in OPS) + " |",
        "| --- |" + " ---: |" * (2 * len(OPS)),
    ]
    for algo in ALGOS:
        cells = []
        for op in OPS:
            r = next((r for r in size_rows if (r["op"], r["algo"], r["bytes"]) == (op, algo, big)), None)
            f = features(op, algo, big, 4, None) if r else None
            pred = sum(c * x for c, x in zip(coef, f, strict=True)) if f is not None else None
            cells += [_ms(r["time_s"]) if r else "", _ms(pred) if pred is not None else ""]
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    mem = data["memory"]
    lines += [f"\n**extra memory of one call, {_size_label(mem[0]['bytes'])} float32, P = 4 (x message)**\n"]
    lines.append("| algo | " + " | ".join(OPS) + " |")
    lines.append("| --- |" + " ---: |" * len(OPS))
    for algo in dict.fromkeys(r["algo"] for r in mem):
        got = {r["op"]: r["extra_bytes"] / r["bytes"] for r in mem if r["algo"] == algo}
        lines.append(f"| {algo} | " + " | ".join(f"{got[op]:.2f}" for op in OPS) + " |")
    return "\n".join(lines) + "\n"


def _size_label(b: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}B"
    return f"{b} B"


def _figures(size_rows: list[dict], scale_rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for rows, x, name, xlabel in (
        (size_rows, "bytes", "collectives_size.png", "message size (bytes)"),
        (scale_rows, "nproc", "collectives_scaling.png", "workers P"),
    ):
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=False)
        for ax, op in zip(axes, OPS, strict=True):
            for algo in ALGOS:
                pts = sorted((r[x], r["time_s"]) for r in rows if r["op"] == op and r["algo"] == algo)
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=algo)
            ax.set_title(op)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("time (s)")
            ax.set_yscale("log")
            if x == "bytes":
                ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        what = "P = 4" if x == "bytes" else f"{rows[0]['bytes'] >> 20} MB" if rows else ""
        fig.suptitle(f"dpcomm collectives on loopback (gloo, CPU), {what}", fontsize=10)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and worker counts (a smoke run)")
    ap.add_argument("--out", default="docs", help="folder for the figures and data/ (default docs)")
    ap.add_argument("--scale-bytes", default=str(4 << 20), help="message size of the P sweep (default 4 MiB)")
    ap.add_argument("--procs", default="2,3,4,6,8", help="worker counts of the P sweep (default 2,3,4,6,8)")
    args = ap.parse_args()
    out = Path(args.out)
    quick = args.quick
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, load {loadavg()}"
    )

    sizes = (
        (4, 1 << 10, 64 << 10, 1 << 20, 4 << 20)
        if quick
        else (4, 1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
    )
    print("\n1. time vs size, P = 4")
    size_rows = _bench(4, ALGOS, OPS, sizes, iters=2 if quick else 3)
    _table(size_rows, "time vs message size (P = 4)")

    print("\n2. ring vs native, allreduce >= 16 MB")
    ratio_rows = []
    for p in (2,) if quick else (2, 4):
        ratio_rows += _bench(
            p,
            ("ring", "native"),
            ("allreduce",),
            (16 << 20,) if quick else (16 << 20, 64 << 20),
            iters=3,
        )
    ratios = []
    for r in ratio_rows:
        if r["algo"] == "ring":
            nat = next(
                n
                for n in ratio_rows
                if n["algo"] == "native" and (n["nproc"], n["bytes"]) == (r["nproc"], r["bytes"])
            )
            ratios.append(
                {"nproc": r["nproc"], "bytes": r["bytes"], "ring_over_native": nat["time_s"] / r["time_s"]}
            )
            print(
                f"  P={r['nproc']} {r['bytes'] >> 20} MB: busbw ring {r['busbw_GBps']:.3f}, native "
                f"{nat['busbw_GBps']:.3f} GB/s: ring/native {ratios[-1]['ring_over_native']:.2f}x (>= 0.9x?)"
            )

    print("\n3. time vs P")
    scale_bytes = int(args.scale_bytes)
    scale_rows = []
    for p in (2, 4) if quick else [int(x) for x in args.procs.split(",")]:
        scale_rows += _bench(p, ALGOS, OPS, (scale_bytes,), iters=2 if quick else 3, repeat=2)
    _table(scale_rows, f"time vs P ({scale_bytes} bytes)")
    for op in OPS:
        lp = {r["nproc"]: r["busbw_GBps"] for r in scale_rows if r["algo"] == "lp" and r["op"] == op}
        first = lp[min(lp)]
        print(
            f"  lp {op} busbw vs P: "
            + ", ".join(f"P={p}: {b:.3f} ({b / first:.2f}x)" for p, b in sorted(lp.items()))
        )

    print(f"\n4. extra memory per call ({4 if quick else 16} MB float32, P = 4)")
    mem_rows = measure_memory(4, ALGOS + ("noop",), OPS, nbytes=(4 << 20) if quick else (16 << 20))
    for r in mem_rows:
        x = r["extra_bytes"] / r["bytes"]
        print(f"  {r['algo']:<7} {r['op']:<10} {x:.2f} x message{'' if x <= 1.05 else '  (> 1 message!)'}")

    print("\n5. the cost model fitted to (1)")
    from dpcomm.collectives.benchmark import Row

    net, reports = fit_network([Row(**r) for r in size_rows], name="loopback-fit")
    gbps = 1 / net.beta / 1e9 if net.beta else float("inf")
    print(
        f"  alpha = {net.alpha * 1e6:.1f} us, beta = {net.beta * 1e9:.3f} ns/B ({gbps:.2f} GB/s), "
        f"gamma = {net.gamma * 1e9:.3f} ns/B"
    )
    for rep in reports:
        print(
            f"  {rep.algo:<7} rows {rep.rows:>2} in fit {'yes' if rep.in_fit else 'no ':<3} "
            f"median err {rep.median_rel_err:.0%} max {rep.max_rel_err:.0%} "
            f"own-fit median {rep.own_median_rel_err:.0%}"
        )

    data = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "load_end": loadavg(),
        "size_rows": size_rows,
        "ratio_rows": ratio_rows,
        "ring_over_native": ratios,
        "scale_rows": scale_rows,
        "memory": mem_rows,
        "fit": {
            "alpha_s": net.alpha,
            "beta_s_per_byte": net.beta,
            "gamma_s_per_byte": net.gamma,
            "reports": [
                {
                    "algo": r.algo,
                    "median_rel_err": r.median_rel_err,
                    "own_median_rel_err": r.own_median_rel_err,
                    "in_fit": r.in_fit,
                }
                for r in reports
            ],
        },
    }
    atomic_write_json(out / "data" / "collectives_bench.json", data)
    md = markdown(data)
    print(md)
    for path in _figures(size_rows, scale_rows, out):
        print(f"wrote {path}")
    median = statistics.median(x["ring_over_native"] for x in ratios)
    print(f"median ring/native: {median:.2f}x; load at end {loadavg()}")


if __name__ == "__main__":
    main()
