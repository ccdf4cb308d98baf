"""``dpcomm plan --fsdp METHOD``: FSDP2 (or HSDP) units for a trace on the user's cluster, and the code.

Example: ``dpcomm plan --trace tinyllama-1.1b-h200bf16-b4 --topology dgx-h100:4 --fsdp optimal
--memory 512M --hsdp auto --plot front.png``. Prints the units by module name with their all-gather,
reduce-scatter (and HSDP all-reduce) times, the prefetch depth, the reshard choice, the model's ``t_iter``
and peak, and the ``fully_shard`` calls that apply the plan; ``--plot`` writes the time-memory front of
``optimal`` (at the plan's shard group) with ``per-block`` and ``whole`` as points. Costs come from
:mod:`dpcomm.sim.fsdp_costs` (``--network`` or ``--topology``), the plan from
:func:`dpcomm.sim.fsdp.plan_row`, the same function ``dpcomm simulate``'s ``fsdp:``/``hsdp:`` rows use.

Module paths come from the trace: a layer's ``fsdp_modules`` where ``dpcomm profile`` recorded them (the
modules ``dpcomm.fsdp.shard`` gives its parameters to: a module whose output is a view hands them to the
block around it), else its parameters' modules (a ``dpcomm-trace/2`` unit), lifted to the largest subtree
whose layers are all in the unit (``layers.3`` for its seven linears), never to a container of numbered
children (``layers`` has no forward: its blocks are listed); :mod:`dpcomm.fsdp.groups` does the same from
the model itself. With ``fsdp_modules`` the plan is made over the runs of layers no ``fully_shard`` call
can split (:mod:`dpcomm.cli._fsdp_atoms`), so the code printed is the code ``shard`` runs, units as planned.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from dpcomm.cli._costargs import costs_of, fsdp_costs_of, fsdp_options, load_trace_arg, parse_nodes, priced_by
from dpcomm.cli._fsdp_atoms import holders, planned_on
from dpcomm.cli.plan_export import export_fsdp_plan
from dpcomm.errors import UserError
from dpcomm.trace.format import Trace

__all__ = ["add_plan_fsdp_arguments", "fsdp_code", "module_paths", "run_fsdp", "world_of"]


def add_plan_fsdp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fsdp",
        metavar="METHOD",
        help="plan FSDP2 units instead: per-block, whole, per-layer, size:BYTES or optimal",
    )
    parser.add_argument(
        "--hsdp",
        metavar="G",
        help="with --fsdp: HSDP, shard groups of G ranks replicated across (auto: the planner chooses G)",
    )
    parser.add_argument(
        "--plot", metavar="FILE", help="with --fsdp: write the time-memory front (PNG, SVG, PDF)"
    )


def _layer_modules(trace: Trace) -> list[list[str]]:
    """Module paths per layer: its ``fsdp_modules``, a ``/2`` unit's parameters' modules, else its name."""
    held = holders(trace)
    if held is not None:
        return [list(h) for h in held]
    out = []
    for layer in trace.layers:
        if layer.param_names:
            out.append(list(dict.fromkeys(n.rpartition(".")[0] for n in layer.param_names)))
        else:
            out.append([layer.name])
    return out


def _prefixes(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def module_paths(trace: Trace, units: Sequence[tuple[int, int]]) -> list[list[str]]:
    """Per unit, the module paths one ``fully_shard`` call gets (module docstring); ``[""]``: the root."""
    per_layer = _layer_modules(trace)
    everything = [m for ms in per_layer for m in ms]
    below = Counter(p for m in dict.fromkeys(everything) for p in _prefixes(m))
    children: dict[str, set[str]] = {}
    for m in dict.fromkeys(everything):
        pre = _prefixes(m)
        for parent, child in zip(pre, pre[1:], strict=False):
            children.setdefault(parent, set()).add(child.rpartition(".")[2])
    out = []
    for a, z in units:
        mods = list(dict.fromkeys(m for ms in per_layer[a : z + 1] for m in ms))
        if "" in mods:  # the root's own parameters: the root call, made last, takes what no call took
            out.append([""])
            continue
        mine = Counter(p for m in mods for p in _prefixes(m))
        paths: list[str] = []
        for m in mods:
            for p in _prefixes(m):
                numbered = p and p not in everything and all(c.isdigit() for c in children.get(p, {"x"}))
                if mine[p] == below[p] and not numbered:
                    break
            if not any(p == q or p.startswith(q + ".") or q == "" for q in paths):
                paths.append(p)
        out.append(paths)
    return out


def _short(paths: Sequence[str]) -> str:
    """``layers.0, layers.1, layers.2`` -> ``layers.0-2``: runs of numbered siblings joined."""
    out: list[list] = []
    for p in paths:
        m = re.fullmatch(r"(.*)\.(\d+)", p)
        if m and out and out[-1][0] == m.group(1) and out[-1][2] + 1 == int(m.group(2)):
            out[-1][2] = int(m.group(2))
        elif m:
            out.append([m.group(1), int(m.group(2)), int(m.group(2))])
        else:
            out.append([p or "(root)", None, None])
    return ", ".join(b if lo is None else f"{b}.{lo}" if lo == hi else f"{b}.{lo}-{hi}" for b, lo, hi in out)


def fsdp_code(plan, paths: list[list[str]], world: int) -> str:
    """The ``fully_shard`` calls that apply ``plan`` (as :func:`dpcomm.fsdp.shard.apply_plan` does):
    children first, the root last, the last unit kept unsharded after forward, prefetch ``depth`` units."""
    G = plan.shard_group
    lines = [
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.fsdp import fully_shard",
        "",
    ]
    if G is not None and G < world:
        lines.append(
            f'mesh = init_device_mesh("cuda", ({world // G}, {G}), mesh_dim_names=("replicate", "shard"))'
        )
    else:
        lines.append(f'mesh = init_device_mesh("cuda", ({world},))')
    units = [p for p in paths if p != [""]]
    root_last = paths[-1] == [""]  # the root unit (one that holds every module) is the last: never resharded
    keep = plan.reshard_after_forward
    each = "False" if not keep else "True" if root_last else f"k < {len(units) - 1}"
    root_keep = keep and [""] in paths and not root_last
    lines.append("units = [  # module paths per fully_shard call, forward order")
    lines += [f"    {p!r}," for p in units]
    lines.append("]")
    lines += [
        "handles = []",
        "for k, paths in enumerate(units):",
        "    mods = [model.get_submodule(p) for p in paths]",
        f"    fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh, reshard_after_forward={each})",
        "    handles.append(mods[0])",
        f"fully_shard(model, mesh=mesh, reshard_after_forward={root_keep})",
    ]
    if plan.depth > 0 and len(units) > 1:
        d = plan.depth
        lines += [
            f"for k, h in enumerate(handles):  # prefetch {d} unit(s) ahead in forward and in backward",
            f"    if handles[k + 1 : k + {d + 1}]:",
            f"        h.set_modules_to_forward_prefetch(handles[k + 1 : k + {d + 1}])",
            f"    if handles[max(k - {d}, 0) : k]:",
            f"        h.set_modules_to_backward_prefetch(handles[max(k - {d}, 0) : k][::-1])",
        ]
    return "\n".join(lines)


def run_fsdp(args: argparse.Namespace) -> int:
    from dpcomm.planner.fsdp import FSDP_METHODS, Modules
    from dpcomm.planner.fsdp_precision import scaled_bytes
    from dpcomm.sim.fsdp import parse_fsdp_schedule, plan_row
    from dpcomm.utils.io import check_figure_path

    if args.fsdp is None:
        raise UserError("--hsdp and --plot plan FSDP units: give --fsdp METHOD")
    if args.pull is not None or args.ps_servers or args.pull_slowdown:
        raise UserError("--fsdp plans FSDP units, --pull a parameter server's pulls: give one")
    if args.plot is not None:
        check_figure_path(args.plot, make_folders=False)
    hsdp = None if args.hsdp is None else str(args.hsdp).strip().lower()
    if hsdp is not None and hsdp != "auto" and not (hsdp.isdigit() and len(hsdp) < 10 and int(hsdp) >= 1):
        raise UserError(f"--hsdp takes a shard group size (an integer >= 1) or auto, got {args.hsdp!r}")
    schedule = f"{'hsdp' if hsdp else 'fsdp'}:{args.fsdp.strip()}" + (f":{hsdp}" if hsdp else "")
    try:
        parse_fsdp_schedule(schedule)
    except UserError:
        known = ", ".join(FSDP_METHODS)
        raise UserError(f"unknown --fsdp method {args.fsdp!r}: use one of {known}") from None
    opts = fsdp_options(args)
    trace = load_trace_arg(args.trace)
    world = world_of(args)
    cost_for, model = costs_of(args, world)
    costs_for, shards_for = fsdp_costs_of(args, model)
    costs = costs_for(world)
    on, atoms = planned_on(trace)
    row = plan_row(schedule, on, costs, world, shards=shards_for(world), **opts)
    on_atoms_plan = row.plan
    if atoms is not None:  # the units back in the trace's layers
        units = tuple((atoms[a][0], atoms[z][1]) for a, z in row.plan.units)
        row = replace(row, plan=replace(row.plan, num_modules=trace.num_layers, units=units))
    plan = row.plan
    G = plan.shard_group if plan.shard_group is not None else world
    ag, rs, ar = costs(G)
    mods, k = Modules.from_trace(trace).under(opts["precision"])
    rs, ar = scaled_bytes(rs, k), scaled_bytes(ar, k)  # the reductions in reduce_dtype bytes
    if getattr(args, "export", None):  # dpcomm plan --export deepspeed|torchtitan (cli/plan_export)
        return export_fsdp_plan(args, plan, trace, world, row.t_iter_s)
    paths = module_paths(trace, plan.units)
    written = None
    if args.plot:
        from dpcomm.cli._fsdp_front import plot_front

        written = plot_front(args.plot, on, on_atoms_plan, costs, world, opts)
    v = _verdict(trace, cost_for(world), world, opts, row)
    if args.json:
        print(json.dumps(_json(row, paths, world, opts, written, args, model) | {"verdict": v.to_dict()}))
        return 0
    from dpcomm.cli._verdict import limits_text

    said = [limits_text(trace, cost_for(world), world, opts["update_s"]), v.text()]
    _print(
        trace, row, paths, (ag, rs, ar if G < world else None), world, opts, priced_by(args, model), written,
        mods.param_bytes, said,
    )  # fmt: skip
    return 0


def _verdict(trace, cost, world: int, opts, row):
    """DDP with the ``optimal`` plan and ``dear`` on the all-reduce ``cost`` beside this plan's row
    (:mod:`dpcomm.sim.verdict`); the row is ``FSDP2`` when it is ``fsdp:optimal``, else its schedule."""
    from dpcomm.sim.fsdp import parse_fsdp_schedule
    from dpcomm.sim.verdict import FSDP2, verdict

    name = FSDP2 if parse_fsdp_schedule(row.schedule)[:2] == ("fsdp", "optimal") else row.schedule
    return verdict(trace, cost, world, update_s=opts["update_s"], fsdp=row.t_iter_s, fsdp_name=name)


def world_of(args: argparse.Namespace) -> int:
    """``--nodes``, or every rank of ``--topology`` where it is left out."""
    if args.nodes is None:
        if not getattr(args, "topology", None):
            raise UserError("--nodes N is needed (or --topology, whose ranks it then counts)")
        from dpcomm.sim.network import parse_fabric_topology

        return int(parse_fabric_topology(args.topology).servers)
    nodes = parse_nodes(args.nodes)
    if len(nodes) != 1:
        raise UserError(f"--nodes takes one node count for plan, got {args.nodes!r}")
    return nodes[0]


def _json(row, paths, world, opts, written, args, model) -> dict:
    plan = row.plan
    return {
        **plan.to_dict(),
        "kind": "hsdp" if plan.shard_group is not None else "fsdp",
        "nodes": world,
        "shard_group": plan.shard_group if plan.shard_group is not None else world,
        "modules": paths,
        "t_iter_s": row.t_iter_s,
        "t_comm_exposed_s": row.t_comm_exposed_s,
        "speedup": row.speedup,
        "efficiency": row.efficiency,
        "peak_bytes": plan.peak_bytes,
        "memory_per_rank_bytes": row.memory_bytes,
        "memory_bytes": opts["memory"],
        "state_bytes": opts["state_bytes"],
        "planned_t_iter_s": plan.time_s,
        "fit_error": row.fit_error,
        "lower_bound_s": plan.meta.get("lower_bound_s"),
        "gap": plan.meta.get("gap"),
        "hsdp_times_s": {str(k): v for k, v in plan.meta.get("hsdp", {}).get("times_s", {}).items()},
        "planning_s": row.planning_s,
        "sha256": plan.sha256(),
        "priced_by": priced_by(args, model),
        "plot": None if written is None else str(written),
        "precision": opts["precision"].to_dict(),
        "unit_s": opts["unit_s"],
    }


def _print(trace, row, paths, costs, world, opts, where, written, param_bytes, said=()) -> None:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from dpcomm.planner.fsdp_model import unit_sums

    plan = row.plan
    ag, rs, ar = costs
    G = plan.shard_group
    mesh = (
        f"HSDP {world // G} x {G} (replicas x shard group)" if G is not None else f"FSDP over {world} ranks"
    )
    reshard = "yes" if plan.reshard_after_forward else "no"
    table = Table(
        title=f"{plan.method} plan: {trace.model}, {mesh}, {len(plan.units)} unit(s), prefetch depth "
        f"{plan.depth}, reshard after forward {reshard}",
        caption=f"{where}; all-gather and reduce-scatter: half a ring all-reduce; FSDP2's fixed cost "
        f"{opts['unit_s'] * 1e6:.0f} us a unit per pass (docs/fsdp.md)",
    )
    cols = ["#", "modules", "fully_shard", "MiB", "all-gather ms", "reduce-scatter ms"]
    cols += ["all-reduce ms"] if ar is not None else []
    for col in cols:
        table.add_column(col, justify="left" if col == "fully_shard" else "right")
    B = unit_sums(plan.units, np.array(param_bytes, dtype=float))  # as gathered (param_dtype)
    for k, ((a, z), b) in enumerate(zip(plan.units, B, strict=True)):
        cells = [str(k), f"{a}" if a == z else f"{a}-{z}", _short(paths[k]), f"{b / 2**20:.2f}"]
        cells += [f"{c(b) * 1e3:.3f}" for c in (ag, rs, *([ar] if ar is not None else []))]
        table.add_row(*cells)
    console = Console()
    console.print(table)
    compute = trace.t_f + trace.t_b
    lb, gap = plan.meta.get("lower_bound_s"), plan.meta.get("gap")
    bound = f"certified lower bound {lb * 1e3:.3f} ms (gap {gap:.3%})" if lb is not None else ""
    exact = f"; {bound}" if bound and not row.fit_error else ""  # else the bound is the lines'(below)
    budget = "none" if opts["memory"] is None else f"{opts['memory'] / 2**20:.1f} MiB"
    state = (
        f" + sharded state {opts['state_bytes'] / (G or world) / 2**20:.1f} MiB"
        if opts["state_bytes"]
        else ""
    )
    console.print(
        f"t_iter {row.t_iter_s * 1e3:.3f} ms (compute {compute * 1e3:.3f} ms, exposed communication "
        f"{row.t_comm_exposed_s * 1e3:.3f} ms, speedup {row.speedup:.2f}, efficiency {row.efficiency:.1%}); "
        f"peak unsharded parameters {plan.peak_bytes / 2**20:.2f} MiB{state} per rank, budget {budget}"
        f"{exact}; planned in {row.planning_s:.2f} s"
    )
    if not opts["precision"].plain:
        console.print(f"mixed precision (FSDP2's MixedPrecisionPolicy): {opts['precision']}; gathers and "
                      "peak in param_dtype bytes, reductions in reduce_dtype bytes")  # fmt: skip
    if row.fit_error:
        console.print(
            f"planned on straight lines through these prices (at most {row.fit_error:.1%} off from the "
            f"smallest module to the whole model; t_iter and the table are the prices themselves): "
            f"{plan.time_s * 1e3:.3f} ms on the lines" + (f", their {bound}" if bound else "")
        )
    times = plan.meta.get("hsdp", {}).get("times_s", {})
    if len(times) > 1:
        shown = ", ".join(
            f"G={g}: " + ("-" if t is None else f"{t * 1e3:.3f} ms") for g, t in sorted(times.items())
        )
        console.print(f"shard group sizes (- : none fits, or bound above the best): {shown}")
    if written is not None:
        console.print(f"wrote {written}")
    for line in said:  # the limits and the verdict (cli/_verdict)
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    where = (
        "the modules dpcomm.fsdp.shard shards (the trace's fsdp_modules)"
        if holders(trace) is not None
        else "the trace's parameter names (it records no fsdp_modules: `dpcomm profile --model` of your "
        "model does, so that no unit splits a module FSDP2 shards whole)"
    )
    console.print(
        f"\nfully_shard code (after init_process_group; `model` your module, built or on meta). Module paths "
        f"are {where}; dpcomm.fsdp.shard(model, FsdpPlan.from_dict(plan)) with --json's plan checks them "
        "against the model and runs it:"
    )
    console.print(fsdp_code(plan, paths, world), markup=False, highlight=False, soft_wrap=True)
