"""MG-WFBP's question on transformers: does merging gradients still pay for GPT-2 and a 1.1B decoder?

    .venv/bin/python benchmarks/transformer_study.py [--out docs/reproductions] [--no-flow]

Traces: ``gpt2-h200bf16-b8`` (GPT-2 124M, batch 8 x 1,024 tokens, 75 learnable layers) and
``tinyllama-1.1b-h200bf16-b4`` (batch 4 x 2,048 tokens, 201 layers), measured layer by layer on one H200 in
bf16 by ``benchmarks/gpu_traces.py`` (``dtype_bytes`` 2). The simulator (:mod:`dpcomm.sim.simulator`) scales
nothing: it replays each layer's measured forward and backward time and prices each gradient at 2 bytes per
parameter. N = 8 .. 1,024 nodes, ring all-reduce (MG-WFBP Table II, the algorithm of its own simulation and
of docs/reproductions/mgwfbp.md; NCCL's default for large messages), on four alpha-beta networks: the
``10gbe``, ``25gbe`` and ``100gb-ib`` presets and ``100gbe-tcp`` (built here: 100 Gb/s line rate with the
TCP start-up the ``10gbe`` and ``25gbe`` presets use, so that 100 Gbit/s is seen with both start-ups).
Schedules: ``wfbp``, ``bucket:25MB`` (PyTorch DDP's default), ``mgwfbp``, ``optimal`` and ``single``.

Prints Markdown tables for docs/reproductions/transformers.md and writes ``transformers.json`` and
``transformers_scaling.png`` under ``--out``. Then two checks: the same plans at halving-doubling's
``2 log2 N`` start-ups instead of ring's ``2 (N-1)``, and a handful of points by the flow-level network model
(:mod:`dpcomm.sim.network`: every message's flows on the links of a k=8 or k=16 Fat-Tree at the same
rate, ``--mtu 0``) against the closed form. Nothing is measured here: simulation only, deterministic.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from dpcomm.costmodel import PRESETS, Network, allreduce_cost
from dpcomm.costmodel.base import CommCost
from dpcomm.sim import sweep
from dpcomm.trace.format import Trace
from dpcomm.trace.shipped import find_trace

__all__ = [
    "NODES",
    "SCHEDULES",
    "TRACES",
    "floor_s",
    "floors",
    "flow_check",
    "networks",
    "read_rows",
    "study",
    "violations",
]

TRACES = ("gpt2-h200bf16-b8", "tinyllama-1.1b-h200bf16-b4")
NODES = (8, 16, 32, 64, 128, 256, 512, 1024)
SCHEDULES = ("wfbp", "bucket:25MB", "mgwfbp", "optimal", "single")
_GROUPS_KEPT = ("mgwfbp", "optimal")  # schedules whose group sizes go into the JSON (the others: counts only)
_MB = 1e6


def networks() -> dict[str, tuple[Network, float]]:
    """``{name: (network, link rate in bit/s)}``: three presets and a 100 Gbit/s Ethernet built here."""
    tcp_alpha = PRESETS["10gbe"].alpha
    return {
        "10gbe": (PRESETS["10gbe"], 10e9),
        "25gbe": (PRESETS["25gbe"], 25e9),
        "100gbe-tcp": (
            Network(
                name="100gbe-tcp",
                alpha=tcp_alpha,  # s; ASSUMPTION, as the 25gbe preset's: MG-WFBP's measured 10GbE start-up
                beta=0.08e-9,  # s/byte = 1 / (100 Gb/s / 8), IEEE 802.3ba line rate
                source="100 Gb/s line rate (IEEE 802.3ba); alpha assumed equal to MG-WFBP's 10GbE (TCP)",
            ),
            100e9,
        ),
        "100gb-ib": (PRESETS["100gb-ib"], 100e9),
    }


def floors(trace: Trace, cost: CommCost) -> tuple[float, float]:
    """Two lower bounds on ``t_iter`` for every plan, for a cost ``T(M) = a + b M`` with ``a >= 0``.

    Bandwidth: all-reduces run one at a time, so ``k`` groups take ``k a + b M >= T(M)`` in all, and none
    starts before the first gradient is ready (``R`` of the highest-index layer with parameters):
    ``R_first + T(M)``. Last gradient: the group holding layer 0 (GPT-2's tied embedding, TinyLlama's input
    embedding) starts no earlier than the end of backward and lasts at least ``T(p_0)``:
    ``t_f + t_b + T(p_0)``.
    """
    compute = trace.t_f + trace.t_b
    total = trace.total_params * trace.dtype_bytes
    return _first_ready_s(trace) + cost(total), compute + cost(trace.layers[0].params * trace.dtype_bytes)


def _first_ready_s(trace: Trace) -> float:
    """When the first gradient is ready: ``R`` of the highest-index layer with parameters."""
    ready = first = trace.t_f + trace.t_b
    for layer in trace.layers:  # R_l = t_f + sum_{j >= l} b_j, walked from l = 0 up
        if layer.params > 0:
            first = ready
        ready -= layer.backward_s
    return first


def floor_s(trace: Trace, cost: CommCost) -> float:
    """``max(t_f + t_b, *floors(trace, cost))``: no plan's ``t_iter`` is below it."""
    return max(trace.t_f + trace.t_b, *floors(trace, cost))


def study(
    traces: Iterable[Trace],
    nets: dict[str, tuple[Network, float]],
    nodes: Sequence[int] = NODES,
    schedules: Sequence[str] = SCHEDULES,
    algo: str = "ring",
    tokens_per_sample: dict[str, int] | None = None,
) -> list[dict]:
    """One row per (trace, network, nodes, schedule): the sweep's numbers, the floor and the groups."""
    rows = []
    for trace in traces:
        for net_name, (net, _rate) in nets.items():
            for r in sweep(trace, net, nodes, schedules, algo=algo):
                cost = allreduce_cost(net, r.nodes, algo)
                bw, last = floors(trace, cost)
                samples = r.nodes * trace.batch_size / r.t_iter_s
                row = {
                    "trace": f"{trace.model}-b{trace.batch_size}",
                    "network": net_name,
                    "algo": algo,
                    "nodes": r.nodes,
                    "schedule": r.schedule,
                    "groups": len(r.plan.groups),
                    "t_iter_s": r.t_iter_s,
                    "exposed_s": r.t_comm_exposed_s,
                    "t_comm_s": r.result.t_comm_s,
                    "floor_s": floor_s(trace, cost),
                    "floor_by": "bandwidth" if bw >= last else "last gradient",
                    "start_up_s": cost.a,  # a of T(M) = a + b M: 2 (N-1) alpha for ring
                    "efficiency": r.efficiency,
                    "samples_per_s": samples,
                }
                if tokens_per_sample and trace.model in tokens_per_sample:
                    row["tokens_per_s"] = samples * tokens_per_sample[trace.model]
                if r.schedule in _GROUPS_KEPT:
                    row["group_mb"] = [round(ev.nbytes / _MB, 3) for ev in r.result.comm]
                rows.append(row)
    return rows


def violations(rows: list[dict], tol: float = 1e-12) -> list[dict]:
    """Rows faster than ``optimal`` at their point (trace, network, algo, nodes), or than the floor."""
    best = {
        (r["trace"], r["network"], r["algo"], r["nodes"]): r["t_iter_s"]
        for r in rows
        if r["schedule"] == "optimal"
    }
    return [
        r
        for r in rows
        if r["t_iter_s"] < best[r["trace"], r["network"], r["algo"], r["nodes"]] - tol
        or r["t_iter_s"] < r["floor_s"] - tol
    ]


def _cell(rows: list[dict], **key) -> dict:
    got = [r for r in rows if all(r[k] == v for k, v in key.items())]
    if len(got) != 1:
        raise LookupError(f"{len(got)} rows for {key}")
    return got[0]


def flow_check(
    trace: Trace, net_name: str, nets: dict[str, tuple[Network, float]], spec: str, nodes: Sequence[int]
) -> list[dict]:
    """The four schedules by the flow model on ``spec`` (ring, no TCP overhead) next to the closed form."""
    from dpcomm.sim.network import Goodput, make_fabric
    from dpcomm.sim.network.pricing import flow_cost_factory

    net, rate = nets[net_name]
    t0 = time.perf_counter()
    fabric = make_fabric(spec, rate, Goodput(mtu=0))  # mtu 0: line rate, as the closed form's beta
    schedules = ["wfbp", "bucket:25MB", "mgwfbp", "optimal"]
    flow = sweep(trace, flow_cost_factory(fabric, "ring", net.alpha), nodes, schedules)
    closed = sweep(trace, net, nodes, schedules)
    wall = time.perf_counter() - t0
    return [
        {
            "trace": f"{trace.model}-b{trace.batch_size}",
            "network": net_name,
            "topology": spec,
            "nodes": f.nodes,
            "schedule": f.schedule,
            "groups_flow": len(f.plan.groups),
            "groups_closed": len(c.plan.groups),
            "t_iter_flow_s": f.t_iter_s,
            "t_iter_closed_s": c.t_iter_s,
            "rel_diff": f.t_iter_s / c.t_iter_s - 1,
            "wall_s": wall,
        }
        for f, c in zip(flow, closed, strict=True)
    ]


def _print_tables(rows: list[dict], traces: list[Trace], nets) -> None:
    for trace in traces:
        key = f"{trace.model}-b{trace.batch_size}"
        mib = trace.total_params * trace.dtype_bytes / _MB
        p0 = trace.layers[0].params * trace.dtype_bytes / _MB
        print(
            f"\n### {trace.model}, batch {trace.batch_size} ({trace.device}, bf16): {trace.num_layers} "
            f"learnable layers, {trace.total_params / 1e6:.1f} M parameters = {mib:.1f} MB of gradients "
            f"(layer 0, {trace.layers[0].name}: {p0:.1f} MB, ready last); t_f = {trace.t_f * 1e3:.2f} ms, "
            f"t_b = {trace.t_b * 1e3:.2f} ms\n"
        )
        ready = _first_ready_s(trace)
        window = trace.t_f + trace.t_b - ready
        rest = (trace.total_params - trace.layers[0].params) * trace.dtype_bytes
        # the last-gradient floor binds when T(M) - T(p_0) = b (M - p_0) < window, b = 2 (N-1)/N * 8 / rate
        rates = [2 * (n - 1) / n * 8 * rest / window / 1e9 for n in (NODES[0], NODES[-1])]
        print(
            f"first gradient ready at {ready * 1e3:.2f} ms, {window * 1e3:.2f} ms before backward ends; "
            f"the other {rest / _MB:.1f} MB fit in that window (so layer 0 sets the floor) only above "
            f"{rates[0]:.0f} Gbit/s (N = {NODES[0]}) / {rates[1]:.0f} Gbit/s (N = {NODES[-1]}) (ring)\n"
        )
        head = ["network", "N", "a (ms)"] + [f"{s} ms (groups)" for s in SCHEDULES]
        head += ["floor ms", "optimal exposed ms", "optimal eff.", "optimal k tok/s"]
        head += ["wfbp / opt", "bucket / opt", "mgwfbp / opt"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for net_name in nets:
            for n in NODES:
                c = {s: _cell(rows, trace=key, network=net_name, nodes=n, schedule=s) for s in SCHEDULES}
                opt = c["optimal"]
                cells = [net_name, str(n), f"{opt['start_up_s'] * 1e3:.2f}"]
                cells += [f"{c[s]['t_iter_s'] * 1e3:.1f} ({c[s]['groups']})" for s in SCHEDULES]
                cells += [
                    f"{opt['floor_s'] * 1e3:.1f}",
                    f"{opt['exposed_s'] * 1e3:.1f}",
                    f"{opt['efficiency']:.1%}",
                    f"{opt.get('tokens_per_s', float('nan')) / 1e3:.0f}",
                ]
                cells += [
                    f"{c[s]['t_iter_s'] / opt['t_iter_s']:.3f}" for s in ("wfbp", "bucket:25MB", "mgwfbp")
                ]
                print("| " + " | ".join(cells) + " |")


def _print_summary(rows: list[dict], traces: list[Trace], nets) -> None:
    print(
        "\n### Summary over N = 8 .. 1,024: t_iter over optimal's (min - max), and where each pattern holds\n"
    )
    head = ["trace", "network", "wfbp / opt", "bucket / opt", "mgwfbp / opt", "single / opt"]
    head += [
        "N where mgwfbp slower than bucket:25MB",
        "N where optimal is one group",
        "optimal / floor (max)",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for trace in traces:
        key = f"{trace.model}-b{trace.batch_size}"
        for net_name in nets:
            c = {
                (n, s): _cell(rows, trace=key, network=net_name, nodes=n, schedule=s)
                for n in NODES
                for s in SCHEDULES
            }
            t = {k: v["t_iter_s"] for k, v in c.items()}
            cells = [trace.model, net_name]
            for s in ("wfbp", "bucket:25MB", "mgwfbp", "single"):
                ratios = [t[n, s] / t[n, "optimal"] for n in NODES]
                cells.append(f"{min(ratios):.3f} - {max(ratios):.3f}")
            slower = [n for n in NODES if t[n, "mgwfbp"] > t[n, "bucket:25MB"] + 1e-12]
            one = [n for n in NODES if c[n, "optimal"]["groups"] == 1]
            cells += [", ".join(map(str, slower)) or "none", ", ".join(map(str, one)) or "none"]
            cells.append(f"{max(t[n, 'optimal'] / c[n, 'optimal']['floor_s'] for n in NODES):.3f}")
            print("| " + " | ".join(cells) + " |")
    opt = [r for r in rows if r["schedule"] == "optimal"]
    gap = [r["t_iter_s"] / r["floor_s"] for r in opt]
    by_bw = sum(r["floor_by"] == "bandwidth" for r in rows)
    print(
        f"\noptimal / floor over all {len(opt)} points: {min(gap):.4f} - {max(gap):.4f}; the floor is set by "
        f"bandwidth at {by_bw} of {len(rows)} rows, by the last gradient at {len(rows) - by_bw}"
    )


def _print_groups(rows: list[dict], traces: list[Trace], nets, nodes=(8, 64, 1024)) -> None:
    print("\n### Optimal's groups in communication order (MB), and MG-WFBP's count\n")
    print("| trace | network | N | optimal groups (MB) | mgwfbp groups | floor set by |")
    print("|---|---|---|---|---|---|")
    for trace in traces:
        key = f"{trace.model}-b{trace.batch_size}"
        for net_name in nets:
            for n in nodes:
                opt = _cell(rows, trace=key, network=net_name, nodes=n, schedule="optimal")
                mg = _cell(rows, trace=key, network=net_name, nodes=n, schedule="mgwfbp")
                sizes = ", ".join(f"{m:.1f}" if m >= 0.1 else f"{m:.3f}" for m in opt["group_mb"])
                print(f"| {trace.model} | {net_name} | {n} | {sizes} | {mg['groups']} | {opt['floor_by']} |")


def _print_algo(ring: list[dict], be: list[dict], traces: list[Trace], nets, nodes=(64, 1024)) -> None:
    print("\n### Ring against halving-doubling (be: 2 log2 N start-ups), t_iter ms (groups)\n")
    head = ["trace", "network", "N", "algo"] + list(SCHEDULES[:4]) + ["bucket / opt", "wfbp / opt"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for trace in traces:
        key = f"{trace.model}-b{trace.batch_size}"
        for net_name in nets:
            for n in nodes:
                for algo, rows in (("ring", ring), ("be", be)):
                    c = {
                        s: _cell(rows, trace=key, network=net_name, nodes=n, schedule=s)
                        for s in SCHEDULES[:4]
                    }
                    t_opt = c["optimal"]["t_iter_s"]
                    cells = [trace.model, net_name, str(n), algo]
                    cells += [f"{c[s]['t_iter_s'] * 1e3:.1f} ({c[s]['groups']})" for s in SCHEDULES[:4]]
                    cells += [
                        f"{c['bucket:25MB']['t_iter_s'] / t_opt:.3f}",
                        f"{c['wfbp']['t_iter_s'] / t_opt:.3f}",
                    ]
                    print("| " + " | ".join(cells) + " |")


def _figure(rows: list[dict], traces: list[Trace], nets, path: Path) -> None:
    """Rows 1-2: tokens/s against N per network (log-log, linear scaling dotted); rows 3-4: each schedule's
    t_iter over optimal's (how much slower than the best plan)."""
    from matplotlib.figure import Figure

    from dpcomm.utils.io import atomic_write_bytes

    fig = Figure(figsize=(13, 10.5), layout="constrained")
    axes = fig.subplots(2 * len(traces), len(nets), sharex=True)
    for i, trace in enumerate(traces):
        key = f"{trace.model}-b{trace.batch_size}"
        for j, net_name in enumerate(nets):
            top, low = axes[i][j], axes[len(traces) + i][j]
            cell = {
                (n, s): _cell(rows, trace=key, network=net_name, nodes=n, schedule=s)
                for n in NODES
                for s in SCHEDULES
            }
            one = cell[NODES[0], "optimal"]
            per_node = one["tokens_per_s"] / one["efficiency"] / NODES[0] / 1e3
            top.plot(NODES, [n * per_node for n in NODES], color="grey", linestyle=":", label="linear")
            for s, marker in zip(SCHEDULES, "osD^v", strict=True):
                style = "--" if s == "optimal" else "-"
                kw = {"marker": marker, "linestyle": style, "label": s, "markersize": 4}
                top.plot(NODES, [cell[n, s]["tokens_per_s"] / 1e3 for n in NODES], **kw)
                ratio = [cell[n, s]["t_iter_s"] / cell[n, "optimal"]["t_iter_s"] for n in NODES]
                low.plot(NODES, ratio, **kw)
            top.set_yscale("log")
            low.set_yscale("log")
            low.set_ylim(0.98, 50)
            top.set_title(f"{trace.model}, {net_name}: throughput", fontsize=9)
            low.set_title(f"{trace.model}, {net_name}: t_iter / optimal's", fontsize=9)
            for ax in (top, low):
                ax.set_xscale("log", base=2)
                ax.set_xticks(NODES, [str(n) for n in NODES], fontsize=7)
                ax.grid(True, alpha=0.3)
            if j == 0:
                top.set_ylabel("k tokens/s (H200 bf16 trace)", fontsize=8)
                low.set_ylabel("t_iter / optimal t_iter", fontsize=8)
            if i == 0 and j == 0:
                top.legend(fontsize=7)
            if i == len(traces) - 1:
                low.set_xlabel("nodes N (ring all-reduce)", fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    atomic_write_bytes(path, buf.getvalue())


def _compact(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, list):
        return [_compact(v) for v in x]
    if isinstance(x, dict):
        return {k: _compact(v) for k, v in x.items()}
    return x


def _write_json(path: Path, meta: dict, sections: dict[str, list[dict]]) -> None:
    """``{"meta": ..., name: {"columns": [...], "rows": [[...], ...]}}``, one row a line (columns: the union
    of the rows' keys, ``null`` where a row has none); :func:`read_rows` turns a section back into dicts."""
    from dpcomm.utils.io import atomic_write_text

    lines = ["{", f' "meta": {json.dumps(_compact(meta))},']
    for k, (name, rows) in enumerate(sections.items()):
        cols = list(dict.fromkeys(c for r in rows for c in r))
        lines.append(f' "{name}": {{"columns": {json.dumps(cols)}, "rows": [')
        body = [json.dumps(_compact([r.get(c) for c in cols])) for r in rows]
        lines += [f"  {b}" + ("," if i < len(body) - 1 else "") for i, b in enumerate(body)]
        lines.append(" ]}" + ("," if k < len(sections) - 1 else ""))
    lines.append("}")
    atomic_write_text(path, "\n".join(lines) + "\n")


def read_rows(path: Path, section: str = "rows") -> list[dict]:
    """A section of ``transformers.json`` as one dict per row (keys whose value is ``null`` left out)."""
    obj = json.loads(Path(path).read_text())[section]
    return [{c: v for c, v in zip(obj["columns"], row, strict=True) if v is not None} for row in obj["rows"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/reproductions", help="folder for the JSON and the figure")
    parser.add_argument("--no-flow", action="store_true", help="skip the flow-model check (~10 s of it)")
    args = parser.parse_args()
    from _common import loadavg
    from dpcomm.models.zoo import MODELS

    out = Path(args.out)
    t0 = time.perf_counter()
    print(f"load average {loadavg()}")
    traces = [find_trace(t) for t in TRACES]
    seq = {t.model: MODELS[t.model].input_shape[0] for t in traces}  # tokens per sample (the zoo's T)
    nets = networks()
    rows = study(traces, nets, tokens_per_sample=seq)
    be = study(traces, nets, nodes=(64, 1024), schedules=SCHEDULES[:4], algo="be", tokens_per_sample=seq)
    t_study = time.perf_counter() - t0
    for name, (net, rate) in nets.items():
        print(
            f"{name}: alpha {net.alpha * 1e6:.2f} us, beta {net.beta * 1e9:.3f} ns/B ({rate / 1e9:g} Gbit/s):"
            f" {net.source}"
        )
    _print_tables(rows, traces, nets)
    _print_summary(rows, traces, nets)
    _print_groups(rows, traces, nets)
    _print_algo(rows, be, traces, nets)

    ok = not violations(rows) and not violations(be)
    flow = []
    if not args.no_flow:
        for trace in traces:
            for net_name in ("10gbe", "100gb-ib"):
                flow += flow_check(trace, net_name, nets, "fattree:8", (8, 64))
        flow += flow_check(traces[0], "10gbe", nets, "fattree:16", (1024,))
        print("\n### Flow model (ring on a Fat-Tree, --mtu 0) against the closed form, t_iter ms\n")
        print(
            "| trace | network | topology | N | schedule | groups | closed form | flow model | difference |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for f in flow:
            print(
                f"| {f['trace']} | {f['network']} | `{f['topology']}` | {f['nodes']} | {f['schedule']} | "
                f"{f['groups_flow']} | {f['t_iter_closed_s'] * 1e3:.2f} | {f['t_iter_flow_s'] * 1e3:.2f} | "
                f"{f['rel_diff']:+.4%} |"
            )
        worst = max(abs(f["rel_diff"]) for f in flow)
        print(f"\nflow model against closed form: {len(flow)} points, worst |difference| {worst:.4%}")
    meta = {
        "command": ".venv/bin/python benchmarks/transformer_study.py",
        "traces": {
            f"{t.model}-b{t.batch_size}": {
                "file": name,
                "device": t.device,
                "dtype_bytes": t.dtype_bytes,
                "layers": t.num_layers,
                "params": t.total_params,
                "tokens_per_sample": seq[t.model],
                "t_f_s": t.t_f,
                "t_b_s": t.t_b,
            }
            for name, t in zip(TRACES, traces, strict=True)
        },
        "networks": {k: {**n.to_dict(), "rate_bit_s": r} for k, (n, r) in nets.items()},
        "algo": "ring",
    }
    path_json = out / "transformers.json"
    path_png = out / "transformers_scaling.png"
    _write_json(path_json, meta, {"rows": rows, "be": be, "flow": flow})
    _figure(rows, traces, nets, path_png)
    print(f"\nwrote {path_json} and {path_png}")
    print(
        f"study (plans and simulations, {len(rows) + len(be)} points): {t_study:.2f} s; "
        f"all: {time.perf_counter() - t0:.1f} s"
    )
    print(f"load average {loadavg()}")
    print(
        "checks: optimal <= every schedule and every schedule >= the floor, at every point:",
        "yes" if ok else "NO",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
