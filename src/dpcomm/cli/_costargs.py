"""Arguments ``dpcomm plan`` and ``dpcomm simulate`` share: the trace, the network or a linear cost, lists."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

from dpcomm.costmodel import ALGORITHMS, LinearCost, resolve_network
from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.registry import describe, resolve
from dpcomm.trace import Trace, find_trace, load_trace

__all__ = [
    "add_cost_arguments",
    "add_fsdp_arguments",
    "add_topology_arguments",
    "costs_of",
    "fsdp_costs_of",
    "fsdp_options",
    "cost_algorithm",
    "cost_for",
    "load_trace_arg",
    "parse_linear_cost",
    "parse_nodes",
    "priced_by",
]


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", required=True, metavar="T", help="trace JSON file (or a shipped trace name)"
    )
    parser.add_argument(
        "--network",
        default="10gbe",
        metavar="NET",
        help="network preset or network JSON file (default 10gbe)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --topology: apply a --network file fitted on other hardware or NCCL/plugin version anyway",
    )
    parser.add_argument(
        "--algo",
        default="ring",
        type=cost_algorithm,
        help=f"all-reduce algorithm costed: {describe(list(ALGORITHMS))} (default ring)",
    )
    parser.add_argument(
        "--linear-cost",
        metavar="A,B",
        help="override the all-reduce cost with T_ar(M) = A + B*M (seconds, seconds per byte)",
    )
    parser.add_argument(
        "--update-s", type=float, default=0.0, metavar="S", help="model-update time after the last all-reduce"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


_FLOW_ONLY = (
    "hierarchical",
    "nccl",
    "nccl-ring",
    "nccl-tree",
    "nccl-nvls",
    "nccl-nvlstree",
    "nccl-collnet",
    "nccl-collnet-direct",
    "nccl-collnet-chain",
)
"""dpcomm.sim.network.algorithms' multi-GPU schedules (``nccl*`` with an optional ``:PROTOCOL``)."""


def cost_algorithm(text: str) -> str:
    """``--algo``'s reader: a priced algorithm's canonical name (an alias such as ``bml`` gives ``bcube``),
    or a multi-GPU flow schedule (priced with ``--topology`` only; the flow model checks a protocol)."""
    base = text.strip().partition(":")[0].strip()
    if text.strip() in _FLOW_ONLY or (base in _FLOW_ONLY and base.startswith("nccl")):
        return text.strip()
    canonical = resolve(text.strip())
    if canonical is None or canonical not in ALGORITHMS:
        raise argparse.ArgumentTypeError(
            f"unknown algorithm {text!r} (choose from {describe(list(ALGORITHMS))})"
        )
    return canonical


def load_trace_arg(spec: str) -> Trace:
    """A trace file, or a trace shipped with dpcomm (``dpcomm.trace.find_trace``) when no such file exists."""
    if os.path.exists(spec) or spec.endswith(".json"):
        return load_trace(spec)
    return find_trace(spec)


def parse_linear_cost(text: str) -> LinearCost:
    parts = text.split(",")
    try:
        a, b = (float(p) for p in parts)
    except ValueError:
        raise UserError(f"--linear-cost must be A,B (seconds, seconds per byte), got {text!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b < 0:
        raise UserError(f"--linear-cost needs finite A >= 0 and B >= 0, got {text!r}")
    return LinearCost(a, b)


def parse_nodes(text: str) -> list[int]:
    """``"4,8,16"`` -> ``[4, 8, 16]``; each an integer from 1 to :data:`dpcomm.topology.MAX_SERVERS`
    (16,384, the most servers a topology may have: a larger count only multiplies ``N - 1`` terms into
    times and speedups no cluster of this kind has)."""
    from dpcomm.topology import MAX_SERVERS

    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or not part.strip("0"):
            shown = text if len(str(text)) <= 60 else f"{str(text)[:57]}..."
            raise UserError(f"--nodes must be integers >= 1 separated by commas, got {shown!r}")
        if len(part.lstrip("0")) > 9 or int(part) > MAX_SERVERS:  # 9 digits: int() of thousands is slow
            shown = part if len(part) <= 30 else f"{part[:27]}..."
            raise UserError(f"--nodes: {shown} is more than the {MAX_SERVERS:,} nodes dpcomm handles")
        out.append(int(part))
    return out


def cost_for(args: argparse.Namespace) -> Callable[[int], CommCost]:
    """``nodes -> CommCost``: the fixed ``--linear-cost`` for every N, else the network's all-reduce."""
    if args.linear_cost:
        fixed = parse_linear_cost(args.linear_cost)
        return lambda nodes: fixed
    from dpcomm.sim.sweep import cost_factory

    if str(args.algo).partition(":")[0] in _FLOW_ONLY:
        raise UserError(f"--algo {args.algo} is a flow schedule of servers of several GPUs: give --topology")
    return cost_factory(resolve_network(args.network), args.algo)


def check_update(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise UserError(f"--update-s must be a finite number >= 0, got {value!r}")
    return value


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """``--topology``, ``--rate``, ``--mtu``; ``--network`` and ``--algo`` default to None (not given: 10gbe
    and ring, except on a topology: the fabric's start-up, and nccl on servers of several GPUs)."""
    parser.set_defaults(network=None, algo=None)
    parser.add_argument(
        "--topology",
        metavar="T",
        help="price each collective by the flow model on star:N, fattree:k, bcube:n,k, "
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


def costs_of(args: argparse.Namespace, most_nodes: int):
    """``(nodes -> CommCost, flow model or None)``: the all-reduce of ``--topology`` (the flow model, for
    up to ``most_nodes`` ranks), else of ``--network``/``--linear-cost`` (:func:`cost_for`)."""
    if getattr(args, "topology", None):
        return _flow_cost(args, most_nodes)
    args.network = args.network if args.network is not None else "10gbe"
    args.algo = args.algo if args.algo is not None else "ring"
    return cost_for(args), None


def fsdp_costs_of(args: argparse.Namespace, model):
    """``(nodes -> MeshCosts, nodes -> shard group sizes)`` for FSDP and HSDP (:mod:`dpcomm.sim.fsdp_costs`)
    on the flow model ``model`` of :func:`costs_of`, or on ``--network`` where there is none."""
    from dpcomm.sim.fsdp_costs import flow_mesh_costs, network_mesh_costs, shard_choices

    if args.linear_cost:
        raise UserError("FSDP and HSDP are priced from --network or --topology, not --linear-cost")
    if model is not None:
        return (lambda n: flow_mesh_costs(model, n, args.algo)), (lambda n: shard_choices(model, n))
    if str(args.algo).partition(":")[0] in _FLOW_ONLY:
        raise UserError(f"--algo {args.algo} is a flow schedule of servers of several GPUs: give --topology")
    net = resolve_network(args.network)
    return (lambda n: network_mesh_costs(net, n, args.algo)), (lambda n: shard_choices(None, n))


def _flow_cost(args: argparse.Namespace, most_nodes: int):
    """``(nodes -> CommCost, flow model)`` of ``--topology``: ``--algo`` (default ``nccl`` on servers of
    several GPUs, else ``ring``), the start-up of ``--network`` (default: the fabric's own; a TCP one on an
    InfiniBand fabric gets a one-line note)."""
    import sys

    from dpcomm.cli.netsim import fabric_for, flow_cost_for, network_startup, tcp_note
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


def priced_by(args: argparse.Namespace, model, what: str = "all-reduce") -> str:
    """A header's line on what prices the collectives: the network, or the topology's fabric."""
    if model is None:
        return f"{what} {args.algo} on {args.network}"
    from dpcomm.sim.network.pricing import startup_text
    from dpcomm.topology import MultiGPU

    t = model.fabric.topology
    fabric = t.describe(model.fabric.rate_bps) if isinstance(t, MultiGPU) else f"{t.servers} servers"
    return f"{what} {args.algo} on {args.topology.strip()} ({fabric}), {startup_text(model)}"


def add_fsdp_arguments(parser: argparse.ArgumentParser) -> None:
    """What FSDP and HSDP plans take besides their costs: the budget, the sharded state, the search."""
    parser.add_argument(
        "--memory",
        metavar="BYTES",
        help="FSDP/HSDP: budget per rank of unsharded parameter bytes (plus --state-bytes over the shard "
        "group), K/M/G = 2^10/2^20/2^30 (default: none)",
    )
    parser.add_argument(
        "--state-bytes",
        default="0",
        metavar="BYTES",
        help="FSDP/HSDP: parameters, gradients and optimizer state of the whole model, sharded over the "
        "shard group and counted in --memory (e.g. 16 bytes a parameter for Adam with fp32 master "
        "weights; default 0: unsharded parameters only)",
    )
    parser.add_argument(
        "--max-depth",
        type=int,
        default=2,
        metavar="D",
        help="FSDP/HSDP: deepest prefetch searched (default 2)",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.005,
        metavar="F",
        help="FSDP/HSDP optimal: within this fraction of a certified lower bound (default 0.005; 0: exact)",
    )
    parser.add_argument(
        "--overlap",
        default="streams",
        choices=("streams", "gathers"),
        help="FSDP/HSDP model: streams (GPUs, the default) or gathers (CPU: reduce-scatters block)",
    )
    parser.add_argument(
        "--unit-cost",
        type=float,
        default=None,
        metavar="SECONDS",
        help="FSDP/HSDP: FSDP2's fixed cost of a unit per pass, seconds (hooks and copies; default: "
        "dpcomm.planner.fsdp_unit's measured one for --overlap: streams a GPU's, gathers a CPU's)",
    )
    parser.add_argument(
        "--param-dtype",
        metavar="DTYPE",
        help="FSDP/HSDP: FSDP2's MixedPrecisionPolicy param_dtype (bf16, fp16, fp32): units gathered and "
        "held in it (default: the trace's dtype)",
    )
    parser.add_argument(
        "--reduce-dtype",
        metavar="DTYPE",
        help="FSDP/HSDP: the policy's reduce_dtype: gradients reduce-scattered (and HSDP all-reduced) in it "
        "(default: --param-dtype)",
    )


def fsdp_options(args: argparse.Namespace) -> dict:
    """:func:`dpcomm.sim.fsdp.plan_row`'s options from :func:`add_fsdp_arguments`' flags, checked
    (``precision``: ``--param-dtype``/``--reduce-dtype`` as FSDP2's mixed-precision policy)."""
    from dpcomm.planner.fsdp_precision import Precision
    from dpcomm.planner.fsdp_unit import unit_s_for
    from dpcomm.utils.sizes import parse_size

    memory = None if args.memory is None else parse_size(args.memory, what="--memory")
    state = parse_size(args.state_bytes, what="--state-bytes")
    if args.max_depth < 0 or args.max_depth > 16:
        raise UserError(f"--max-depth must be an integer from 0 to 16, got {args.max_depth}")
    if not (0 <= args.gap <= 1):
        raise UserError(f"--gap must be a fraction from 0 to 1, got {args.gap!r}")
    unit_s = args.unit_cost
    if unit_s is None:
        unit_s = unit_s_for("cuda" if args.overlap == "streams" else "cpu")
    elif not (0 <= unit_s < float("inf")):
        raise UserError(f"--unit-cost must be a number of seconds >= 0, got {args.unit_cost!r}")
    return {
        "memory": memory,
        "state_bytes": float(state),
        "update_s": check_update(args.update_s),
        "max_depth": args.max_depth,
        "gap": float(args.gap),
        "overlap": args.overlap,
        "precision": Precision(param_dtype=args.param_dtype, reduce_dtype=args.reduce_dtype),
        "unit_s": float(unit_s),
    }
