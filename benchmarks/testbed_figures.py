"""Draw docs/testbed/*.png from the JSON that testbed_allreduce.py and testbed_train.py wrote.

    .venv/bin/python benchmarks/testbed_figures.py [--dir docs/testbed]

Missing inputs are skipped with a note (each figure needs its own measurement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _load(path: Path) -> dict | None:
    if not path.exists():
        print(f"skip: no {path}", file=sys.stderr)
        return None
    return json.loads(path.read_text())


def busbw(d: Path) -> None:
    data = _load(d / "busbw_star4.json")
    if not data:
        return
    rate = data["rate_bps"] / 1e6
    ceiling = rate * (data["mtu"] - 52) / (data["mtu"] + 14)
    p = int(data["topology"].split(":")[1])
    fig, ax = plt.subplots(figsize=(7, 4))
    for algo in dict.fromkeys(r["algorithm"] for r in data["rows"]):
        rows = [r for r in data["rows"] if r["algorithm"] == algo]
        xs = [r["bytes"] / 1e6 for r in rows]
        ys = [2 * (p - 1) / p * r["bytes"] * 8 / statistics.median(r["seconds"]) / 1e6 for r in rows]
        ax.plot(xs, ys, marker="o", label=algo)
    ax.axhline(rate, color="k", lw=1, label=f"link rate {rate:g} Mbit/s")
    ax.axhline(ceiling, color="k", lw=1, ls="--", label=f"TCP ceiling {ceiling:.1f}")
    ax.axhline(0.9 * rate, color="grey", lw=1, ls=":", label="90% of link rate")
    ax.set_xscale("log")
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel("busbw (Mbit/s)")
    ax.set_title(f"allreduce busbw on {data['topology']} ({rate:g} Mbit/s links)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(d / "busbw_star4.png", dpi=110)
    print(d / "busbw_star4.png")


def gst(d: Path) -> None:
    data = _load(d / "gst.json")
    if not data:
        return
    fig, axes = plt.subplots(1, len(data["table"]), figsize=(5 * len(data["table"]), 4), squeeze=False)
    for ax, entry in zip(axes[0], data["table"], strict=True):
        labels = ["PS theory", "BML theory"] + list(entry["measured"])
        vals = [entry["theory_ps"], entry["theory_bml"]] + list(entry["measured"].values())
        colors = ["#bbbbbb", "#dddddd"] + ["C0" if "bcube@" in k else "C1" for k in entry["measured"]]
        ax.bar(range(len(vals)), vals, color=colors)
        ax.set_xticks(range(len(vals)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("GST (s)")
        ratio = entry.get("ratio_bml_ps")
        ax.set_title(f"{entry['bytes'] / 1e6:g} MB: bcube/ps = {ratio:.2f} (theory 0.50)" if ratio else "")
    fig.tight_layout()
    fig.savefig(d / "gst.png", dpi=110)
    print(d / "gst.png")
    # link use over time on server 0 for the two runs
    fig, axes = plt.subplots(2, 1, figsize=(8, 5), sharex=False)
    for ax, key in zip(axes, ("bcube", "star"), strict=True):
        samples = data[key].get("host0_tx_samples") or []
        for dev in sorted({dev for _, q in samples for dev in q}):
            xs, ys = [], []
            for (t0, q0), (t1, q1) in zip(samples, samples[1:], strict=False):
                if dev in q0 and dev in q1 and t1 > t0:
                    xs.append(t1)
                    ys.append((q1[dev] - q0[dev]) * 8 / (t1 - t0) / 1e6)
            ax.plot(xs, ys, lw=0.8, label=dev)
        ax.set_ylabel("tx Mbit/s")
        ax.set_title(
            f"server 0 on {data[key]['topology']}: NIC send rate (tbf counters, 50 ms samples)", fontsize=9
        )
        ax.legend(fontsize=8)
    axes[-1].set_xlabel("seconds since the testbed came up")
    fig.tight_layout()
    fig.savefig(d / "gst_links.png", dpi=110)
    print(d / "gst_links.png")


def train(d: Path) -> None:
    data = _load(d / "train_bml.json")
    if data:
        t = [e for e in data["table"] if e["t_iter_bml_s"] and e["t_iter_ps_s"]]
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = range(len(t))
        ax.bar([x - 0.2 for x in xs], [e["t_iter_ps_s"] for e in t], 0.4, label="PS on star:9")
        ax.bar([x + 0.2 for x in xs], [e["t_iter_bml_s"] for e in t], 0.4, label="BML on bcube:3,2")
        for x, e in zip(xs, t, strict=True):
            ax.text(
                x, max(e["t_iter_ps_s"], e["t_iter_bml_s"]) * 1.02, f"-{e['jct_reduction']:.0%}", ha="center"
            )
        ax.set_xticks(list(xs), [str(e["batch"]) for e in t])
        ax.set_xlabel("sub-minibatch per server")
        ax.set_ylabel("t_iter (s); JCT = 1000 t_iter")
        ax.set_title("LeNet-5 on 9 emulated servers (paper: JCT -18.7% .. -56.4%)", fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(d / "train_bml.png", dpi=110)
        print(d / "train_bml.png")
    runs = [(f, _load(d / f)) for f in ("train_schedules.json", "train_schedules_resnet20.json")]
    runs = [(f, x) for f, x in runs if x]
    if runs:
        fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
        for ax, (_, data) in zip(axes[0], runs, strict=True):
            rows = [r for r in data["rows"] if r.get("t_iter_s")]
            ax.bar(range(len(rows)), [r["t_iter_s"] for r in rows], label="t_iter")
            ax.bar(
                range(len(rows)), [r.get("exposed_comm_s") or 0 for r in rows], label="exposed communication"
            )
            ax.set_xticks(range(len(rows)), [r["schedule"] for r in rows])
            ax.set_ylabel("seconds per iteration")
            ax.set_title(
                f"{rows[0]['model']} on {rows[0]['topology']}, batch {rows[0]['batch']}" if rows else ""
            )
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(d / "train_schedules.png", dpi=110)
        print(d / "train_schedules.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="docs/testbed")
    d = Path(p.parse_args(argv).dir)
    busbw(d)
    gst(d)
    train(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
