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
    "cost_algorithm",
    "cost_for",
    "load_trace_arg",
    "parse_linear_cost",
    "parse_nodes",
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


_FLOW_ONLY = ("hierarchical", "nccl", "nccl-ring", "nccl-tree", "nccl-nvls", "nccl-nvlstree", "nccl-collnet")
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
