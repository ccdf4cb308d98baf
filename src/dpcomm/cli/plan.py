"""Plan which layers' gradients are all-reduced together, and show the plan's simulated timing.

Example: ``dpcomm plan --trace resnet50.json --nodes 16 --network 10gbe --schedule mgwfbp``. Under the plan
it prints the limits of the all-reduce and DeAR schedules and which of DDP with the ``optimal`` plan,
``dear`` and FSDP2 is fastest in the model (:mod:`dpcomm.cli._verdict`; ``--json``: ``limit_s``, the
plan's schedule's, and ``verdict``).
With ``--pull METHOD`` it plans a parameter server's pulls instead (iBatch): ``dpcomm plan --trace
googlenet-k80-b64 --nodes 16 --pull ibatch [--ps-servers S]`` prints the batches and the model's time.
With ``--fsdp METHOD`` it plans FSDP2 (``--hsdp G|auto``: HSDP) units and prints the ``fully_shard`` code
(:mod:`dpcomm.cli.plan_fsdp`). ``--topology`` prices every collective on a cluster by the flow model, as
``dpcomm simulate --topology`` does (``--nodes`` then defaults to all its GPUs).
"""

from __future__ import annotations

import argparse
import json

from dpcomm.cli._costargs import (
    add_cost_arguments,
    add_fsdp_arguments,
    add_topology_arguments,
    check_update,
    costs_of,
    load_trace_arg,
    parse_nodes,
)
from dpcomm.cli.plan_export import add_export_arguments, check_export_arguments, print_export
from dpcomm.cli.plan_fsdp import add_plan_fsdp_arguments, run_fsdp
from dpcomm.errors import UserError

COMMAND = "plan"
HELP = (
    "plan gradient groups for a trace (wfbp, single, bucket:SIZE, mgwfbp, optimal, dear), or FSDP/HSDP units"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", metavar="N", help="number of nodes (data-parallel workers; default with --topology: all)"
    )
    parser.add_argument(
        "--schedule",
        default=None,
        metavar="S",
        help="wfbp, single, bucket:SIZE, bucket:auto (the best single size), mgwfbp (default), optimal or "
        "dear (reduce-scatter in backward, all-gather in the next forward)",
    )
    parser.add_argument(
        "--pull", metavar="METHOD", help="plan parameter-server pulls instead: all, layer, ibatch or optimal"
    )
    parser.add_argument(
        "--ps-servers",
        type=int,
        default=0,
        metavar="S",
        help="with --pull: S dedicated servers (default: co-located, every worker serves a shard)",
    )
    parser.add_argument(
        "--pull-slowdown",
        type=float,
        default=0.0,
        metavar="D",
        help="with --pull: the forward runs 1+D times slower while pulls are in flight (default 0, the "
        "paper's model; dpcomm train --ps fits D on its workers)",
    )
    add_cost_arguments(parser)
    add_topology_arguments(parser)
    add_plan_fsdp_arguments(parser)
    add_fsdp_arguments(parser)
    add_export_arguments(parser)


def run(args: argparse.Namespace) -> int:
    check_export_arguments(args)
    if args.fsdp is not None or args.hsdp is not None or args.plot is not None:
        return run_fsdp(args)
    if args.memory is not None or args.state_bytes != "0":
        raise UserError("--memory and --state-bytes budget FSDP units: give --fsdp METHOD")
    if args.pull is not None or args.ps_servers or args.pull_slowdown:
        return _run_pull(args)
    from dpcomm.cli.plan_fsdp import world_of
    from dpcomm.planner import make_plan
    from dpcomm.sim import simulate

    nodes = world_of(args)
    update_s = check_update(args.update_s)
    trace = load_trace_arg(args.trace)
    cost_for, model = costs_of(args, nodes)
    cost = cost_for(nodes)
    schedule = args.schedule or ("bucket:auto" if args.export else "mgwfbp")
    plan = make_plan(schedule, trace, cost, nodes)
    res = simulate(trace, plan, cost, nodes, update_s=update_s)
    if args.export:
        from dpcomm.integrations.export import export_ddp

        vs = _against(trace, cost, nodes, update_s)
        times = (f"bucket:auto's size: t_iter {res.t_iter_s * 1e3:.2f} ms in the model, DDP's default "
                 f"{vs['ddp'] * 1e3:.2f} ms, the per-bucket optimum "
                 f"{vs['optimal'] * 1e3:.2f} ms")  # fmt: skip
        return print_export(export_ddp(args.export, plan, trace, zero_stage=args.zero_stage), times)
    from dpcomm.cli._verdict import limits_text, plain_fsdp
    from dpcomm.planner.dear import limits
    from dpcomm.sim.verdict import verdict

    known = {plan.schedule: res.t_iter_s} if plan.schedule in ("optimal", "dear") else None
    fsdp = plain_fsdp(args, trace, nodes, model)
    v = verdict(trace, cost, nodes, update_s=update_s, fsdp=fsdp, known=known)
    limit_s = limits(trace, cost, nodes, update_s)["dear" if plan.sharded else "allreduce"]
    if args.json:
        out = {
            "schedule": plan.schedule,
            "nodes": nodes,
            "groups": [list(g) for g in plan.groups],
            "t_iter_s": res.t_iter_s,
            "t_comm_exposed_s": res.t_comm_exposed_s,
            "planning_s": plan.meta["planning_s"],
            "limit_s": limit_s,
            "verdict": v.to_dict(),
        }
        if "bucket_cap_mb" in plan.meta:  # bucket:auto: the one number, and what it is against
            out |= {"bucket_cap_mb": plan.meta["bucket_cap_mb"], "against_s": _against(trace, cost, nodes,
                                                                                     update_s)}  # fmt: skip
        print(json.dumps(out))
        return 0
    _print(trace, plan, res, cost)
    if "bucket_cap_mb" in plan.meta:
        mb, vs = plan.meta["bucket_cap_mb"], _against(trace, cost, nodes, update_s)
        t, ddp, best = (x * 1e3 for x in (res.t_iter_s, vs["ddp"], vs["optimal"]))
        print(
            f"one bucket size: bucket_cap_mb={mb:.9g} (DDP, Accelerate; the Trainer's ddp_bucket_cap_mb), "
            f"{plan.meta['bucket_bytes']} bytes (DeepSpeed's reduce_bucket_size counts elements: divide by "
            f"the gradients' bytes each), best of {plan.meta['layouts']} layouts; t_iter {t:.2f} ms against "
            f"DDP's default {ddp:.2f} ms and the per-bucket optimum {best:.2f} ms"
        )
    print(limits_text(trace, cost, nodes, update_s, dear_first=plan.sharded))
    print(v.text())
    return 0


def _against(trace, cost, nodes: int, update_s: float) -> dict[str, float]:
    """``bucket:auto``'s yardsticks: DDP's default buckets and ``optimal``'s groups, simulated alike."""
    from dpcomm.planner import make_plan
    from dpcomm.sim import simulate

    return {s: simulate(trace, make_plan(s, trace, cost, nodes), cost, nodes, update_s=update_s).t_iter_s
            for s in ("ddp", "optimal")}  # fmt: skip


def _print(trace, plan, res, cost) -> None:
    """The groups in communication order with their collectives' times, and the iteration's. A ``dear``
    plan's groups each have an all-gather (in forward, from the step's end) and a reduce-scatter (in
    backward, from the gradients' ready time), :mod:`dpcomm.sim.dear`'s events."""
    from rich.console import Console
    from rich.table import Table

    dear = plan.sharded
    what = "reduce-scattered in backward, all-gathered in the next forward" if dear else "all-reduced"
    table = Table(title=f"{plan.schedule} plan: {trace.model}, N={res.nodes}, {len(plan.groups)} group(s) "
                        f"{what}")  # fmt: skip
    cols = ["#", "layers", "first .. last layer", "MB"]
    halves = ["all-gather ms", "ready ms", "reduce-\nscatter ms"]  # fits 80 columns (rich cuts a long word)
    cols += halves if dear else ["ready ms", "start ms", "end ms"]
    for col in cols:
        table.add_column(col, justify="left" if col.startswith("first") else "right")
    comm = {(ev.op, tuple(ev.layers)): ev for ev in res.comm}
    for k, g in enumerate(plan.groups):
        span = f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}"
        names = (
            trace.layers[g[0]].name
            if len(g) == 1
            else f"{trace.layers[g[-1]].name} .. {trace.layers[g[0]].name}"
        )
        mb = sum(trace.layer_bytes(l) for l in g) / 2**20
        if dear:
            ag, rs = comm.get(("all-gather", tuple(g))), comm.get(("reduce-scatter", tuple(g)))
            times = [f"{ag.start_s * 1e3:.2f}-{ag.end_s * 1e3:.2f}" if ag else "-",
                     f"{rs.ready_s * 1e3:.2f}" if rs else "-",
                     f"{rs.start_s * 1e3:.2f}-{rs.end_s * 1e3:.2f}" if rs else "-"]  # fmt: skip
        else:
            ev = comm.get(("allreduce", tuple(g)))
            times = [f"{t * 1e3:.2f}" for t in (ev.ready_s, ev.start_s, ev.end_s)] if ev else ["-", "-", "-"]
        table.add_row(str(k), span, names, f"{mb:.2f}", *times)
    console = Console()
    console.print(table)
    priced = (f"all-reduce cost {cost}, each half (reduce-scatter, all-gather) half of it" if dear
              else f"cost {cost}")  # fmt: skip
    console.print(
        f"t_f {res.t_f_s * 1e3:.2f} ms, t_b {res.t_b_s * 1e3:.2f} ms, t_iter {res.t_iter_s * 1e3:.2f} ms, "
        f"exposed communication {res.t_comm_exposed_s * 1e3:.2f} ms, speedup {res.speedup:.2f} "
        f"(efficiency {res.efficiency:.1%}); {priced}; planned in {plan.meta['planning_s'] * 1e3:.2f} ms"
    )


def _run_pull(args: argparse.Namespace) -> int:
    from dpcomm.costmodel import resolve_network
    from dpcomm.planner.pull import ibatch_margin, plan_pulls
    from dpcomm.sim.ps import PsCost, ps_inputs

    if args.pull is None:
        raise UserError("--ps-servers and --pull-slowdown need --pull METHOD")
    if args.topology:
        raise UserError("--pull plans are priced from --network, not --topology")
    args.network = args.network if args.network is not None else "10gbe"
    if args.ps_servers < 0:
        raise UserError(f"--ps-servers must be >= 1, got {args.ps_servers}")
    if args.nodes is None:
        raise UserError("--nodes N is needed")
    nodes = parse_nodes(args.nodes)
    if len(nodes) != 1:
        raise UserError(f"--nodes takes one node count for plan, got {args.nodes!r}")
    trace = load_trace_arg(args.trace)
    cost = PsCost(net=resolve_network(args.network), workers=nodes[0], servers=args.ps_servers)
    C, Tt, Ts = ps_inputs(trace, cost)
    margin = ibatch_margin(nodes[0], args.ps_servers)
    plan = plan_pulls(C, Tt, Ts, args.pull, slowdown=args.pull_slowdown, margin=margin)
    if args.json:
        print(
            json.dumps(
                {
                    **plan.to_dict(),
                    "nodes": nodes[0],
                    "servers": args.ps_servers,
                    "time_s": plan.time_s,
                    "startup_s": Ts,
                    "slowdown": args.pull_slowdown,
                    "sha256": plan.sha256(),
                }
            )
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    where = f"{args.ps_servers} dedicated server(s)" if args.ps_servers else "co-located servers"
    table = Table(
        title=f"{plan.method} pulls: {trace.model}, {nodes[0]} workers, {where}, {plan.messages} pull(s)"
    )
    for col in ("#", "layers", "first .. last layer", "MB", "pull ms (Ts + Tt)", "forward ms"):
        table.add_column(col, justify="left" if col.startswith("first") else "right")
    for k, (a, b) in enumerate(plan.batches):
        mb = sum(trace.layer_bytes(l) for l in range(a, b + 1)) / 2**20
        names = trace.layers[a].name if a == b else f"{trace.layers[a].name} .. {trace.layers[b].name}"
        table.add_row(
            str(k),
            f"{a}" if a == b else f"{a}-{b}",
            names,
            f"{mb:.2f}",
            f"{(Ts + Tt[a : b + 1].sum()) * 1e3:.3f}",
            f"{C[a : b + 1].sum() * 1e3:.3f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"model time (pulls and forward, F_N) {plan.time_s * 1e3:.3f} ms; "
        f"forward alone {C.sum() * 1e3:.3f} ms, "
        f"pulls alone {(plan.messages * Ts + Tt.sum()) * 1e3:.3f} ms; Ts {Ts * 1e6:.1f} us"
        + (f"; forward {1 + args.pull_slowdown:g}x slower while pulling" if args.pull_slowdown else "")
    )
    if "candidates_s" in plan.meta:  # ibatch: which candidate it kept, and what the others would take
        times = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in plan.meta["candidates_s"].items())
        console.print(
            f"kept {plan.meta['algorithm']} of: {times} (a greedy plan only if more than "
            f"{plan.meta.get('margin', 0):.0%} faster than the better of all and layer, or as fast in "
            "fewer pulls)"
        )
    return 0
