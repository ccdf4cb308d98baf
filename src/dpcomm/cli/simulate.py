"""Simulate a trace over node counts and schedules: t_iter, speedup, efficiency, and optional pictures.

Example: ``dpcomm simulate --trace resnet50.json --nodes 4,8,16,32,64 --network 10gbe
--schedules wfbp,single,mgwfbp,optimal --plot scaling.png --timeline timeline.png --chrome-trace out.json``.
Timelines and the Chrome trace show every schedule at the largest node count (or ``--timeline-nodes``).
Parameter-server schedules ``ps-all``, ``ps-layer``, ``ps-ibatch``, ``ps-optimal`` (pull methods of the iBatch
paper; :mod:`dpcomm.sim.ps`) sit next to the all-reduce ones: ``--schedules mgwfbp,ps-all,ps-ibatch``;
``ddp`` is PyTorch DDP's own buckets (1 MiB first, then 25 MiB, in backward order); ``dear`` is DeAR's
schedule (each group reduce-scattered in backward, all-gathered in the next forward; :mod:`dpcomm.sim.dear`).
Under the table a line gives, per node count, the limits no all-reduce plan (``F + max(B, C)``) and no
``dear`` plan (``max(F, AG) + max(B, RS)``) beats (:func:`dpcomm.planner.dear.limits`; ``--json``: each such
row's own as ``limit_s``).

With ``--topology`` each all-reduce is priced by the flow model on that fabric (docs/netsim.md); on servers
of several GPUs (``dgx-h100:S``, ``gpus:S,G,...``; ``--nodes`` counts GPUs) the all-reduce is NCCL's own
choice (``--algo nccl``) and its start-up NCCL's latencies unless ``--network`` gives one (a TCP one on an
InfiniBand fabric is noted), and the ``ps-*`` schedules pay the flow model's price of a byte on that
fabric.

FSDP2 and HSDP schedules sit next to them too (:mod:`dpcomm.sim.fsdp`): ``fsdp:METHOD`` and
``hsdp:METHOD[:G]`` (METHOD ``per-block``, ``whole``, ``per-layer``, ``size:BYTES``, ``optimal``; ``G`` the
shard group, else the planner's choice), planned under ``--memory`` per rank over the runs of layers one
``fully_shard`` call takes whole (as ``plan --fsdp``, :mod:`dpcomm.cli._fsdp_atoms`) and priced on the same
network or topology (:mod:`dpcomm.sim.fsdp_costs`); the table then has a memory column.
``dpcomm simulate --trace tinyllama-1.1b-h200bf16-b4 --topology dgx-h100:4 --nodes 32
--schedules ddp,fsdp:optimal,hsdp:optimal --memory 1G``.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpcomm.cli._costargs import (
    add_cost_arguments,
    add_fsdp_arguments,
    add_topology_arguments,
    check_update,
    costs_of,
    fsdp_costs_of,
    fsdp_options,
    load_trace_arg,
    parse_nodes,
    priced_by,
)
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
    add_topology_arguments(parser)
    add_fsdp_arguments(parser)
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
    from dpcomm.sim.fsdp import fsdp_sweep, is_fsdp_schedule, parse_fsdp_schedule
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
    fsdp_schedules = [s for s in named if is_fsdp_schedule(s)]
    others = [s for s in named if not (is_ps_schedule(s) or is_fsdp_schedule(s))]
    schedules = parse_schedules(",".join(others)) if others else []
    for s in fsdp_schedules:
        parse_fsdp_schedule(s)
    if (args.param_dtype or args.reduce_dtype) and not fsdp_schedules:
        raise UserError("--param-dtype/--reduce-dtype are FSDP2's mixed precision: name an fsdp: or hsdp: "
                        "schedule")  # fmt: skip
    fsdp = fsdp_options(args) if fsdp_schedules else None
    update_s = check_update(args.update_s)
    shown = args.timeline_nodes if args.timeline_nodes is not None else max(nodes_list)
    if shown not in nodes_list:
        raise UserError(f"--timeline-nodes {shown} is not one of --nodes {args.nodes}")
    trace = load_trace_arg(args.trace)
    cost, model = costs_of(args, max(nodes_list))
    rows = sweep(trace, cost, nodes_list, schedules, update_s=update_s) if schedules else []
    limit = _limits(trace, cost, rows, update_s)  # before the ps-* rows: SweepRows too, without a limit
    priced = {id(r) for r in rows}  # the all-reduce and dear rows (each alive in rows: its id its own)
    if ps_schedules:
        rows += _ps_rows(trace, args, nodes_list, ps_schedules, model)
    if fsdp_schedules:
        from dpcomm.cli._fsdp_atoms import planned_on

        costs_for, shards_for = fsdp_costs_of(args, model)
        on = planned_on(trace)[0]  # as plan --fsdp and shard: no unit splits a fully_shard call's module
        rows += fsdp_sweep(on, costs_for, nodes_list, fsdp_schedules, shards_for=shards_for, **fsdp)
    if ps_schedules or fsdp_schedules:  # nodes-major, in the order the schedules were named
        order = {s.lower(): i for i, s in enumerate(named)}
        rows.sort(key=lambda r: (nodes_list.index(r.nodes), order.get(r.schedule.lower(), len(order))))
    written = []
    if args.plot:
        from dpcomm.sim.scaling import plot_scaling

        written.append(plot_scaling(rows, args.plot, title=f"{trace.model} (batch {trace.batch_size})"))
    picked = [r.result for r in rows if r.nodes == shown and hasattr(r, "result")]  # FSDP rows: no timeline
    if args.timeline:
        from dpcomm.sim.timeline import plot_timeline

        written.append(plot_timeline(picked, args.timeline, title=f"{trace.model}, N={shown}"))
    if args.chrome_trace:
        from dpcomm.sim.chrome import write_chrome_trace

        written.append(write_chrome_trace(picked, args.chrome_trace))
    if args.json:
        print(
            json.dumps(
                [r.to_dict() | ({"limit_s": _limit(limit, r)} if id(r) in priced else {}) for r in rows]
            )
        )
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    where = priced_by(args, model)
    if fsdp_schedules:
        where += "; FSDP/HSDP all-gather and reduce-scatter: half a ring all-reduce (docs/fsdp.md)"
        if not fsdp["precision"].plain:
            where += f"; FSDP2 mixed precision: {fsdp['precision']}"
    if any(r.plan.sharded for r in rows if hasattr(r, "result")):
        where += "; dear: each half (reduce-scatter, all-gather) half an all-reduce"
    _print(trace, rows, written, where, state_bytes=fsdp["state_bytes"] if fsdp else None)
    if limit:  # a line, not a column: the table fills 80 columns already
        at = [f"N={n} all-reduce {lim['allreduce'] * 1e3:.2f} ms, dear {lim['dear'] * 1e3:.2f} ms"
              for n, lim in sorted(limit.items())]  # fmt: skip
        print("limits, no plan of the schedule beats them (all-reduce plans F + max(B, C), dear max(F, AG) + "
              f"max(B, RS)): {'; '.join(at)}")  # fmt: skip
    return 0


def _limits(trace, cost, rows, update_s: float) -> dict[int, dict[str, float]]:
    """Per node count of the all-reduce and ``dear`` rows, the least ``t_iter`` of any all-reduce plan and of
    any ``dear`` plan (:func:`dpcomm.planner.dear.limits`)."""
    from dpcomm.planner.dear import limits

    return {n: limits(trace, cost(n), n, update_s) for n in {r.nodes for r in rows}}


def _limit(limit: dict[int, dict[str, float]], row) -> float:
    """The limit of ``row``'s kind of plan at its node count."""
    return limit[row.nodes]["dear" if row.plan.sharded else "allreduce"]


def _print(trace, rows, written, where: str, state_bytes: float | None = None) -> None:
    """The table; with FSDP/HSDP rows (``state_bytes`` not None) a memory column: per rank, unsharded
    parameters at the peak plus sharded state (DDP: every parameter and the whole state; ps-*: -)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{trace.model} (batch {trace.batch_size}, {trace.device}): "
        f"t_f + t_b = {(trace.t_f + trace.t_b) * 1e3:.2f} ms",
        caption=where,
    )
    cols = ["nodes", "schedule", "groups", "t_iter ms", "exposed comm ms", "speedup", "efficiency"]
    if state_bytes is not None:
        cols.append("memory MiB")
    for col in cols:
        table.add_column(col, justify="left" if col == "schedule" else "right")
    total = sum(trace.layer_bytes(i) for i in range(trace.num_layers))
    last = None
    for r in rows:
        if last is not None and r.nodes != last:
            table.add_section()
        last = r.nodes
        units = getattr(r.plan, "units", None)
        cells = [
            str(r.nodes),
            r.schedule,
            str(len(units if units is not None else r.plan.groups)),
            f"{r.t_iter_s * 1e3:.2f}",
            f"{r.t_comm_exposed_s * 1e3:.2f}",
            f"{r.speedup:.2f}",
            f"{r.efficiency:.1%}",
        ]
        if state_bytes is not None:
            memory = getattr(r, "memory_bytes", None)
            if memory is None and hasattr(r, "result"):  # DDP-style: every parameter, the whole state
                memory = total + state_bytes
            cells.append("-" if memory is None else f"{memory / 2**20:.1f}")
        table.add_row(*cells)
    console = Console()
    console.print(table)
    for path in written:
        console.print(f"wrote {path}")


def _ps_rows(trace, args, nodes_list, ps_schedules, model=None):
    """The parameter-server rows. With a topology (``model``) a byte costs what the flow model's
    co-located parameter server on it costs (:func:`_ps_network`)."""
    from dpcomm.costmodel import resolve_network
    from dpcomm.sim.ps import ps_sweep

    if args.linear_cost:
        raise UserError("ps-* schedules are priced from --network (alpha, beta, gamma), not --linear-cost")
    if args.ps_servers < 0:
        raise UserError(f"--ps-servers must be >= 1, got {args.ps_servers}")
    net = resolve_network(args.network) if model is None else _ps_network(model)
    return ps_sweep(trace, net, nodes_list, ps_schedules, servers=args.ps_servers, push=args.ps_push)


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
