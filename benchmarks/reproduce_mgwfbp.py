"""Reproduce MG-WFBP's 64-node simulation (Shi & Chu, section V-C, Fig. 9) with dpcomm's planners.

    .venv/bin/python benchmarks/reproduce_mgwfbp.py [--out docs/reproductions]

GoogLeNet (batch 64) and ResNet-50 (batch 32) analytic traces on the ``k80`` device preset
(:func:`dpcomm.trace.analytic.analytic_trace`), ring all-reduce on the ``10gbe`` preset, N = 4..64, schedules
WFBP, SyncEASGD (``single``), MG-WFBP, ``optimal`` and DDP-style ``bucket:25MB``. Prints Markdown tables
for docs/reproductions/mgwfbp.md and writes ``mgwfbp_scaling.png`` and ``mgwfbp_timeline_resnet50_64.png``.
Then, beyond the paper, where ``optimal`` beats MG-WFBP: the same models on the k80, v100 and h100 presets
up to 1,024 nodes. Nothing here is fitted to the paper's figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpcomm.costmodel import PRESETS, allreduce_cost
from dpcomm.sim import sweep
from dpcomm.sim.timeline import plot_timeline
from dpcomm.trace.analytic import analytic_trace

NODES = [4, 8, 16, 32, 64]
SCHEDULES = ["wfbp", "single", "mgwfbp", "optimal", "bucket:25MB"]
LABELS = {
    "wfbp": "WFBP",
    "single": "SyncEASGD",
    "mgwfbp": "MG-WFBP",
    "optimal": "optimal",
    "bucket:25MB": "DDP 25MB",
}
MODELS = [("googlenet", 64), ("resnet50", 32)]
PAPER_64 = {"googlenet": (1.78, 1.35), "resnet50": (1.75, 1.45)}  # MG-WFBP vs WFBP, vs SyncEASGD at N = 64


def _scaling_figure(results, path: Path) -> None:
    import io

    from matplotlib.figure import Figure

    from dpcomm.utils.io import atomic_write_bytes

    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, len(results))
    for ax, (trace, rows) in zip(axes, results, strict=True):
        ax.plot(NODES, NODES, color="grey", linestyle=":", label="linear")
        for s, marker in zip(SCHEDULES, "osD^v", strict=True):
            pts = [r.speedup for r in rows if r.schedule == s]
            style = "--" if s == "optimal" else "-"
            ax.plot(NODES, pts, marker=marker, linestyle=style, label=LABELS[s], markersize=5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(NODES, [str(n) for n in NODES])
        ax.set_xlabel("nodes N (10GbE, ring all-reduce)")
        ax.set_ylabel("speedup over one K80 GPU")
        ax.set_title(f"{trace.model}, batch {trace.batch_size}, analytic K80", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    atomic_write_bytes(path, buf.getvalue())


def _beyond(net) -> None:
    """Efficiency of MG-WFBP and optimal, and optimal's gain, on faster devices and more nodes."""
    nodes = [16, 64, 256, 1024]
    print(
        "\n### Where optimal beats MG-WFBP (efficiency MG-WFBP / optimal, gain, groups MG-WFBP / optimal)\n"
    )
    print("| device | model | t_f + t_b (ms) | " + " | ".join(f"N = {n}" for n in nodes) + " |")
    print("|" + "---|" * (3 + len(nodes)))
    for device in ("k80", "v100", "h100"):
        for model, batch in MODELS:
            trace = analytic_trace(model, batch, device)
            rows = sweep(trace, net, nodes, ["mgwfbp", "optimal"])
            cells = []
            for n in nodes:
                mg, opt = (r for r in rows if r.nodes == n)
                gain = mg.t_iter_s / opt.t_iter_s - 1
                cells.append(
                    f"{mg.efficiency:.0%} / {opt.efficiency:.0%}, {gain:+.1%}, "
                    f"{len(mg.plan.groups)} / {len(opt.plan.groups)}"
                )
            compute = (trace.t_f + trace.t_b) * 1e3
            print(f"| {device} | {model} | {compute:.1f} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/reproductions", help="folder for the figures")
    args = parser.parse_args()
    out = Path(args.out)
    net = PRESETS["10gbe"]
    results, ok = [], True
    for model, batch in MODELS:
        trace = analytic_trace(model, batch, "k80")
        rows = sweep(trace, net, NODES, SCHEDULES)
        results.append((trace, rows))
        cell = {(r.nodes, r.schedule): r for r in rows}
        print(
            f"\n### {model}, batch {batch}: {trace.num_layers} learnable layers, "
            f"{trace.total_params / 1e6:.2f} M parameters "
            f"({trace.total_params * trace.dtype_bytes / 2**20:.1f} MiB of gradients), "
            f"t_f = {trace.t_f * 1e3:.1f} ms, t_b = {trace.t_b * 1e3:.1f} ms\n"
        )
        head = ["N", "a (ms)"] + [LABELS[s] for s in SCHEDULES] + ["MG/WFBP", "MG/SyncEASGD", "optimal gain"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for n in NODES:
            t = {s: cell[n, s].t_iter_s for s in SCHEDULES}
            speed = [f"{cell[n, s].speedup:.2f} ({len(cell[n, s].plan.groups)})" for s in SCHEDULES]
            gain = t["mgwfbp"] / t["optimal"] - 1
            a_ms = allreduce_cost(net, n).a * 1e3
            print(
                f"| {n} | {a_ms:.2f} | "
                + " | ".join(speed)
                + f" | {t['wfbp'] / t['mgwfbp']:.3f} | {t['single'] / t['mgwfbp']:.3f} | {gain:+.2%} |"
            )
            if t["mgwfbp"] > min(t["wfbp"], t["single"]) + 1e-12 or t["optimal"] > t["mgwfbp"] + 1e-12:
                ok = False
        wf, se = PAPER_64[model]
        t64 = {s: cell[64, s].t_iter_s for s in SCHEDULES}
        print(
            f"\nAt N = 64: MG-WFBP/WFBP = {t64['wfbp'] / t64['mgwfbp']:.2f} (paper {wf}), "
            f"MG-WFBP/SyncEASGD = {t64['single'] / t64['mgwfbp']:.2f} (paper {se})."
        )
        cross = [n for n in NODES if cell[n, "single"].t_iter_s < cell[n, "wfbp"].t_iter_s]
        print(f"SyncEASGD faster than WFBP at N = {cross or 'none'}.")
    scaling = out / "mgwfbp_scaling.png"
    _scaling_figure(results, scaling)
    trace, rows = results[1]
    picked = [
        r.result for r in rows if r.nodes == 64 and r.schedule in ("wfbp", "single", "mgwfbp", "optimal")
    ]
    timeline = plot_timeline(
        picked, out / "mgwfbp_timeline_resnet50_64.png", title="resnet50, batch 32, K80, N=64"
    )
    print(f"\nwrote {scaling} and {timeline}")
    _beyond(net)
    print(
        "\nchecks: MG-WFBP <= min(WFBP, SyncEASGD) and optimal <= MG-WFBP at every N:", "yes" if ok else "NO"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
