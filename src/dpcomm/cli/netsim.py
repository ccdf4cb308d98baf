"""Simulate allreduce on a topology with the flow model: time, algbw, busbw as ``dpcomm bench`` prints them.

Example: ``dpcomm netsim --topology fattree:16 --algorithms ring,be,ps --sizes 1M,64M --rate 10gbit
--plot links.png``. Topologies: ``star:N``, ``fattree:k``, ``bcube:n,k`` (``bml`` needs it),
``leafspine:L,H,R`` (R: oversubscription). Every server runs one rank. Sizes are read as ``dpcomm bench``
reads them (K/M/G are powers of 1024) and are float32 bytes. ``--mtu 0`` prices an ideal network (no
headers, no ACKs); the default 1500 gives TCP's 95.6% / 93.6% ceilings. ``--plot`` draws each algorithm's
link utilisation at the largest size. Algorithm names are the registry's (``dpcomm bench``'s): ``bml`` and
``bcube`` are one algorithm, ``native`` is scheduled as ring, ``ps-dedicated[:S]`` is ``ps`` on S
dedicated servers.

Limits, checked before anything is built: at most 16,384 servers (``dpcomm.topology.MAX_SERVERS``),
sizes of 4 B to 1 PiB, 20 M flows in one step and 200 M over one allreduce
(``dpcomm.sim.network.algorithms``), LP at most 65,536 blocks (a smaller ``--block-bytes`` is raised),
``--alpha-us`` up to 1 s, ``--mtu`` up to 65,535.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from dpcomm.errors import UserError

COMMAND = "netsim"
HELP = "flow-level simulation of ring/be/mst/lp/ps/bcube (bml) allreduce on star, fattree, bcube, leafspine"

_MAX_ALPHA_US = 1e6  # a start-up of 1 s: beyond any network
_MAX_MTU = 65_535  # IPv4's largest packet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology",
        required=True,
        metavar="T",
        help="star:N, fattree:k, bcube:n,k, leafspine:L,H,R, gpus:S,G,... or dgx-h100:S / dgx-a100:S",
    )
    parser.add_argument(
        "--algorithms",
        default="ring,be,mst,lp,ps",
        metavar="A,A,..",
        help="ring, be, mst, lp, ps, ps-dedicated[:S], bcube (alias bml), native; on gpus:/dgx-*: "
        "hierarchical, nccl-ring, nccl-tree (default ring,be,mst,lp,ps)",
    )
    parser.add_argument("--sizes", default="1M,16M,64M", help="bytes, K/M/G suffixes (default 1M,16M,64M)")
    parser.add_argument("--rate", default="10gbit", help="server link rate per direction (default 10gbit)")
    parser.add_argument(
        "--alpha-us", default="45.26", metavar="US", help="start-up per message, us (default 45.26)"
    )
    parser.add_argument("--mtu", default="1500", help="MTU for header/ACK overhead; 0: ideal (default 1500)")
    parser.add_argument(
        "--block-bytes", metavar="B", help="LP block, K/M suffixes (default: the cost model's optimum)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument("--plot", metavar="PNG", help="write link utilisation per algorithm (largest size)")


def _number(flag: str, text: str, kind=float, most: float = _MAX_ALPHA_US) -> float:
    shown = str(text) if len(str(text)) <= 40 else f"{str(text)[:37]}..."
    if not re.fullmatch(r"\s*\d{1,12}(\.\d{1,12})?\s*", str(text)) or (kind is int and "." in str(text)):
        raise UserError(f"{flag} must be a number from 0 to {most:g}, got {shown!r}")
    value = kind(text)
    if value > most:
        raise UserError(f"{flag} must be a number from 0 to {most:g}, got {shown!r}")
    return value


def flow_cost_for(args: argparse.Namespace, most_nodes: int):
    """``nodes -> CommCost`` by the flow model for ``dpcomm simulate --topology T --rate R --mtu M``: the
    ``--algo`` all-reduce on the first ``nodes`` servers of T, alpha from ``--network``."""
    from dpcomm.costmodel import resolve_network
    from dpcomm.sim.network import Goodput, make_fabric
    from dpcomm.sim.network.pricing import flow_cost_factory
    from dpcomm.testbed.config import parse_rate

    if args.linear_cost:
        raise UserError("--linear-cost and --topology are two different costs: give one")
    fabric = make_fabric(
        args.topology, parse_rate(args.rate), Goodput(mtu=int(_number("--mtu", args.mtu, int, _MAX_MTU)))
    )
    if most_nodes > fabric.servers:
        raise UserError(
            f"--nodes {most_nodes} does not fit on the {fabric.servers} servers of {args.topology}"
        )
    return flow_cost_factory(fabric, args.algo, resolve_network(args.network).alpha)


def run(args: argparse.Namespace) -> int:
    from dpcomm.sim.network import FlowModel, Goodput, make_fabric, simulate_allreduce
    from dpcomm.sim.network.algorithms import MAX_BYTES, check_allreduce, parse_algorithm
    from dpcomm.testbed.config import parse_rate
    from dpcomm.utils.io import check_figure_path
    from dpcomm.utils.sizes import parse_size, parse_sizes

    if args.plot is not None:
        check_figure_path(args.plot, make_folders=False)  # before the simulation, not after it
    rate = parse_rate(args.rate)
    mtu = int(_number("--mtu", args.mtu, int, _MAX_MTU))
    alpha = _number("--alpha-us", args.alpha_us) * 1e-6
    block = None
    if args.block_bytes is not None:
        block = parse_size(args.block_bytes, what="--block-bytes", minimum=1, maximum=MAX_BYTES)
    sizes = parse_sizes(args.sizes, what="--sizes", minimum=4, maximum=MAX_BYTES)  # at least one float32
    algos = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algos:
        raise UserError("--algorithms: give at least one")
    for a in algos:
        parse_algorithm(a)
    fabric = make_fabric(args.topology, rate, Goodput(mtu=mtu))  # at most MAX_SERVERS, checked first
    for a in algos:  # every case's flows are bounded before the first is simulated
        for s in sizes:
            check_allreduce(a, fabric, s, alpha, block)
    from rich.progress import Progress

    model = FlowModel(fabric, alpha_s=alpha)
    rows, runs = [], []
    t0 = time.perf_counter()
    with Progress(transient=True, disable=args.json or not sys.stderr.isatty()) as bar:
        task = bar.add_task(f"{fabric.topology.spec}", total=len(algos) * len(sizes))
        for a in algos:
            for s in sizes:
                bar.update(task, description=f"{fabric.topology.spec}: {a}, {s:,} bytes")
                want_links = bool(args.plot) and s == max(sizes)
                row, flow_run = simulate_allreduce(model, a, s, block_bytes=block, links=want_links)
                rows.append(row)
                if want_links:
                    runs.append((a, flow_run))
                bar.advance(task)
    wall = time.perf_counter() - t0
    written = []
    if args.plot:
        from dpcomm.sim.network.plot import plot_links

        written.append(plot_links(fabric, runs, args.plot))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows]))
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    _print(fabric, rows, written, wall, alpha)
    return 0


def _print(fabric, rows, written, wall: float, alpha: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from dpcomm.cli.bench import _time
    from dpcomm.testbed.config import format_rate

    width = None if sys.stdout.isatty() else 120
    out = Console(soft_wrap=True, width=width)
    g = fabric.goodput
    table = Table(
        title=f"dpcomm netsim, {fabric.topology.spec}: {fabric.servers} servers, "
        f"{format_rate(int(fabric.rate_bps))} links, alpha {alpha * 1e6:g} us, "
        f"goodput {g.one_way:.1%} one way / {g.duplex:.1%} duplex"
    )
    for col in ("op", "algo", "bytes", "time", "algbw GB/s", "busbw GB/s", "steps"):
        table.add_column(col, justify="left" if col in ("op", "algo") else "right")
    for r in rows:
        table.add_row(
            "allreduce",
            r.algorithm,
            f"{r.bytes:,}",
            _time(r.time_s),
            f"{r.algbw_GBps:.3f}",
            f"{r.busbw_GBps:.3f}",
            str(r.steps),
        )
    out.print(table)
    out.print(f"simulated in {wall:.2f} s", highlight=False)
    for path in written:
        out.print(f"wrote {path}")
