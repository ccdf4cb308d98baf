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
    duplex = rate * (data["mtu"] - 52) / (data["mtu"] + 14 + 33)
    p = int(data["topology"].split(":")[1])
    mst = _load(d / "busbw_star4_mst.json")  # MST re-measured alone after its broadcast became sequential
    if mst:
        data = {**data, "rows": [r for r in data["rows"] if r["algorithm"] != "mst"] + mst["rows"]}
    fig, ax = plt.subplots(figsize=(7, 5))
    colors: dict[str, str] = {}
    for algo in dict.fromkeys(r["algorithm"] for r in data["rows"]):
        rows = [r for r in data["rows"] if r["algorithm"] == algo]
        xs = [r["bytes"] / 1e6 for r in rows]
        ys = [2 * (p - 1) / p * r["bytes"] * 8 / statistics.median(r["seconds"]) / 1e6 for r in rows]
        colors[algo] = ax.plot(xs, ys, marker="o", label=algo)[0].get_color()
    ax.axhline(rate, color="k", lw=1, label=f"link rate {rate:g} Mbit/s")
    ax.axhline(ceiling, color="k", lw=1, ls="--", label=f"TCP ceiling {ceiling:.1f}")
    ax.axhline(duplex, color="k", lw=1, ls="-.", label=f"duplex ceiling {duplex:.1f}")
    ax.axhline(0.9 * rate, color="grey", lw=1, ls=":", label="90% of link rate")
    if mst:  # MST's own bound: 2 log2(P) rounds of S, one-way flows (p = 4: 1.5 / 4 of the TCP ceiling)
        bound = 2 * (p - 1) / p / (2 * (p - 1).bit_length()) * ceiling
        ax.axhline(bound, color=colors["mst"], lw=1, ls="--", label=f"mst bound {bound:.1f}")
    ax.set_xscale("log")
    ax.set_ylim(0, rate * 1.05)
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel("busbw (Mbit/s)")
    cc = data.get("congestion_control", "bbr")  # runs before the congestion control was recorded: bbr
    ax.set_title(f"allreduce busbw on {data['topology']} ({rate:g} Mbit/s links, MTU {data['mtu']}, {cc})")
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    fig.savefig(d / "busbw_star4.png", dpi=110)
    print(d / "busbw_star4.png")


def trace(d: Path) -> None:
    """Server 0's link over the first timed call, per congestion control, with the steps' ends."""
    data = _load(d / "trace_star4_ring.json")
    if not data:
        return
    runs = data["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.2 * len(runs)), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        call = run["calls"][0]
        t0, samples = call["start"], run["host0_tx_samples"]
        pts = [(t - t0, b) for t, b in samples if t0 - 0.2 <= t <= t0 + call["seconds"] + 0.2]
        xs, ys, bin_s = [], [], 0.05
        i = 0
        while i < len(pts):  # 50 ms bins of wire rate
            j = i
            while j + 1 < len(pts) and pts[j][0] - pts[i][0] < bin_s:
                j += 1
            if j > i:
                xs.append((pts[i][0] + pts[j][0]) / 2)
                ys.append((pts[j][1] - pts[i][1]) * 8 / (pts[j][0] - pts[i][0]) / 1e6)
            i = j if j > i else i + 1
        ax.plot(xs, ys, lw=1)
        for end in call["step_done_s"].values():
            ax.axvline(end, color="grey", lw=0.6, ls=":")
        ax.set_ylabel("Mbit/s")
        ax.set_ylim(0, 130)
        ax.set_title(
            f"{data['algorithm']} {data['size']}, TCP {run['cc']}: {call['seconds']:.2f} s, "
            f"busbw {call['busbw_bps'] / 1e6:.1f} Mbit/s (server 0's tx, 50 ms bins; dotted: steps' ends)",
            fontsize=9,
        )
    axes[-1, 0].set_xlabel("seconds since the call started")
    fig.tight_layout()
    fig.savefig(d / "trace_star4_ring.png", dpi=110)
    print(d / "trace_star4_ring.png")


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
    runs = [x for x in (_load(p) for p in sorted(d.glob("train_bml*.json"))) if x]
    if runs:
        # one bar per network and sub-minibatch: the mean over runs, the whiskers span the runs
        batches = sorted({e["batch"] for r in runs for e in r["table"]})
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for shift, key, label in (
            (-0.2, "t_iter_ps_s", "PS on star:9"),
            (0.2, "t_iter_bml_s", "BML on bcube:3,2"),
        ):
            vals = [[e[key] for r in runs for e in r["table"] if e["batch"] == b and e[key]] for b in batches]
            means = [statistics.mean(v) if v else 0 for v in vals]
            err = [
                [m - min(v) if v else 0 for m, v in zip(means, vals, strict=True)],
                [max(v) - m if v else 0 for m, v in zip(means, vals, strict=True)],
            ]
            ax.bar([x + shift for x in range(len(batches))], means, 0.4, yerr=err, capsize=3, label=label)
        top = max(e[k] for r in runs for e in r["table"] for k in ("t_iter_ps_s", "t_iter_bml_s") if e[k])
        ax.set_ylim(0, top * 1.15)
        for x, b in enumerate(batches):
            reds = [
                e["jct_reduction"] for r in runs for e in r["table"] if e["batch"] == b and e["jct_reduction"]
            ]
            if reds:
                ax.text(x, top * 1.05, " / ".join(f"{-v:+.0%}" for v in reds), ha="center", fontsize=8)
        ax.set_xticks(range(len(batches)), [str(b) for b in batches])
        ax.set_xlabel("sub-minibatch per server")
        ax.set_ylabel("t_iter (s); JCT = 1000 t_iter")
        ax.set_title(
            f"LeNet-5, 9 emulated servers, {len(runs)} run(s); JCT change per run (paper: -18.7%..-56.4%)",
            fontsize=9,
        )
        ax.legend(loc="lower right", fontsize=8)
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
    trace(d)
    gst(d)
    train(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
