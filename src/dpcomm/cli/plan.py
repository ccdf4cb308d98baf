"""Plan which layers' gradients are all-reduced together, and show the plan's simulated timing.

Example: ``dpcomm plan --trace resnet50.json --nodes 16 --network 10gbe --schedule mgwfbp``.
"""

from __future__ import annotations

import argparse
import json

from dpcomm.cli._costargs import add_cost_arguments, check_update, cost_for, load_trace_arg, parse_nodes
from dpcomm.errors import UserError

COMMAND = "plan"
HELP = "plan gradient groups for a trace (wfbp, single, bucket:SIZE, mgwfbp, optimal)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", required=True, metavar="N", help="number of nodes (data-parallel workers)")
    parser.add_argument(
        "--schedule", default="mgwfbp", metavar="S", help="wfbp, single, bucket:SIZE, mgwfbp or optimal"
    )
    add_cost_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from dpcomm.planner import make_plan
    from dpcomm.sim import simulate

    nodes = parse_nodes(args.nodes)
    if len(nodes) != 1:
        raise UserError(f"--nodes takes one node count for plan, got {args.nodes!r}")
    nodes = nodes[0]
    update_s = check_update(args.update_s)
    trace = load_trace_arg(args.trace)
    cost = cost_for(args)(nodes)
    plan = make_plan(args.schedule, trace, cost, nodes)
    res = simulate(trace, plan, cost, nodes, update_s=update_s)
    if args.json:
        out = {
            "schedule": plan.schedule,
            "nodes": nodes,
            "groups": [list(g) for g in plan.groups],
            "t_iter_s": res.t_iter_s,
            "t_comm_exposed_s": res.t_comm_exposed_s,
            "planning_s": plan.meta["planning_s"],
        }
        print(json.dumps(out))
        return 0
    _print(trace, plan, res, cost)
    return 0


def _print(trace, plan, res, cost) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{plan.schedule} plan: {trace.model}, N={res.nodes}, {len(plan.groups)} group(s)")
    for col in ("#", "layers", "first .. last layer", "MB", "ready ms", "start ms", "end ms"):
        table.add_column(col, justify="left" if col.startswith("first") else "right")
    comm = {ev.group: ev for ev in res.comm}
    for k, g in enumerate(plan.groups):
        ev = comm.get(k)
        span = f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}"
        names = (
            trace.layers[g[0]].name
            if len(g) == 1
            else f"{trace.layers[g[-1]].name} .. {trace.layers[g[0]].name}"
        )
        mb = sum(trace.layer_bytes(l) for l in g) / 2**20
        times = [f"{t * 1e3:.2f}" for t in (ev.ready_s, ev.start_s, ev.end_s)] if ev else ["-", "-", "-"]
        table.add_row(str(k), span, names, f"{mb:.2f}", *times)
    console = Console()
    console.print(table)
    console.print(
        f"t_f {res.t_f_s * 1e3:.2f} ms, t_b {res.t_b_s * 1e3:.2f} ms, t_iter {res.t_iter_s * 1e3:.2f} ms, "
        f"exposed communication {res.t_comm_exposed_s * 1e3:.2f} ms, speedup {res.speedup:.2f} "
        f"(efficiency {res.efficiency:.1%}); cost {cost}; planned in {plan.meta['planning_s'] * 1e3:.2f} ms"
    )
