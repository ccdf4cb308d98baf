"""Simulate a trace over node counts and schedules: t_iter, speedup, efficiency, and optional pictures.

Example: ``dpcomm simulate --trace resnet50.json --nodes 4,8,16,32,64 --network 10gbe
--schedules wfbp,single,mgwfbp,optimal --plot scaling.png --timeline timeline.png --chrome-trace out.json``.
Timelines and the Chrome trace show every schedule at the largest node count (or ``--timeline-nodes``).
Parameter-server schedules ``ps-all``, ``ps-layer``, ``ps-ibatch``, ``ps-optimal`` (pull methods of the iBatch
paper; :mod:`dpcomm.sim.ps`) sit next to the all-reduce ones: ``--schedules mgwfbp,ps-all,ps-ibatch``;
``ddp`` is PyTorch DDP's own buckets (1 MiB first, then 25 MiB, in backward order).

With ``--topology`` each all-reduce is priced by the flow model on that fabric (docs/netsim.md); on servers
of several GPUs (``dgx-h100:S``, ``gpus:S,G,...``; ``--nodes`` counts GPUs) the all-reduce is NCCL's own
choice (``--algo nccl``) and its start-up NCCL's latencies unless ``--network`` gives one (a TCP one on an
InfiniBand fabric is noted), and the ``ps-*`` schedules pay the flow model's price of a byte on that
fabric.
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
    # None: not given (10gbe and ring, except on servers of several GPUs: the fabric's start-up and nccl)
    parser.set_defaults(network=None, algo=None)
    parser.add_argument(
        "--topology",
        metavar="T",
        help="price each all-reduce by the flow model on star:N, fattree:k, bcube:n,k, "
        "leafspine:L,H,R or gpus:S,G,... / dgx-h100:S (nodes = GPUs; alpha from --network; docs/netsim.md)",
    )
    parser.add_argument(
        "--rate",
        default=None,
        help="link rate per direction with --topology (default 10gbit; gpus: its nic=)",
    )
    parser.add_argument(
        "--mtu", default=None, help="MTU of the TCP overhead with --topology (default 1500); 0: none"
    )
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
    model = None
    if args.topology:
        cost, model = _flow_cost(args, max(nodes_list))
    else:
        args.network = args.network if args.network is not None else "10gbe"
        args.algo = args.algo if args.algo is not None else "ring"
        cost = cost_for(args)
    rows = sweep(trace, cost, nodes_list, schedules, update_s=update_s) if schedules else []
    if ps_schedules:
        rows = _with_ps(rows, trace, args, nodes_list, ps_schedules, named, model)
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
    _print(trace, rows, written, _where(args, model))
    return 0


def _flow_cost(args: argparse.Namespace, most_nodes: int):
    """``(nodes -> CommCost, flow model)`` of ``--topology``: ``--algo`` (default ``nccl`` on servers of
    several GPUs, else ``ring``), the start-up of ``--network`` (default: the fabric's own; a TCP one on an
    InfiniBand fabric gets a one-line note)."""
    from dpcomm.cli.netsim import fabric_for, flow_cost_for, network_startup, tcp_note
    from dpcomm.costmodel import resolve_network
    from dpcomm.topology import MultiGPU

    net = resolve_network(args.network) if args.network is not None else None
    fabric = fabric_for(args, net)
    multi = isinstance(fabric.topology, MultiGPU)
    if args.algo is None:
        args.algo = "nccl" if multi else "ring"
    alpha = None
    if net is not None:
        alpha = network_startup(net, fabric)
    elif not multi:
        alpha = resolve_network("10gbe").alpha
    cost, model = flow_cost_for(args, most_nodes, alpha, net)
    note = tcp_note(model.fabric, alpha, f"--network {args.network}") if alpha is not None and net else None
    if note:
        print(note, file=sys.stderr)
    return cost, model


def _where(args: argparse.Namespace, model) -> str:
    """The header's line on what prices the all-reduce: the network, or the topology's fabric."""
    if model is None:
        return f"all-reduce {args.algo} on {args.network}"
    from dpcomm.sim.network.pricing import startup_text
    from dpcomm.topology import MultiGPU

    t = model.fabric.topology
    fabric = t.describe(model.fabric.rate_bps) if isinstance(t, MultiGPU) else f"{t.servers} servers"
    return f"all-reduce {args.algo} on {args.topology.strip()} ({fabric}), {startup_text(model)}"


def _print(trace, rows, written, where: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{trace.model} (batch {trace.batch_size}, {trace.device}): "
        f"t_f + t_b = {(rows[0].result.t_f_s + rows[0].result.t_b_s) * 1e3:.2f} ms",
        caption=where,
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


def _with_ps(rows, trace, args, nodes_list, ps_schedules, named, model=None):
    """Add the parameter-server rows, keeping nodes-major order and the order the schedules were named in.
    With a topology (``model``) a byte costs what the flow model's co-located parameter server on it costs
    (:func:`_ps_network`)."""
    from dpcomm.costmodel import resolve_network
    from dpcomm.sim.ps import ps_sweep

    if args.linear_cost:
        raise UserError("ps-* schedules are priced from --network (alpha, beta, gamma), not --linear-cost")
    if args.ps_servers < 0:
        raise UserError(f"--ps-servers must be >= 1, got {args.ps_servers}")
    net = resolve_network(args.network) if model is None else _ps_network(model)
    ps_rows = ps_sweep(trace, net, nodes_list, ps_schedules, servers=args.ps_servers, push=args.ps_push)
    order = {s.lower(): i for i, s in enumerate(named)}
    both = rows + ps_rows
    return sorted(both, key=lambda r: (nodes_list.index(r.nodes), order.get(r.schedule.lower(), len(order))))


def _ps_network(model):
    """``nodes -> Network`` for the ``ps-*`` schedules on a topology: alpha the start-up of a message between
    servers (the model's), beta the slope of the flow model's co-located parameter-server all-reduce on the
    first ``nodes`` ranks (push and pull, ``2 (W-1)/W beta`` per byte) over ``2 (W-1)/W``: what a byte costs
    a worker there, sharing its NIC with the other GPUs of its server."""
    from dpcomm.costmodel import Network
    from dpcomm.sim.network.pricing import FlowCost

    alpha = model.alpha_inter_s if model.alpha_inter_s is not None else model.alpha_s

    def net(nodes: int) -> Network:
        beta = 0.0
        if nodes > 1:
            beta = FlowCost(model=model, algo="ps", ranks=nodes).line()[1] / (2 * (nodes - 1) / nodes)
        return Network(name=f"{model.fabric.topology.spec} (flow model)", alpha=alpha, beta=beta)

    return net
