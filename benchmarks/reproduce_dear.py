"""DeAR's experiment shapes by simulation (Zhang, Shi, Chu et al., ICDCS 2023, arXiv 2302.12445).

    .venv/bin/python benchmarks/reproduce_dear.py [--trace NAME ...] [--net NAME ...] [--nodes 8 16 ...]
                                                  [--md PATH]

DeAR's runs (lzhangbv/dear_pytorch, ``benchmarks.py`` and ``configs/``): ResNet-50 (batch 64), DenseNet-201
(32), Inception-v4 (64), BERT-Base (64) and BERT-Large (32), FP32, on 16 hosts of 4 GPUs (64 workers; the
script's commented-out list is 8, 16, 32, 64), over 10 GbE and over 100 Gb/s InfiniBand. Here: the shipped
traces closest to those models (:data:`TRACES` says which and how they differ), ring all-reduce on the
``10gbe`` and ``100gb-ib`` network presets, 8 to 64 workers, and these plans, each simulated
(:func:`dpcomm.sim.simulate`):

- ``ddp``: PyTorch DDP's buckets (:func:`dpcomm.demo_sim.ddp_plan`), ``wfbp``, ``mgwfbp``, ``optimal``
  (the exact all-reduce optimum), all all-reduced in backward;
- ``dear``: dpcomm's exact DeAR plan (:func:`dpcomm.planner.dear.plan_dear`), reduce-scattered in backward,
  all-gathered in the next forward;
- ``dear-25MB`` and ``dear-layer``: DeAR's own groupings run the same way: its default tensor fusion
  (``dear/dopt_rsag.py``: layers in forward order added to a buffer while it stays under 25 MB) and its
  "w/o TF" runs (one group per layer).

Prints the command, the machine, a table of iteration times with both limits (``F + max(B, C)`` for every
all-reduce plan, ``max(F, AG) + max(B, RS)`` for every DeAR plan), a table of ``dear``'s speedups, and the
same tables in Markdown (also written to ``--md``). Nothing is fitted. Exits 1 if a check that holds by
construction fails (:func:`checks`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dpcomm.costmodel import PRESETS, allreduce_cost
from dpcomm.demo_sim import ddp_plan
from dpcomm.plan import Plan
from dpcomm.planner import make_plan
from dpcomm.planner.dear import limits
from dpcomm.sim import simulate
from dpcomm.trace.format import Trace
from dpcomm.trace.shipped import find_trace

TRACES: dict[str, tuple[str, str]] = {
    "resnet50-k80-b32": ("ResNet-50, b64", "analytic K80 (slower GPU), batch 32"),
    "resnet50-h100-b32": ("ResNet-50, b64", "measured H100 (faster GPU), batch 32"),
    "inception-v3-h100-b32": ("Inception-v4, b64", "Inception-v3, measured H100, batch 32"),
    "bert-base-h200bf16-b32": ("BERT-Base, b64 x 64 tokens", "measured H200 bf16, 32 x 512 tokens"),
}
"""Shipped trace -> (DeAR's model and batch, how the trace differs). DenseNet-201 and BERT-Large: none."""
NETS = ("10gbe", "100gb-ib")
NODES = (8, 16, 32, 64)
ALLREDUCE = ("ddp", "wfbp", "mgwfbp", "optimal")
DEAR = ("dear", "dear-25MB", "dear-layer")
SCHEDULES = ALLREDUCE + DEAR
DEAR_BUFFER_MB = 25.0
"""DeAR's default fusion buffer (``THRESHOLD = 25`` in ``dear/dopt_rsag.py``, in MB of 2**20 bytes)."""
PAPER = {"10gbe": 0.83, "100gb-ib": 0.15}
"""The abstract's "up to 83% and 15% training speedup over the state-of-the-art solutions on a 64-GPU
cluster with 10Gb/s Ethernet and 100Gb/s InfiniBand". The per-model numbers were not found (see the page)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One shape: a trace on a network with ``nodes`` workers; times in seconds."""

    trace: str
    net: str
    nodes: int
    compute_s: float
    """``F + B``: the iteration without communication."""
    t: dict[str, float]
    """Schedule -> simulated iteration time."""
    groups: dict[str, int]
    limit_allreduce_s: float
    """``F + max(B, C)``: no all-reduce plan is faster."""
    limit_dear_s: float
    """``max(F, AG) + max(B, RS)``: no DeAR plan is faster."""
    comm_s: dict[str, float]
    """Schedule -> seconds of communication (every event's duration summed)."""
    plan_s: float
    """Seconds spent planning ``dear`` (the exact planner)."""

    def speedup(self, base: str, of: str = "dear") -> float:
        """``t[base] / t[of]``: how many times faster ``of`` runs than ``base``."""
        return self.t[base] / self.t[of]


def dear_fusion_plan(trace: Trace, buffer_mb: float = DEAR_BUFFER_MB) -> Plan:
    """DeAR's default tensor fusion as a ``dear`` plan: layers in forward order join the current group while
    its bytes plus theirs stay under ``buffer_mb`` MB (an empty group takes any layer), as
    ``_generate_groups_with_threshold`` does in ``dear/dopt_rsag.py``."""
    sizes, current, total = [], 0, 0.0
    for layer in trace.layers:
        mb = layer.params * trace.dtype_bytes / 2**20
        if current == 0 or total + mb < buffer_mb:
            current, total = current + 1, total + mb
        else:
            sizes.append(current)
            current, total = 1, mb
    sizes.append(current)
    return Plan.from_sizes("dear", sizes[::-1], trace.num_layers)  # from_sizes takes backward order


def dear_layer_plan(trace: Trace) -> Plan:
    """DeAR without tensor fusion (``THRESHOLD=None, NUM_NEARBY_LAYERS=1``): one group per layer."""
    return Plan.from_sizes("dear", [1] * trace.num_layers, trace.num_layers)


def plan_for(schedule: str, trace: Trace, cost, nodes: int) -> Plan:
    if schedule == "ddp":
        return ddp_plan(trace, cost, nodes)
    if schedule == "dear-25MB":
        return dear_fusion_plan(trace)
    if schedule == "dear-layer":
        return dear_layer_plan(trace)
    return make_plan(schedule, trace, cost, nodes)


def simulate_shape(trace_name: str, net: str, nodes: int) -> Row:
    """Every schedule of :data:`SCHEDULES` on one shape."""
    trace = find_trace(trace_name)
    cost = allreduce_cost(PRESETS[net], nodes, "ring")
    t, groups, comm, plan_s = {}, {}, {}, 0.0
    for s in SCHEDULES:
        t0 = time.perf_counter()
        plan = plan_for(s, trace, cost, nodes)
        if s == "dear":
            plan_s = time.perf_counter() - t0
        res = simulate(trace, plan, cost, nodes)
        t[s], groups[s] = res.t_iter_s, len(plan.groups)
        comm[s] = sum(ev.end_s - ev.start_s for ev in res.comm)
    lim = limits(trace, cost, nodes)
    return Row(trace=trace_name, net=net, nodes=nodes, compute_s=trace.t_f + trace.t_b, t=t, groups=groups,
               limit_allreduce_s=lim["allreduce"], limit_dear_s=lim["dear"], comm_s=comm,
               plan_s=plan_s)  # fmt: skip


def rows(traces=tuple(TRACES), nets=NETS, nodes=NODES) -> list[Row]:
    """One :class:`Row` per (trace, network, node count), in that order."""
    return [simulate_shape(tr, net, n) for tr in traces for net in nets for n in nodes]


def checks(rs: list[Row], rel: float = 1e-9) -> tuple[dict[str, bool], dict[str, bool]]:
    """``(by construction, shown by the model)``: every entry of the first must be True on any shapes; the
    second holds on the shipped shapes but is no theorem. ``dear <= optimal`` fails where the forward is too
    short to hide the gathers that backward would have hidden (the page gives a case), and DeAR's limit is
    above the all-reduce one where ``2F < C < 2(B - F)``."""
    ok = lambda a, b: a <= b * (1 + rel)  # noqa: E731
    every = lambda pred: all(pred(r) for r in rs)  # noqa: E731
    construction = {
        "every all-reduce plan >= F + max(B, C)": every(
            lambda r: all(ok(r.limit_allreduce_s, r.t[s]) for s in ALLREDUCE)
        ),
        "every DeAR plan >= max(F, AG) + max(B, RS)": every(
            lambda r: all(ok(r.limit_dear_s, r.t[s]) for s in DEAR)
        ),
        "optimal <= ddp, wfbp, mgwfbp": every(lambda r: all(ok(r.t["optimal"], r.t[s]) for s in ALLREDUCE)),
        "dear <= dear-25MB, dear-layer (exact over contiguous groups)": every(
            lambda r: all(ok(r.t["dear"], r.t[s]) for s in DEAR)
        ),
        "dear-layer moves what wfbp moves (two halves = one all-reduce)": every(
            lambda r: abs(r.comm_s["dear-layer"] - r.comm_s["wfbp"]) <= rel * r.comm_s["wfbp"]
        ),
    }
    model = {
        "dear <= optimal": every(lambda r: ok(r.t["dear"], r.t["optimal"])),
        "DeAR's limit <= the all-reduce limit": every(lambda r: ok(r.limit_dear_s, r.limit_allreduce_s)),
    }
    return construction, model


def _pct(x: float) -> str:
    """``x - 1`` as a signed percentage; a tie within rounding prints ``+0.0%``, not ``-0.0%``."""
    d = x - 1
    return f"{0.0 if abs(d) < 5e-4 else d:+.1%}"


def time_table(rs: list[Row]) -> tuple[list[str], list[list[str]]]:
    head = ["trace", "network", "N", "F+B ms", "DDP", "WFBP", "MG-WFBP", "optimal", "dear (groups)",
            "dear-25MB", "dear-layer", "F+max(B,C)", "max(F,AG)+max(B,RS)"]  # fmt: skip
    body = []
    for r in rs:
        ms = {s: f"{r.t[s] * 1e3:.1f}" for s in SCHEDULES}
        ms["dear"] += f" ({r.groups['dear']})"
        body.append([r.trace, r.net, str(r.nodes), f"{r.compute_s * 1e3:.1f}"] + [ms[s] for s in SCHEDULES]
                    + [f"{r.limit_allreduce_s * 1e3:.1f}", f"{r.limit_dear_s * 1e3:.1f}"])  # fmt: skip
    return head, body


def speedup_table(rs: list[Row]) -> tuple[list[str], list[list[str]]]:
    head = ["trace", "network", "N", "dear vs DDP", "vs WFBP", "vs MG-WFBP", "vs optimal",
            "dear-25MB vs DDP", "dear-25MB vs MG-WFBP", "dear-layer vs WFBP", "limit ratio"]  # fmt: skip
    body = []
    for r in rs:
        fused = [r.speedup("ddp", "dear-25MB"), r.speedup("mgwfbp", "dear-25MB")]
        ours = fused + [r.speedup("wfbp", "dear-layer")]
        body.append([r.trace, r.net, str(r.nodes)] + [_pct(r.speedup(b)) for b in ALLREDUCE]
                    + [_pct(x) for x in ours] + [_pct(r.limit_allreduce_s / r.limit_dear_s)])  # fmt: skip
    return head, body


def headline(rs: list[Row], nodes: int = 64) -> tuple[list[str], list[list[str]]]:
    """Per network, the largest speedups at ``nodes`` workers over the shapes, next to the abstract's."""
    head = ["network", f"N = {nodes}: dear vs DDP / MG-WFBP", "dear-25MB vs DDP / MG-WFBP",
            "dear-layer vs WFBP", "dear vs optimal", "DeAR's abstract ('up to')"]  # fmt: skip
    body = []
    for net in sorted({r.net for r in rs}, key=list(NETS).index):
        sel = [r for r in rs if r.net == net and r.nodes == nodes]
        if not sel:
            continue

        def best(base, of="dear", sel=sel):
            r = max(sel, key=lambda r: r.speedup(base, of))
            return f"{_pct(r.speedup(base, of))} ({r.trace})"

        body.append([net, f"{best('ddp')} / {best('mgwfbp')}",
                     f"{best('ddp', 'dear-25MB')} / {best('mgwfbp', 'dear-25MB')}",
                     best("wfbp", "dear-layer"), best("optimal"), f"+{PAPER[net]:.0%}"])  # fmt: skip
    return head, body


def markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    return (f"machine: {cpu}, {os.cpu_count()} CPU cores, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, dpcomm {version('dpcomm')}, "
            f"{datetime.date.today().isoformat()}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", help="shipped trace, repeatable (default: TRACES)")
    parser.add_argument("--net", action="append", choices=list(PRESETS), help="network preset (default both)")
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODES), help="worker counts")
    parser.add_argument("--md", type=Path, help="also write the Markdown tables here")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    command = " ".join([os.path.relpath(sys.executable), os.path.relpath(sys.argv[0])] + sys.argv[1:])
    print(command)
    print(machine())
    for name in args.trace or TRACES:
        model, how = TRACES.get(name, ("-", "not one of DeAR's models"))
        print(f"trace {name}: for DeAR's {model}; {how}")
    t0 = time.perf_counter()
    rs = rows(tuple(args.trace or TRACES), tuple(args.net or NETS), tuple(args.nodes))
    took = time.perf_counter() - t0
    tables = [("Iteration time, ms (simulated; dear: dpcomm's exact DeAR plan)", time_table(rs)),
              ("dear's speedup (t_baseline / t_dear - 1); limit ratio = (F+max(B,C)) / (max(F,AG)+max(B,RS))",
               speedup_table(rs))]  # fmt: skip
    if max(args.nodes) == 64:
        tables.append(("Largest speedups at 64 workers, next to DeAR's abstract", headline(rs)))
    md = []
    for title, (head, body) in tables:
        table = Table(title=title)
        for i, h in enumerate(head):
            table.add_column(h, justify="left" if i < 2 else "right")
        per = len(args.nodes)
        for i, row in enumerate(body):
            table.add_row(*row, end_section=per > 1 and i % per == per - 1)
        console.print(table)
        md.append(f"**{title}**\n\n{markdown(head, body)}\n")
    text = "\n".join(md)
    print("\n" + text)
    if args.md:
        args.md.write_text(f"{command}\n\n{machine()}\n\n{text}")
        print(f"wrote {args.md}")
    construction, model = checks(rs)
    for kind, result in (("by construction", construction), ("the model, these shapes", model)):
        for name, good in result.items():
            print(f"check ({kind}): {name}: {'yes' if good else 'NO'}")
    slow = max(rs, key=lambda r: r.plan_s)
    print(f"{len(rs)} shapes in {took:.1f} s; planning dear took {sum(r.plan_s for r in rs):.1f} s of it "
          f"(longest: {slow.trace} on {slow.net}, N = {slow.nodes}: {slow.plan_s:.1f} s)")  # fmt: skip
    return 0 if all(construction.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
