"""``make demo`` without the emulated cluster: the simulator's answer for a real cluster.

Where this machine cannot build the emulated cluster (not root, no ``ip``/``tc``, no network namespaces),
:mod:`dpcomm.demo` prints why in one line and runs this instead: the shipped trace of GoogLeNet at batch 64
on a K80 (MG-WFBP's own setting, sec. VI) planned and simulated on 8 to 64 nodes of 10 GbE
(:func:`dpcomm.sim.sweep`'s pieces, as ``dpcomm simulate`` runs them), with PyTorch DDP's default buckets
(1 MiB first, then 25 MiB) as the baseline. No worker starts; it takes a few seconds.

Schedules: ``ddp`` (DDP's buckets), ``wfbp`` (one all-reduce per layer), ``single`` (one after backward),
``mgwfbp`` (MG-WFBP Algorithm 1), ``optimal`` (the exact optimum over contiguous groups) and ``dear``
(each group reduce-scattered in backward and all-gathered in the next forward, :mod:`dpcomm.planner.dear`).
The ring all-reduce costs ``T(M) = a + b M`` with ``a = 2 (N-1) alpha`` and ``b = 2 (N-1)/N beta``, the
preset's alpha and beta (MG-WFBP Eq. 9; :func:`dpcomm.costmodel.allreduce_cost`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "FALLBACK_NETWORK",
    "FALLBACK_NODES",
    "FALLBACK_TRACE",
    "SCHEDULES",
    "ddp_plan",
    "simulate_cluster",
]

FALLBACK_TRACE = "googlenet-k80-b64"
"""MG-WFBP's GoogLeNet at batch 64 on a K80 (analytic trace shipped in ``dpcomm/data/traces``)."""
FALLBACK_NETWORK = "10gbe"
"""A network preset (:data:`dpcomm.costmodel.PRESETS`)."""
FALLBACK_NODES = (8, 16, 32, 64)
SCHEDULES = ("ddp", "wfbp", "single", "mgwfbp", "optimal", "dear")


def ddp_plan(trace: Any, cost: Any, nodes: int) -> Any:
    """PyTorch DDP's default buckets as a plan: 1 MiB first, then 25 MiB, in backward order."""
    from dpcomm.planner.bucket import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, plan_bucket

    return plan_bucket(
        trace, cost, nodes, size_bytes=DDP_BUCKET_BYTES, first_bytes=DDP_FIRST_BUCKET_BYTES, name="ddp"
    )


def simulate_cluster(
    trace_name: str = FALLBACK_TRACE,
    network: str = FALLBACK_NETWORK,
    nodes: tuple[int, ...] = FALLBACK_NODES,
) -> list[dict[str, Any]]:
    """One row per (nodes, schedule): ``nodes, schedule, groups, t_iter_s, exposed_s, vs_ddp, result``."""
    from dpcomm.costmodel import PRESETS, allreduce_cost
    from dpcomm.planner import make_plan
    from dpcomm.sim import simulate
    from dpcomm.trace.shipped import find_trace

    trace = find_trace(trace_name)
    rows = []
    for n in nodes:
        cost = allreduce_cost(PRESETS[network], n, "ring")
        base = None
        for s in SCHEDULES:
            plan = ddp_plan(trace, cost, n) if s == "ddp" else make_plan(s, trace, cost, n)
            res = simulate(trace, plan, cost, n)
            base = base or res.t_iter_s
            rows.append(
                {"nodes": n, "schedule": s, "groups": len(plan.groups), "t_iter_s": res.t_iter_s,
                 "exposed_s": res.t_comm_exposed_s, "vs_ddp": res.t_iter_s / base, "result": res}
            )  # fmt: skip
    return rows


def _list(values: Any) -> str:
    """``0.94, 0.94 and 0.93`` (numbers as ratios, to 2 places; integers as they are)."""
    text = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in values]
    return ", ".join(text[:-1]) + f" and {text[-1]}" if len(text) > 1 else "".join(text)


def show(console: Any, out: Path) -> int:
    """Print the simulated table and write the timeline of the largest cluster; returns 0."""
    from rich.table import Table

    from dpcomm.costmodel import PRESETS
    from dpcomm.sim.chrome import write_chrome_trace
    from dpcomm.sim.timeline import plot_timeline
    from dpcomm.trace.shipped import find_trace

    trace = find_trace(FALLBACK_TRACE)
    grad_mb = sum(layer.params for layer in trace.layers) * 4 / 1e6
    net = PRESETS[FALLBACK_NETWORK]
    console.print(
        f"[bold]Simulated[/bold]: GoogLeNet, batch 64 per node on K80s (MG-WFBP's setting; trace "
        f"{FALLBACK_TRACE}: {len(trace.layers)} layers, {grad_mb:.1f} MB of gradients), ring all-reduce on "
        f"{FALLBACK_NETWORK} (alpha {net.alpha * 1e6:.0f} us, {8 / net.beta / 1e9:.1f} Gbit/s)",
        highlight=False,
    )
    rows = simulate_cluster()
    table = Table(title="t_iter per node count (simulator; DDP = its default buckets)")
    for col in ("nodes", "schedule", "groups", "t_iter ms", "exposed comm ms", "vs DDP"):
        table.add_column(col, justify="left" if col == "schedule" else "right")
    for i, r in enumerate(rows):
        table.add_row(
            str(r["nodes"]), r["schedule"], str(r["groups"]), f"{r['t_iter_s'] * 1e3:.1f}",
            f"{r['exposed_s'] * 1e3:.1f}", f"{r['vs_ddp']:.3f}",
            end_section=i % len(SCHEDULES) == len(SCHEDULES) - 1,
        )  # fmt: skip
    console.print(table)
    by = {(r["nodes"], r["schedule"]): r for r in rows}
    best = [min(by[(n, "mgwfbp")]["vs_ddp"], by[(n, "optimal")]["vs_ddp"]) for n in FALLBACK_NODES]
    dear = [by[(n, "dear")]["vs_ddp"] for n in FALLBACK_NODES]
    single = [by[(n, "single")]["vs_ddp"] for n in FALLBACK_NODES]
    last = FALLBACK_NODES[-1]
    console.print(
        f"dpcomm's best plan takes {_list(best)} of DDP's iteration time on {_list(FALLBACK_NODES)} nodes; "
        f"WFBP's {len(trace.layers)} start-ups grow with the nodes ({by[(last, 'wfbp')]['vs_ddp']:.2f} at "
        f"{last}), and single hides nothing behind backward ({min(single):.2f}-{max(single):.2f}). dear, "
        f"its all-reduces cut into reduce-scatters in backward and all-gathers in the next forward: "
        f"{_list(dear)}.",
        highlight=False,
    )
    n = FALLBACK_NODES[-1]
    sims = [by[(n, s)]["result"] for s in ("ddp", "optimal", "dear")]
    out.mkdir(parents=True, exist_ok=True)
    fig = plot_timeline(sims, out / "simulated.png", title=f"simulated GoogLeNet on {n} nodes of 10 GbE")
    chrome = write_chrome_trace(sims, out / "simulated.json")
    console.print(f"Timeline (DDP's buckets, the optimal plan and dear, {n} nodes): {fig}", highlight=False)
    console.print(f"Chrome trace (chrome://tracing, Perfetto): {chrome}", highlight=False)
    return 0
