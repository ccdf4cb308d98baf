"""The demo's report (:mod:`dpcomm.demo`): one all-reduce cost pooled over every schedule's profile, the
simulator's prediction for each schedule run, the table, why the winner wins, and the timelines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["pooled_cost", "report"]

TOPOLOGY = "star:4"
_COLUMNS = ("schedule", "what", "groups", "t_iter ms", "vs DDP", "exposed comm ms", "predicted ms", "error",
            "slowed ms", "error")  # fmt: skip
_WHAT = {
    "ddp": "PyTorch DDP, default buckets",
    "wfbp": "one all-reduce per layer",
    "single": "one all-reduce after backward",
    "mgwfbp": "MG-WFBP merged groups",
    "optimal": "dpcomm's optimal groups",
    "dear": "reduce-scatter + all-gather (DeAR)",
}


def _groups_text(groups: list[list[int]]) -> str:
    return " ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def pooled_cost(results: list[Any]) -> Any:
    """One all-reduce cost ``T(M) = a + b M`` for the whole run: every dpcomm schedule timed the all-reduce
    at the same sizes while it profiled (the same iterations, interleaved); the median per size of all of
    them, fitted with the one least-squares fit (unweighted, ``a, b >= 0``). None without points."""
    import statistics

    from dpcomm.costmodel.base import LinearCost
    from dpcomm.costmodel.fit import fit_line

    by_size: dict[float, list[float]] = {}
    for r in results:
        for m, t in (r.cost or {}).get("points") or []:
            by_size.setdefault(float(m), []).append(float(t))
    if len(by_size) < 2:
        return None
    points = [(m, statistics.median(ts)) for m, ts in sorted(by_size.items())]
    fit = fit_line(points, weighting="ols", nonneg=True)  # as the runtime fits its own points
    return LinearCost(*fit.coef)


def _predictions(results: list[Any], cost: Any, slowdown: Any = None) -> dict[str, Any]:
    """The simulator's result per schedule (MG-WFBP Eq. 6-8, :func:`dpcomm.sim.simulate`): the plan each
    dpcomm schedule ran, on the layer times it profiled, with the run's :func:`pooled_cost`; DDP's default
    buckets as a plan on the layer times ``optimal`` profiled (DDP's own layers are not timed). With a
    ``slowdown`` (:mod:`dpcomm.sim.slowdown`), each trace slowed by its plan's messages first."""
    from dpcomm.demo_sim import ddp_plan
    from dpcomm.plan import Plan
    from dpcomm.planner.dear import split_cost
    from dpcomm.sim import simulate
    from dpcomm.sim.slowdown import slowed_trace
    from dpcomm.trace.format import trace_from_dict

    def run(trace: Any, plan: Any, r: Any) -> Any:
        trace = slowed_trace(trace, plan, slowdown) if slowdown is not None else trace
        own = split_cost(cost, (r.cost or {}).get("halves"))  # dear: the halves it measured
        return simulate(trace, plan, own, r.nproc, update_s=r.update_s)

    sims: dict[str, Any] = {}
    if cost is None:
        return sims
    for r in results:
        if r.trace and r.plan:
            sims[r.schedule] = run(trace_from_dict(r.trace), Plan.from_dict(r.plan), r)
    ref = next((r for r in results if r.schedule == "optimal" and r.trace), None)
    ref = ref or next((r for r in results if r.trace), None)
    ddp = next((r for r in results if r.schedule == "ddp"), None)
    if ref is not None and ddp is not None:
        trace = trace_from_dict(ref.trace)
        sims["ddp"] = run(trace, ddp_plan(trace, cost, ddp.nproc), ddp)
    return sims


def _row(r: Any, sim: Any, ddp: Any, slowed: Any = None) -> list[str]:
    """One table row: schedule, what, groups, measured, vs DDP, exposed, predicted, error, and predicted
    with the fitted slowdown, error."""
    kept = (r.plan or {}).get("schedule") or r.schedule
    what = _WHAT.get(r.schedule, r.schedule) + (f" (kept {kept})" if kept != r.schedule else "")
    groups = len((r.plan or {}).get("groups") or []) or (len(sim.comm) if sim is not None else 0)
    err = (sim.t_iter_s - r.t_iter_s) / r.t_iter_s if sim is not None else None
    serr = (slowed.t_iter_s - r.t_iter_s) / r.t_iter_s if slowed is not None else None
    return [
        r.schedule,
        what,
        str(groups or "-"),
        f"{r.t_iter_s * 1e3:.1f}",
        f"{r.t_iter_s / ddp.t_iter_s:.3f}" if ddp is not None else "-",
        f"{r.exposed_comm_s * 1e3:.1f}",
        f"{sim.t_iter_s * 1e3:.1f}" if sim is not None else "-",
        f"{err:+.1%}" if err is not None else "-",
        f"{slowed.t_iter_s * 1e3:.1f}" if slowed is not None else "-",
        f"{serr:+.1%}" if serr is not None else "-",
    ]


def _why(results: list[Any], sims: dict[str, Any], cost: Any) -> str | None:
    """One paragraph from the run's own numbers: why the plans win here."""
    by = {r.schedule: r for r in results}
    ref, ddp = by.get("optimal"), by.get("ddp")
    if ref is None or ddp is None or cost is None or "ddp" not in sims:
        return None
    a, b, grad = cost.a, cost.b, ref.grad_bytes
    first = list(sims["ddp"].comm[0].layers)
    return (
        f"Why: one all-reduce of all {grad / 1e6:.2f} MB takes {(a + b * grad) * 1e3:.0f} ms on these links "
        f"(measured T(M) = {a * 1e3:.1f} ms + M x {b * 1e9:.0f} ns/B), longer than backward "
        f"({ddp.backward_s * 1e3:.0f} ms). DDP's first bucket (1 MiB) holds layers {_groups_text([first])}, "
        "so its big all-reduce starts only when backward is nearly done; wfbp pays a start-up per layer; "
        "single overlaps nothing; the optimal plan starts a few groups early "
        f"({_groups_text((ref.plan or {}).get('groups') or [])}, communication order), and reaches the limit "
        "of every all-reduce plan, F + max(B, C). dear gets past it by cutting each all-reduce in two: "
        "reduce-scatters overlap backward, all-gathers overlap the next forward."
    )


def _startup_note(results: list[Any], sim: Any, cost: Any) -> str:
    """Why a plan of many groups misses most: its start-ups, priced at the least certain number of the fit."""
    small = [t for r in results for m, t in (r.cost or {}).get("points") or [] if m <= 100_000]
    spread = f" (the profiled all-reduces of <= 100 KB took {min(small) * 1e3:.1f}-{max(small) * 1e3:.1f} ms)"
    return (
        f"  {sim.schedule} is priced with {len(sim.comm)} start-ups of a = {cost.a * 1e3:.1f} ms, the least "
        f"certain number of the fit{spread if small else ''}."
    )


def _limits(results: list[Any], cost: Any) -> str | None:
    """Each schedule's limit in the model (:func:`dpcomm.planner.dear.limits`) on ``optimal``'s profile."""
    from dpcomm.planner.dear import limits, split_cost
    from dpcomm.trace.format import trace_from_dict

    ref = next((r for r in results if r.schedule == "optimal" and r.trace), None)
    if ref is None or cost is None:
        return None
    dear = next((r for r in results if r.schedule == "dear" and r.cost), None)
    halves = split_cost(cost, dear.cost.get("halves")) if dear is not None else cost
    lim = limits(trace_from_dict(ref.trace), halves, ref.nproc, ref.update_s)
    return (
        f"Limits in the model (this run's layer times and cost): every all-reduce plan >= F + max(B, C) = "
        f"{lim['allreduce'] * 1e3:.1f} ms; dear >= max(F, AG) + max(B, RS) = {lim['dear'] * 1e3:.1f} ms."
    )


def _errors(results: list[Any], sims: dict[str, Any]) -> dict[str, float]:
    """Relative error of each predicted schedule against its measured ``t_iter``."""
    pairs = [(r, sims[r.schedule]) for r in results if r.schedule in sims]
    return {r.schedule: (s.t_iter_s - r.t_iter_s) / r.t_iter_s for r, s in pairs}


def _geomean(errors: dict[str, float]) -> float:
    return math.exp(sum(math.log(max(abs(e), 1e-6)) for e in errors.values()) / len(errors))


def report(console: Any, results: list[Any], out: Path, rate: str) -> None:
    """The table, the summary lines and the timelines of one measured run."""
    from rich.table import Table

    from dpcomm.runtime.timeline import plot_measured_timeline
    from dpcomm.sim.slowdown import fit_from_results
    from dpcomm.sim.timeline import plot_timeline

    cost = pooled_cost(results)
    sims = _predictions(results, cost)
    slowdown = fit_from_results(results)
    slowed = _predictions(results, cost, slowdown) if slowdown is not None else {}
    ddp = next((r for r in results if r.schedule == "ddp"), None)
    table = Table(title=f"{TOPOLOGY} at {rate}, emulated ResNet-20 (batch 32 per worker), one run")
    for col in _COLUMNS:
        table.add_column(col, justify="left" if col in ("schedule", "what") else "right")
    for r in results:
        table.add_row(*_row(r, sims.get(r.schedule), ddp, slowed.get(r.schedule)))
    console.print(table)
    if ddp is not None:
        best = min((r for r in results if r.schedule != "ddp"), key=lambda r: r.t_iter_s)
        agree = all(len(set(r.params_sha256)) == 1 for r in results)
        console.print(
            f"[bold]{best.schedule}[/bold] ran at {best.t_iter_s / ddp.t_iter_s:.3f} of DDP's iteration time "
            f"({best.t_iter_s * 1e3:.1f} against {ddp.t_iter_s * 1e3:.1f} ms); the replicas of every "
            + ("schedule ended bitwise identical." if agree else "schedule did NOT agree."),
            highlight=False,
        )
    limits = _limits(results, cost)
    if limits:
        console.print(limits, highlight=False)
    errors = _errors(results, sims)
    if errors:
        geo, worst = _geomean(errors), max(errors, key=lambda s: abs(errors[s]))
        line = f"Simulator against measurement: geomean |error| {geo:.1%}, worst {errors[worst]:+.1%}"
        line += f" ({worst})"
        if slowed:
            e2 = _errors(results, slowed)
            w2 = max(e2, key=lambda s: abs(e2[s]))
            line += (
                f"; with backward slowed by communication, fitted from this run's backward times "
                f"({slowdown.per_msg_s * 1e3:.2f} ms per all-reduce + {slowdown.per_byte_s * 1e9:.2f} ns "
                f"per byte, {slowdown.runs} runs): {_geomean(e2):.1%}, worst {e2[w2]:+.1%} ({w2})"
            )
        console.print(line + ".", highlight=False)
        if worst in sims and abs(errors[worst]) > 0.05 and len(sims[worst].comm) > 10:
            console.print(_startup_note(results, sims[worst], cost), highlight=False)
    why = _why(results, sims, cost)
    if why:
        console.print(why, highlight=False)
    for r in results:
        for line in r.log if r.schedule in ("mgwfbp", "optimal") else []:
            if "measured iteration" in line:  # the runtime's timed trial of its plan against the fallbacks
                console.print(f"  {r.schedule}: {line.split('] ', 1)[-1]}", highlight=False, markup=False)
    traces = {r.schedule: r.chrome_trace for r in results if r.chrome_trace and Path(r.chrome_trace).exists()}
    if traces:
        title = "measured: the last iteration of each schedule, rank 0"
        fig = plot_measured_timeline(traces, out / "timeline.png", iterations=1, title=title)
        console.print(f"Measured timeline: {fig}", highlight=False)
    shown = [sims[s] for s in ("ddp", "optimal", "dear") if s in sims]
    if shown:
        title = "simulated: DDP's buckets, the optimal plan and dear"
        console.print(
            f"Simulated timeline: {plot_timeline(shown, out / 'simulated.png', title=title)}", highlight=False
        )
    if traces:
        console.print(
            f"Chrome traces (chrome://tracing, Perfetto): {out}/trace.<schedule>.json", highlight=False
        )
