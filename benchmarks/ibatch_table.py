"""The rows of ``docs/ps.md``'s testbed tables, from the JSON files of ``benchmarks/ibatch_testbed.py``.

    .venv/bin/python benchmarks/ibatch_table.py docs/data/ps/slowdown/*.json
    .venv/bin/python benchmarks/ibatch_table.py --refit docs/data/ps/device/*.json

Per case: measured ``F_N`` of each pull method, in parentheses the model with the run's fitted slowdown
``d`` and with ``d = 0`` (the paper's model), the range of model/measured both ways, the measured
``ibatch`` over the better of ``all`` and ``layer``, and the modelled gain of Algorithm 1's or 2's best
plan over that better one (``ibatch`` keeps it only above ``IBATCH_MARGIN``). ``--refit`` is an analysis
after the fact, for runs made before the planners fitted ``d`` (or to see how far ``d`` can go): it fits
``d`` to the run's own measured layer-by-layer ``F_N`` (the training, not a probe) and prices every
method's batches with it. ``--slowest``: the model against the slowest worker of each iteration instead.
Runs with ``--probe confirm`` (their JSON has ``probes``) get :func:`confirm_row` instead: the paper's
model only, the cores' busy share, and each probe's ``F_N`` over the model with its verdict. Nothing is
measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cells(M: dict, model: dict[str, str]) -> list[str]:
    """Per method: measured ``F_N`` (ms), the model's text in parentheses, and for ``ibatch``/``optimal``
    the kept plan's batches (and which candidate)."""
    cells = []
    for m, v in M.items():
        cell = f"{v['fn_s'] * 1e3:.1f} ({model[m]})"
        if m in ("ibatch", "optimal"):
            cell += f" {len(v['batches'])}" + (f" ({v['algorithm']})" if v.get("algorithm") else "")
        cells.append(cell)
    return cells


def _greedy_gain(C, Tt, Ts: float, d: float) -> float:
    """The greedy algorithms' best against the better baseline, as the planner saw it (percent)."""
    from dpcomm.planner.pull import plan_pulls

    cand = plan_pulls(C, Tt, Ts, "ibatch", slowdown=d, margin=0).meta["candidates_s"]
    base = min(cand["all"], cand["layer"])
    return 100 * (base - min(cand["forward"], cand["backward"])) / base


def row(path: Path, refit: bool) -> str:
    from dpcomm.planner.pull import fit_slowdown, pull_time

    out = json.loads(path.read_text())
    C, Tt, Ts, M = out["C_s"], out["Tt_s"], out["Ts_s"], out["methods"]
    if refit:
        layer = [(i, i) for i in range(len(C))]
        d = fit_slowdown(layer, C, Tt, Ts, M["layer"]["fn_s"])
    else:
        d = out.get("slowdown", 0.0)
    model = {m: pull_time([tuple(b) for b in v["batches"]], C, Tt, Ts, slowdown=d) for m, v in M.items()}
    model0 = {m: pull_time([tuple(b) for b in v["batches"]], C, Tt, Ts) for m, v in M.items()}
    cells = _cells(M, {m: f"{model[m] * 1e3:.1f}; {model0[m] * 1e3:.1f}" for m in M})
    ratio = [model[m] / v["fn_s"] for m, v in M.items()]
    ratio0 = [model0[m] / v["fn_s"] for m, v in M.items()]
    better = min(M["all"]["fn_s"], M["layer"]["fn_s"])
    gain = _greedy_gain(C, Tt, Ts, d)
    return (
        f"| {case_label(out)} | {out.get('pulls', 'send')} | "
        f"{str(out['load_before']).split()[0]} | {d:.2f} | "
        + " | ".join(cells)
        + f" | {min(ratio):.2f}-{max(ratio):.2f} | {min(ratio0):.2f}-{max(ratio0):.2f} | "
        f"{M['ibatch']['fn_s'] / better:.3f} | {gain:+.1f}% |"
    )


CONFIRM_HEADER = (
    "| case | pulls | load before | cores busy | `all` | `layer` | `ibatch` (kept) | `optimal` | "
    "model/measured | `ibatch` / better | greedy's modelled gain | probe/model: `ibatch`, `optimal` |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def confirm_row(path: Path) -> str:
    """One row of a ``--probe confirm`` run: measured ``F_N`` of each method (ms) with the paper's model in
    parentheses, the kept plan's batches (and which candidate), model/measured over the methods, ``ibatch``
    over the better baseline, the greedy's modelled gain, and each probed plan's ``F_N`` over its model
    (``kept``, or ``refuted``: the better baseline ran instead; ``-``: a baseline, not probed)."""
    out = json.loads(path.read_text())
    C, Tt, Ts, M = out["C_s"], out["Tt_s"], out["Ts_s"], out["methods"]
    cells = _cells(M, {m: f"{v['predicted_fn_s'] * 1e3:.1f}" for m, v in M.items()})
    ratio = [v["predicted_fn_s"] / v["fn_s"] for v in M.values()]
    better = min(M["all"]["fn_s"], M["layer"]["fn_s"])
    gain = _greedy_gain(C, Tt, Ts, 0.0)
    verdicts = []
    for m in ("ibatch", "optimal"):
        p = out["probes"][m]
        verdicts.append(
            "-"
            if p["probe_s"] is None
            else f"{p['probe_s'] / p['probe_model_s']:.2f} {'kept' if p['confirmed'] else 'refuted'}"
        )
    busy = "n/a" if out.get("cpu_busy") is None else f"{out['cpu_busy']:.0%}"
    return (
        f"| {case_label(out)} | {out.get('pulls', 'send')} | {str(out['load_before']).split()[0]} | {busy} | "
        + " | ".join(cells)
        + f" | {min(ratio):.2f}-{max(ratio):.2f} | {M['ibatch']['fn_s'] / better:.3f} | {gain:+.1f}% | "
        + ", ".join(verdicts)
        + " |"
    )


def case_label(out: dict) -> str:
    """The case column: model, batch, topology, rate, placement, and a CPU quota or fair host queue."""
    where = "co-located" if out["placement"] == "co-located" else f"+ S={out['servers']}"
    extra = f", {out['cpus_per_server']:g} CPUs each" if out.get("cpus_per_server") else ""
    extra += ", fair host queue" if out.get("host_queue") == "fair" else ""
    return (
        f"{out['model']} b{out['batch']}, {out['topology']} {out['rate']}, W={out['workers']} {where}{extra}"
    )


def slowest(path: Path) -> str:
    """One row: the model's ``F_N`` over the slowest worker's of each iteration (median over iterations),
    per method: a BSP iteration waits for that worker."""
    import statistics

    out = json.loads(path.read_text())
    cells = []
    for v in out["methods"].values():
        by: dict[int, list[float]] = {}
        for _rank, it, fn in v["samples_fn_s"]:
            by.setdefault(it, []).append(fn)
        worst = statistics.median(max(x) for x in by.values() if len(x) == out["workers"])
        cells.append(f"{v['predicted_fn_s'] / worst:.2f}")
    return f"| {case_label(out)} | {out.get('pulls', 'send')} | " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="results of benchmarks/ibatch_testbed.py --json")
    parser.add_argument("--refit", action="store_true", help="fit d to each run's measured layer F_N")
    parser.add_argument(
        "--slowest", action="store_true", help="model over the slowest worker of each iteration, per method"
    )
    args = parser.parse_args()
    if args.slowest:
        print("| case | pulls | `all` | `layer` | `ibatch` | `optimal` |\n|---|---|---|---|---|---|")
        for path in args.json:
            print(slowest(path))
        return 0
    if not args.refit and all("probes" in json.loads(p.read_text()) for p in args.json):
        print(CONFIRM_HEADER)
        for path in args.json:
            print(confirm_row(path))
        return 0
    d = "`d` (refitted)" if args.refit else "`d`"
    print(
        f"| case | pulls | load before | {d} | `all` | `layer` | `ibatch` (kept) | `optimal` | "
        "model/measured | with `d = 0` | `ibatch` / better | greedy's modelled gain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in args.json:
        print(row(path, args.refit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
