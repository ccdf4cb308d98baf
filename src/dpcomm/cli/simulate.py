"""Simulate a trace over node counts and schedules: t_iter, speedup, efficiency, and optional pictures.

Example: ``dpcomm simulate --trace resnet50.json --nodes 4,8,16,32,64 --network 10gbe
--schedules wfbp,single,mgwfbp,optimal --plot scaling.png --timeline timeline.png --chrome-trace out.json``.
Timelines and the Chrome trace show every schedule at the largest node count (or ``--timeline-nodes``).
Parameter-server schedules ``ps-all``, ``ps-layer``, ``ps-ibatch``, ``ps-optimal`` (pull methods of the iBatch
paper; :mod:`dpcomm.sim.ps`) sit next to the all-reduce ones: ``--schedules mgwfbp,ps-all,ps-ibatch``.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpcomm.cli._costargs import add_cost_arguments, check_update, cost_for, load_trace_arg, parse_nodes
from dpcomm.errors import UserError

COMMAND = "simulate"
HELP = "simulate schedules over node counts (table, scaling plot, timeline, Chrome trace)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", default="4,8,16,32,64", metavar="N,N,..", help="node counts (default 4..64)"
    )
    parser.add_argument(
        "--schedules", default="wfbp,single,mgwfbp,optimal", metavar="S,S,..", help="schedules to compare"
    )
    add_cost_arguments(parser)
    parser.add_argument(
        "--topology",
        metavar="T",
        help="price each all-reduce by the flow model on star:N, fattree:k, bcube:n,k, "
        "leafspine:L,H,R or gpus:S,G,... / dgx-h100:S (nodes = GPUs; alpha from --network; docs/netsim.md)",
    )
    parser.add_argument(
        "--rate", default="10gbit", help="link rate per direction with --topology (default 10gbit)"
    )
    parser.add_argument("--mtu", default="1500", help="MTU of the TCP overhead with --topology; 0: none")
    parser.add_argument("--plot", metavar="PNG", help="write speedup vs nodes per schedule")
    parser.add_argument("--timeline", metavar="PNG", help="write a Gantt chart of one iteration per schedule")
    parser.add_argument("--chrome-trace", metavar="JSON", help="write a Chrome/Perfetto trace of the same")
    parser.add_argument("--timeline-nodes", type=int, metavar="N", help="node count drawn (default: largest)")
    parser.add_argument(
        "--ps-servers",
        type=int,
        default=0,
        metavar="S",
        help="ps-* schedules: S dedicated servers (default: co-located)",
    )
    parser.add_argument(
        "--ps-push", default="wfbp", metavar="P", help="ps-* schedules: push grouping (default wfbp)"
    )


def run(args: argparse.Namespace) -> int:
    from dpcomm.planner import parse_schedules
    from dpcomm.sim import sweep
    from dpcomm.sim.ps import is_ps_schedule
    from dpcomm.utils.io import check_figure_path, check_output_path

    for fig in (args.plot, args.timeline):
        if fig is not None:
            check_figure_path(fig, make_folders=False)
    if args.chrome_trace is not None:
        check_output_path(args.chrome_trace, make_folders=False)
    nodes_list = parse_nodes(args.nodes)
    named = [s.strip() for s in str(args.schedules).split(",") if s.strip()]
    ps_schedules = [s for s in named if is_ps_schedule(s)]
    schedules = (
        parse_schedules(",".join(s for s in named if not is_ps_schedule(s)))
        if len(ps_schedules) < len(named)
        else []
    )
    update_s = check_update(args.update_s)
    shown = args.timeline_nodes if args.timeline_nodes is not None else max(nodes_list)
    if shown not in nodes_list:
        raise UserError(f"--timeline-nodes {shown} is not one of --nodes {args.nodes}")
    trace = load_trace_arg(args.trace)
    if args.topology:
        from dpcomm.cli.netsim import flow_cost_for

        cost = flow_cost_for(args, max(nodes_list))
    else:
        cost = cost_for(args)
    rows = sweep(trace, cost, nodes_list, schedules, update_s=update_s) if schedules else []
    if ps_schedules:
        rows = _with_ps(rows, trace, args, nodes_list, ps_schedules, named)
    written = []
    if args.plot:
        from dpcomm.sim.scaling import plot_scaling

        written.append(plot_scaling(rows, args.plot, title=f"{trace.model} (batch {trace.batch_size})"))
    picked = [r.result for r in rows if r.nodes == shown]
    if args.timeline:
        from dpcomm.sim.timeline import plot_timeline

        written.append(plot_timeline(picked, args.timeline, title=f"{trace.model}, N={shown}"))
    if args.chrome_trace:
        from dpcomm.sim.chrome import write_chrome_trace

        written.append(write_chrome_trace(picked, args.chrome_trace))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows]))
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    _print(trace, rows, written)
    return 0


def _print(trace, rows, written) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{trace.model} (batch {trace.batch_size}, {trace.device}): "
        f"t_f + t_b = {(rows[0].result.t_f_s + rows[0].result.t_b_s) * 1e3:.2f} ms"
    )
    for col in ("nodes", "schedule", "groups", "t_iter ms", "exposed comm ms", "speedup", "efficiency"):
        table.add_column(col, justify="left" if col == "schedule" else "right")
    last = None
    for r in rows:
        if last is not None and r.nodes != last:
            table.add_section()
        last = r.nodes
        table.add_row(
            str(r.nodes),
            r.schedule,
            str(len(r.plan.groups)),
            f"{r.t_iter_s * 1e3:.2f}",
            f"{r.t_comm_exposed_s * 1e3:.2f}",
            f"{r.speedup:.2f}",
            f"{r.efficiency:.1%}",
        )
    console = Console()
    console.print(table)
    for path in written:
        console.print(f"wrote {path}")


def _with_ps(rows, trace, args, nodes_list, ps_schedules, named):
    """Add the parameter-server rows, keeping nodes-major order and the order the schedules were named in."""
    from dpcomm.costmodel import resolve_network
    from dpcomm.sim.ps import ps_sweep

    if args.linear_cost:
        raise UserError("ps-* schedules are priced from --network (alpha, beta, gamma), not --linear-cost")
    if args.ps_servers < 0:
        raise UserError(f"--ps-servers must be >= 1, got {args.ps_servers}")
    net = resolve_network(args.network)
    ps_rows = ps_sweep(trace, net, nodes_list, ps_schedules, servers=args.ps_servers, push=args.ps_push)
    order = {s.lower(): i for i, s in enumerate(named)}
    both = rows + ps_rows
    return sorted(both, key=lambda r: (nodes_list.index(r.nodes), order.get(r.schedule.lower(), len(order))))
