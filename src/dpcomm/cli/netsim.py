"""Simulate allreduce on a topology with the flow model: time, algbw, busbw as ``dpcomm bench`` prints them.

Example: ``dpcomm netsim --topology fattree:16 --algorithms ring,be,ps --sizes 1M,64M --rate 10gbit
--plot links.png``. Topologies: ``star:N``, ``fattree:k``, ``bcube:n,k`` (``bml`` needs it),
``leafspine:L,H,R`` (R: oversubscription). Every server runs one rank. Sizes are read as ``dpcomm bench``
reads them (K/M/G are powers of 1024) and are float32 bytes. ``--mtu 0`` prices an ideal network (no
headers, no ACKs); the default 1500 gives TCP's 95.6% / 93.6% ceilings. ``--plot`` draws each algorithm's
link utilisation at the largest size. Algorithm names are the registry's (``dpcomm bench``'s): ``bml`` and
``bcube`` are one algorithm, ``native`` is scheduled as ring, ``ps-dedicated[:S]`` is ``ps`` on S
dedicated servers.

On servers of several GPUs (``gpus:S,G,...``, ``dgx-h100:S``: ranks are GPUs) the header counts servers and
GPUs; ``nccl`` is NCCL's own choice of algorithm and protocol (``nccl-ring``, ``nccl-tree``, ``nccl-nvls``,
``nccl-nvlstree``, ``nccl-collnet`` (= ``nccl-collnet-direct``), ``nccl-collnet-chain`` force one,
``:LL``/``:LL128``/``:Simple`` the protocol), and the
start-up is NCCL's latency model for the fabric's transport unless ``--alpha-us`` gives one (elsewhere:
TCP's 45.26 us). Such a fabric's NICs have their rate in the spec (a preset's, or ``nic=``): ``--rate``
then is an error, as is ``--mtu`` (no TCP framing on it); ``--rate`` sets a ``gpus:`` spec's NICs that
have none.

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

__all__ = ["fabric_for", "flow_cost_for", "network_startup", "tcp_note"]

COMMAND = "netsim"
HELP = "flow-level simulation of allreduce on star, fattree, bcube, leafspine and multi-GPU (NCCL) clusters"

from dpcomm.topology.gpu_presets import preset_names  # noqa: E402 - plain data, no torch

_PRESETS = preset_names()
_MAX_ALPHA_US = 1e6  # a start-up of 1 s: beyond any network
_MAX_MTU = 65_535  # IPv4's largest packet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology",
        required=True,
        metavar="T",
        help="star:N, fattree:k, bcube:n,k, leafspine:L,H,R, gpus:S,G,... or a preset of S servers: "
        + _PRESETS,
    )
    parser.add_argument(
        "--algorithms",
        default=None,
        metavar="A,A,..",
        help="ring, be, mst, lp, ps, ps-dedicated[:S], bcube (alias bml), native; on gpus:/dgx-*: "
        "hierarchical, nccl (NCCL's choice), nccl-ring, nccl-tree, nccl-nvls, nccl-nvlstree, nccl-collnet "
        "(= nccl-collnet-direct), nccl-collnet-chain, each [:LL|LL128|Simple] (default ring,be,mst,lp,ps; "
        "nccl on gpus:/dgx-*)",
    )
    parser.add_argument("--sizes", default="1M,16M,64M", help="bytes, K/M/G suffixes (default 1M,16M,64M)")
    parser.add_argument(
        "--rate",
        default=None,
        help="server link rate per direction (default 10gbit; gpus:/dgx-*: the spec's)",
    )
    parser.add_argument(
        "--alpha-us",
        default=None,
        metavar="US",
        help="start-up per message, us (default 45.26, TCP's; gpus:/dgx-*: NCCL's latency model)",
    )
    parser.add_argument(
        "--mtu", default=None, help="MTU for header/ACK overhead; 0: ideal (default 1500; not on gpus:/dgx-*)"
    )
    parser.add_argument(
        "--block-bytes", metavar="B", help="LP block, K/M suffixes (default: the cost model's optimum)"
    )
    parser.add_argument(
        "--network",
        metavar="FILE",
        help="a network file: its start-up (and, fitted by calibrate --from-nccl-tests, its fabric's rates)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="apply a --network file fitted on other hardware or another NCCL/plugin version anyway",
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


def fabric_for(args: argparse.Namespace, net=None):
    """The fabric of ``--topology`` with ``--rate`` and ``--mtu`` (netsim's and simulate's): on a multi-GPU
    spec that sets its NICs' rate, ``--rate`` is a one-line error, and ``--mtu`` is one on any multi-GPU
    spec (no TCP framing); nothing given is silently dropped. ``net``: a network whose file carries a
    fitted fabric (``dpcomm calibrate --from-nccl-tests``) puts its achievable fractions on a multi-GPU
    topology (:func:`dpcomm.sim.network.fit.apply_fit`)."""
    from dpcomm.sim.network import Goodput, make_fabric, parse_fabric_topology
    from dpcomm.testbed.config import parse_rate
    from dpcomm.topology import MultiGPU

    topo = parse_fabric_topology(args.topology)
    if net is not None and net.fabric and isinstance(topo, MultiGPU):
        from dpcomm.sim.network.fit import apply_fit

        where = f"--network {getattr(args, 'network', None) or 'file'}"
        topo = apply_fit(topo, net.fabric, force=bool(getattr(args, "force", False)), where=where)
    if isinstance(topo, MultiGPU):
        if args.rate is not None and topo.nic_bps is not None:
            raise UserError(
                f"--rate {args.rate}: {args.topology} sets its NICs' rate ({topo.nic_bps / 1e9:g}gbit); "
                f"give it in the spec instead ({args.topology},nic={args.rate})"
            )
        if args.mtu is not None:
            raise UserError(
                f"--mtu {args.mtu}: {args.topology} carries no TCP framing (its NICs move the transport's "
                "achievable fraction: nic_eff=, transport=)"
            )
    rate = parse_rate(args.rate if args.rate is not None else "10gbit")
    mtu = int(_number("--mtu", args.mtu if args.mtu is not None else "1500", int, _MAX_MTU))
    return make_fabric(topo, rate, Goodput(mtu=mtu))


def tcp_note(fabric, alpha_s: float, what: str) -> str | None:
    """A one-line note when a TCP start-up (``what``) prices an InfiniBand or RoCE fabric (None otherwise)."""
    from dpcomm.sim.network.pricing import TCP_ALPHA_S
    from dpcomm.topology import MultiGPU

    t = fabric.topology
    if isinstance(t, MultiGPU) and t.transport in ("ib", "roce") and alpha_s >= TCP_ALPHA_S / 2:
        return (
            f"note: {what} is a TCP start-up ({alpha_s * 1e6:g} us per message) on an {t.link.name} fabric "
            f"({t.link.key}); leave it out for NCCL's latencies"
        )
    return None


def network_startup(net, fabric) -> float | None:
    """The start-up per message a network gives a fabric: a fitted file's own on the server count it was
    fitted on (None where it kept NCCL's latency model, and on other counts:
    :func:`dpcomm.sim.network.fit_apply.scope`), else the network's alpha."""
    from dpcomm.topology import MultiGPU

    if net.fabric and isinstance(fabric.topology, MultiGPU):
        from dpcomm.sim.network.fit_apply import startup

        return startup(fabric.topology, net.fabric)
    return net.alpha


def flow_cost_for(args: argparse.Namespace, most_nodes: int, alpha_s: float | None, net=None):
    """``nodes -> CommCost`` by the flow model for ``dpcomm simulate --topology T``: the ``--algo`` all-reduce
    on the first ``nodes`` servers of T; ``alpha_s`` per message (None: the fabric's own start-up); ``net``
    a network whose fitted fabric applies (:func:`fabric_for`)."""
    from dpcomm.sim.network.pricing import default_model, flow_cost_factory

    if args.linear_cost:
        raise UserError("--linear-cost and --topology are two different costs: give one")
    fabric = fabric_for(args, net)
    if most_nodes > fabric.servers:
        raise UserError(
            f"--nodes {most_nodes} does not fit on the {fabric.servers} servers of {args.topology}"
        )
    model = default_model(fabric, alpha_s)
    return flow_cost_factory(fabric, args.algo, model=model), model


def run(args: argparse.Namespace) -> int:
    from dpcomm.sim.network import simulate_allreduce
    from dpcomm.sim.network.algorithms import MAX_BYTES, check_allreduce, parse_algorithm
    from dpcomm.sim.network.pricing import default_model
    from dpcomm.topology import MultiGPU
    from dpcomm.utils.io import check_figure_path
    from dpcomm.utils.sizes import parse_size, parse_sizes

    if args.plot is not None:
        check_figure_path(args.plot, make_folders=False)  # before the simulation, not after it
    alpha = None if args.alpha_us is None else _number("--alpha-us", args.alpha_us) * 1e-6
    block = None
    if args.block_bytes is not None:
        block = parse_size(args.block_bytes, what="--block-bytes", minimum=1, maximum=MAX_BYTES)
    sizes = parse_sizes(args.sizes, what="--sizes", minimum=4, maximum=MAX_BYTES)  # at least one float32
    net = None
    if args.network is not None:
        from dpcomm.costmodel import resolve_network

        net = resolve_network(args.network)
    fabric = fabric_for(args, net)  # at most MAX_SERVERS, checked first
    if net is not None and alpha is None:
        alpha = network_startup(net, fabric)
    multi = isinstance(fabric.topology, MultiGPU)
    chosen = args.algorithms if args.algorithms is not None else ("nccl" if multi else "ring,be,mst,lp,ps")
    algos = [a.strip() for a in chosen.split(",") if a.strip()]
    if not algos:
        raise UserError("--algorithms: give at least one")
    for a in algos:
        parse_algorithm(a)
    if block is not None and not any(parse_algorithm(a)[0] == "lp" for a in algos):
        raise UserError(
            f"--block-bytes {args.block_bytes} sets LP's block, and lp is not among the algorithms"
        )
    model = default_model(fabric, alpha)
    for a in algos:  # every case's flows are bounded before the first is simulated
        for s in sizes:
            check_allreduce(a, fabric, s, model.alpha_s, block)
    note = (
        tcp_note(fabric, alpha, "--alpha-us" if args.alpha_us else f"--network {args.network}")
        if alpha
        else None
    )
    if note:
        print(note, file=sys.stderr)
    from rich.progress import Progress

    from dpcomm.sim.network.memory import tune_memory

    tune_memory()  # large schedules: reuse freed memory instead of faulting it in again (no result changes)
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
    _print(fabric, rows, written, wall, model, args.topology)
    return 0


def _print(fabric, rows, written, wall: float, model, spec: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from dpcomm.cli.bench import _time
    from dpcomm.sim.network.pricing import startup_text
    from dpcomm.testbed.config import format_rate
    from dpcomm.topology import MultiGPU

    width = None if sys.stdout.isatty() else 120
    out = Console(soft_wrap=True, width=width)
    g, t = fabric.goodput, fabric.topology
    if isinstance(t, MultiGPU):
        what = f"{spec.strip()}: {t.describe(fabric.rate_bps)}, {startup_text(model)}"
    else:
        what = (
            f"{t.spec}: {fabric.servers} servers, {format_rate(int(fabric.rate_bps))} links, "
            f"{startup_text(model)}, goodput {g.one_way:.1%} one way / {g.duplex:.1%} duplex"
        )
    table = Table(title=f"dpcomm netsim, {what}")
    ran = any(r.ran for r in rows)
    cols = ("op", "algo", *(("ran",) if ran else ()), "bytes", "time", "algbw GB/s", "busbw GB/s", "steps")
    for col in cols:
        table.add_column(col, justify="left" if col in ("op", "algo", "ran") else "right")
    for r in rows:
        table.add_row(
            "allreduce",
            r.algorithm if not r.asked else f"{r.algorithm} (asked {r.asked})",
            *((r.ran,) if ran else ()),
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
