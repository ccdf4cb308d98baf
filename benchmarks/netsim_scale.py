"""How long the flow model takes to price one allreduce, against the number of servers (16 to 4,096).

    .venv/bin/python benchmarks/netsim_scale.py [--quick] [--out docs]

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
import platform
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
    ap.add_argument("--out", default="docs", help="folder for data/netsim_scale.json and netsim_scale.png")
    args = ap.parse_args()
    before = loadavg()
    print(f"load before: {before}; {platform.node()}, {platform.processor() or platform.machine()}")
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
