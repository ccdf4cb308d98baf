"""BML's section-5 comparison at scale with the flow model: GST of BML on BCube(n,k) against PS on a Fat-Tree.

    .venv/bin/python benchmarks/reproduce_bml.py [--out docs/reproductions]

For N = 16 .. 4,096 servers: BML on every BCube(n,k) with n^k = N and k = 2..4, and the P2P parameter
server (and ring) on the 3-layer Fat-Tree with N servers where one exists (fattree:4 = 16, fattree:16 =
1,024), else on ``star:N`` (a non-blocking switch: what a full-bisection Fat-Tree gives these flows, and how
the paper's own testbed emulated it; on fattree:4 and fattree:16 the two agree to 0.1%). Also PS on the
same BCube (the paper: "it will double the GST"). Links: 40 Gbit/s per direction, alpha 3 us (the
``40gbe-roce`` preset: BML's testbed ran RoCE on 40GE), no TCP overhead (``--mtu 0``: the paper's theory has
none). T_F = 8 S / rate; the paper's GST: PS on Fat-Tree ``2 (N-1)/N T_F``, BML ``2 (N-1)/(k N) T_F``.
Switch counts: BCube ``k N / n``, a Fat-Tree of the same n-port switches ``5 N / n`` (and the Fat-Tree
actually simulated, ``5 k_ft^2 / 4``). Writes ``<out>/bml_scaling.json`` and ``<out>/bml_scaling.png``.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

from _common import loadavg
from dpcomm.costmodel.network import PRESETS
from dpcomm.sim.network import FlowModel, Goodput, make_fabric, simulate_allreduce
from dpcomm.utils.io import atomic_write_bytes, atomic_write_json

RATE = 40e9
ALPHA = PRESETS["40gbe-roce"].alpha
SIZES = (12_500_000, 100_000_000)  # LeNet-5's gradients (the paper's 12.5 MB) and a 100 MB model
CUBES = {
    16: [(4, 2), (2, 4)],
    64: [(8, 2), (4, 3)],
    256: [(16, 2), (4, 4)],
    1024: [(32, 2)],
    4096: [(64, 2), (16, 3), (8, 4)],
}
FATTREE = {16: "fattree:4", 1024: "fattree:16"}


def _gst(spec: str, algo: str, nbytes: int, alpha: float = ALPHA) -> float:
    model = FlowModel(make_fabric(spec, RATE, Goodput(mtu=0)), alpha_s=alpha)
    return simulate_allreduce(model, algo, nbytes)[0].time_s


def measure() -> list[dict]:
    rows = []
    for n_servers, cubes in CUBES.items():
        ft = FATTREE.get(n_servers, f"star:{n_servers}")
        for nbytes in SIZES:
            t_f = 8 * nbytes / RATE
            ps_ft = _gst(ft, "ps", nbytes)
            ps_ft0 = _gst(ft, "ps", nbytes, 0.0)  # the bandwidth term alone, as the paper's GST
            ring_ft = _gst(ft, "ring", nbytes)
            for n, k in cubes:
                cube = f"bcube:{n},{k}"
                t0 = time.perf_counter()
                bml = _gst(cube, "bml", nbytes)
                ps_bc = _gst(cube, "ps", nbytes) if n_servers <= 1024 else None
                rows.append(
                    {
                        "servers": n_servers,
                        "bytes": nbytes,
                        "bcube": cube,
                        "n": n,
                        "k": k,
                        "fattree": ft,
                        "T_F": t_f,
                        "theory_ps": 2 * (n_servers - 1) / n_servers * t_f,
                        "theory_bml": 2 * (n_servers - 1) / (k * n_servers) * t_f,
                        "bml_bcube": bml,
                        "ps_fattree": ps_ft,
                        "ring_fattree": ring_ft,
                        "ps_bcube": ps_bc,
                        "ratio": bml / ps_ft,
                        "ratio_alpha0": _gst(cube, "bml", nbytes, 0.0) / ps_ft0,
                        "switches_bcube": k * n_servers // n,
                        "switches_fattree_same_ports": 5 * n_servers / n,
                        "wall_s": time.perf_counter() - t0,
                    }
                )
                r = rows[-1]
                print(
                    f"N={n_servers:5d} S={nbytes / 1e6:6.1f} MB {cube:>11}: BML {bml * 1e3:8.3f} ms "
                    f"(theory {r['theory_bml'] * 1e3:8.3f}), PS on {ft} {ps_ft * 1e3:8.3f} ms "
                    f"(theory {r['theory_ps'] * 1e3:8.3f}), ratio {r['ratio']:.3f} (1/k = {1 / k:.3f})",
                    flush=True,
                )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    big = max(SIZES)
    pts = [r for r in rows if r["bytes"] == big]
    ns = sorted({r["servers"] for r in pts})
    ax.plot(
        ns, [next(r["ps_fattree"] for r in pts if r["servers"] == n) for n in ns], "o-", label="PS, Fat-Tree"
    )
    for k in (2, 3, 4):
        sel = sorted((r["servers"], r["bml_bcube"]) for r in pts if r["k"] == k)
        if sel:
            ax.plot([s for s, _ in sel], [t for _, t in sel], "s--", label=f"BML, BCube(n,{k})")
    sel = sorted((r["servers"], r["ps_bcube"]) for r in pts if r["k"] == 2 and r["ps_bcube"] is not None)
    ax.plot([s for s, _ in sel], [t for _, t in sel], "^:", label="PS, BCube(n,2)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("servers N")
    ax.set_ylabel(f"GST of {big / 1e6:g} MB (s), 40 Gbit/s links")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/reproductions", help="folder for bml_scaling.json and .png")
    args = ap.parse_args()
    before = loadavg()
    rows = measure()
    out = Path(args.out)
    atomic_write_json(
        out / "bml_scaling.json", {"load_before": before, "load_after": loadavg(), "rows": rows}
    )
    plot(rows, out / "bml_scaling.png")
    print(f"load {before} -> {loadavg()}; wrote {out / 'bml_scaling.json'} and {out / 'bml_scaling.png'}")
    print(
        "| N | S | BCube | switches k N/n (5 N/n) | BML theory | BML | PS theory | PS on Fat-Tree "
        "| ring on Fat-Tree | PS on BCube | BML / PS | BML / PS, alpha = 0 | 1/k |"
    )
    print("|" + " --- |" * 13)
    for r in rows:
        psb = "" if r["ps_bcube"] is None else f"{r['ps_bcube'] * 1e3:.2f}"
        print(
            f"| {r['servers']} | {r['bytes'] / 1e6:g} MB | `{r['bcube']}` | {r['switches_bcube']} "
            f"({r['switches_fattree_same_ports']:g}) | {r['theory_bml'] * 1e3:.2f} "
            f"| {r['bml_bcube'] * 1e3:.2f} | {r['theory_ps'] * 1e3:.2f} "
            f"| {r['ps_fattree'] * 1e3:.2f} (`{r['fattree']}`) | {r['ring_fattree'] * 1e3:.2f} | {psb} "
            f"| **{r['ratio']:.3f}** | {r['ratio_alpha0']:.3f} | {1 / r['k']:.3f} |"
        )


if __name__ == "__main__":
    main()
