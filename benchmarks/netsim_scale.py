"""How long the flow model takes to price one allreduce, against the number of servers (16 to 4,096).

    .venv/bin/python benchmarks/netsim_scale.py [--quick] [--out docs]
    .venv/bin/python benchmarks/netsim_scale.py --at-4096 [--limit-gb 8] [--out docs]

``--at-4096`` prices every algorithm side by side on the three 4,096-server fabrics (``star:4096``,
``fattree:26`` = 4,394 servers, ``bcube:16,3``; ``bml`` on the BCube), each in its own process under an
address-space limit (``--limit-gb``, default 8), and prints wall seconds, CPU seconds and the process's
peak resident memory per algorithm; writes ``<out>/data/netsim_4096.json``. It then tries the largest
inputs the limits admit at 16,384 servers (``star:16384``): each must finish, or be refused in one line.

For each topology family (``star:N``; ``fattree:k`` with k = 4, 8, 16, 24, i.e. 16 to 3,456 servers;
``bcube:n,2`` with n = 4..64, 16 to 4,096) and each algorithm (ring, be, mst, lp, ps; bml on BCube) it
prices one 100 MB allreduce on 10 Gbit/s links in a fresh :class:`~dpcomm.sim.network.FlowModel` (no cache
carried over) and records the wall-clock seconds, the number of max-min solves and the simulated time. The
goal is every algorithm on 1,024 servers in under 10 s on a 2-core machine. Writes
``<out>/data/netsim_scale.json`` and ``<out>/netsim_scale.png``; prints the load average before and after,
since the machine may be shared. ``--quick`` stops at 256 servers.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import loadavg
from dpcomm.sim.network import FlowModel, make_fabric, simulate_allreduce
from dpcomm.utils.io import atomic_write_bytes, atomic_write_json

SIZE = 100_000_000  # bytes
RATE = 10e9  # bit/s
ALPHA = 45.26e-6  # s, the 10gbe preset
FAMILIES = {
    "star": [f"star:{n}" for n in (16, 64, 256, 1024, 4096)],
    "fattree": [f"fattree:{k}" for k in (4, 8, 16, 24)],
    "bcube": [f"bcube:{n},2" for n in (4, 8, 16, 32, 64)],
}
ALGOS = ("ring", "be", "mst", "lp", "ps", "bml")


def measure(quick: bool) -> list[dict]:
    rows = []
    for family, specs in FAMILIES.items():
        for spec in specs:
            for algo in ALGOS:
                if algo == "bml" and family != "bcube":
                    continue
                fabric = make_fabric(spec, RATE)
                if quick and fabric.servers > 256:
                    continue
                model = FlowModel(fabric, alpha_s=ALPHA)
                t0 = time.perf_counter()
                row, _ = simulate_allreduce(model, algo, SIZE)
                wall = time.perf_counter() - t0
                rows.append(
                    {
                        "family": family,
                        "topology": spec,
                        "servers": fabric.servers,
                        "algorithm": algo,
                        "wall_s": wall,
                        "solves": model.rate_solves,
                        "steps": row.steps,
                        "simulated_s": row.time_s,
                        "busbw_GBps": row.busbw_GBps,
                    }
                )
                print(
                    f"{spec:>12} {fabric.servers:5d} {algo:>5}: {wall:7.2f} s wall, "
                    f"{model.rate_solves:5d} solves, {row.steps:5d} steps, "
                    f"simulated {row.time_s * 1e3:9.2f} ms",
                    flush=True,
                )
    return rows


AT_4096 = {
    "star:4096": ("ring", "be", "mst", "lp", "ps", "ps-dedicated"),
    "fattree:26": ("ring", "be", "mst", "lp", "ps", "ps-dedicated"),
    "bcube:16,3": ("ring", "be", "mst", "lp", "ps", "ps-dedicated", "bml"),
}
AT_16384 = {"star:16384": ("ring", "be", "mst", "lp", "ps", "ps-dedicated", "ps-dedicated:64")}
_CHILD = """
import json, resource, sys, time
from dpcomm.errors import UserError
from dpcomm.sim.network import FlowModel, make_fabric, simulate_allreduce
spec, algo, size, rate, alpha = sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:6])
t0 = time.perf_counter()
try:
    model = FlowModel(make_fabric(spec, rate), alpha_s=alpha)
    row, _ = simulate_allreduce(model, algo, size)
    out = {"simulated_s": row.time_s, "steps": row.steps, "solves": model.rate_solves}
except UserError as exc:
    out = {"refused": str(exc)}
ru = resource.getrusage(resource.RUSAGE_SELF)
out.update(wall_s=time.perf_counter() - t0, cpu_s=ru.ru_utime + ru.ru_stime, peak_rss_mb=ru.ru_maxrss / 1024)
print(json.dumps(out))
"""


def _limit(gb: float):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (int(gb * 1e9), int(gb * 1e9)))

    return apply


def measure_each(cases: dict[str, tuple[str, ...]], limit_gb: float, timeout_s: float = 300) -> list[dict]:
    """One process per (topology, algorithm), under the address-space limit: time and peak memory of
    one 100 MB allreduce (wall and CPU seconds include the process's imports, about 2 s of CPU)."""
    rows = []
    for spec, algos in cases.items():
        for algo in algos:
            cmd = [sys.executable, "-c", _CHILD, spec, algo, str(SIZE), str(RATE), str(ALPHA)]
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, preexec_fn=_limit(limit_gb), timeout=timeout_s
                )
            except subprocess.TimeoutExpired:
                got = {"failed": f"still running after {timeout_s:g} s (stopped)"}
            else:
                lines = proc.stdout.strip().splitlines()
                got = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
                if not got:
                    got = {"failed": (proc.stderr.strip().splitlines() or ["?"])[-1]}
            rows.append({"topology": spec, "algorithm": algo, **got})
            what = (
                f"refused: {got['refused']}"
                if "refused" in got
                else f"FAILED: {got['failed']}"
                if "failed" in got
                else f"{got['wall_s']:6.2f} s wall, {got['cpu_s']:6.2f} s CPU, "
                f"{got['peak_rss_mb']:6.0f} MB peak RSS, {got['solves']:6d} solves, "
                f"simulated {got['simulated_s'] * 1e3:8.2f} ms"
            )
            print(f"{spec:>12} {algo:>16}: {what}", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6), layout="constrained")
    axes = fig.subplots(1, len(FAMILIES), sharey=True)
    for ax, family in zip(axes, FAMILIES, strict=True):
        for algo in ALGOS:
            pts = sorted(
                (r["servers"], r["wall_s"]) for r in rows if r["family"] == family and r["algorithm"] == algo
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algo)
        ax.axhline(10, color="grey", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(family, fontsize=10)
        ax.set_xlabel("servers")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("wall seconds per 100 MB allreduce")
    axes[0].legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="stop at 256 servers")
    ap.add_argument(
        "--at-4096", action="store_true", help="every algorithm at 4,096 servers, time and memory"
    )
    ap.add_argument("--limit-gb", type=float, default=8.0, help="address-space limit per process (--at-4096)")
    ap.add_argument("--out", default="docs", help="folder for data/netsim_scale.json and netsim_scale.png")
    args = ap.parse_args()
    before = loadavg()
    print(f"load before: {before}; {platform.node()}, {platform.processor() or platform.machine()}")
    if args.at_4096:
        rows = measure_each(AT_4096, args.limit_gb) + measure_each(AT_16384, args.limit_gb)
        after = loadavg()
        print(f"load after: {after}")
        path = Path(args.out) / "data" / "netsim_4096.json"
        atomic_write_json(
            path,
            {
                "size_bytes": SIZE,
                "rate_bps": RATE,
                "alpha_s": ALPHA,
                "limit_gb": args.limit_gb,
                "load_before": before,
                "load_after": after,
                "rows": rows,
            },
        )
        print(f"wrote {path}")
        return
    rows = measure(args.quick)
    after = loadavg()
    print(f"load after: {after}")
    out = Path(args.out)
    atomic_write_json(
        out / "data" / "netsim_scale.json",
        {
            "size_bytes": SIZE,
            "rate_bps": RATE,
            "alpha_s": ALPHA,
            "load_before": before,
            "load_after": after,
            "rows": rows,
        },
    )
    plot(rows, out / "netsim_scale.png")
    print(f"wrote {out / 'data' / 'netsim_scale.json'} and {out / 'netsim_scale.png'}")


if __name__ == "__main__":
    main()
