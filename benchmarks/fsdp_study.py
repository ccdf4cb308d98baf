"""FSDP, HSDP and DDP for Llama-3-8B- and 70B-shaped models on clusters of DGX H100 servers (issue 40,
item 5): what ``optimal`` buys over ``per-block`` (torchtitan's units) and over FSDP2's defaults, and the
time-memory front. Every number is the model's (:mod:`dpcomm.planner.fsdp_model`), priced by the multi-GPU
flow model of ``dgx-h100:S`` as ``dpcomm simulate`` prices it; nothing is run.

    .venv/bin/python benchmarks/fsdp_study.py [--servers 2,8,32,128] [--models llama3-8b,llama3-70b]
        [--tokens 8192] [--out docs/data/fsdp/study.json] [--plots docs/reproductions]

What it does, all with dpcomm's own commands and functions:

1. the traces: ``dpcomm profile --model dpcomm.models.llama:llama --model-args '{"shape": "llama3-8b"}'
   --input 'long[1,8192]:vocab=128256' --analytic h100-bf16 --reduce-dtype bf16`` (and ``llama3-70b``): one
   sequence of 8,192 tokens per GPU (``--tokens``), layer times of the H100 bf16 roofline
   (:mod:`dpcomm.trace.retime`), bf16 parameters and gradients (2 bytes:
   ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``);
2. the costs: ``dpcomm simulate --topology dgx-h100:S`` 's (:func:`dpcomm.cli._costargs.costs_of`,
   :func:`~dpcomm.cli._costargs.fsdp_costs_of`): NCCL's all-reduce for DDP and HSDP's replicas, half a
   ring all-reduce for each all-gather and reduce-scatter (:mod:`dpcomm.sim.fsdp_costs`);
3. the schedules, :func:`dpcomm.sim.fsdp.plan_row` (``dpcomm simulate --schedules ...``) and one more:
   ``ddp`` (DDP's own buckets: :mod:`dpcomm.sim.simulator`), ``fsdp2-default`` (per-block units, FSDP2's
   defaults on GPUs: ``reshard_after_forward=True`` and one unit of prefetch in each pass, depth 1: FSDP2
   sets no explicit forward prefetch, but the CPU runs ahead of the GPU and issues the next unit's
   all-gather while this one computes, which the model, without CPU run-ahead, writes as depth 1),
   ``fsdp:per-block`` (per-block units, depth and reshard the best within the budget), ``fsdp:optimal``,
   ``hsdp:per-block:8`` (a shard group per server, torchtitan's usual HSDP) and ``hsdp:optimal`` (the planner
   picks the shard group among those that do not straddle servers);
4. the budget: 40 GiB a GPU for unsharded bf16 parameters plus the sharded state, 16 bytes a parameter
   (fp32 master weights, fp32 gradients, Adam's two moments), over the shard group; the other half of the
   H100's 80 GB is left to activations and workspace (an assumption, stated, not measured). DDP holds the
   whole state on every GPU: its memory is shown, it fits nowhere;
5. the front: ``dpcomm plan --fsdp optimal --topology dgx-h100:S --plot`` for each model at the smallest
   cluster where FSDP fits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

MODELS = ("llama3-8b", "llama3-70b")
BUDGET = 40 * 2**30  # bytes a GPU for unsharded parameters and sharded state (module docstring)
STATE_PER_PARAM = 16  # bytes: fp32 master weights 4, fp32 gradients 4, Adam's moments 8
SCHEDULES = ["fsdp:per-block", "fsdp:optimal", "hsdp:per-block:8", "hsdp:optimal"]
DPCOMM = [sys.executable, "-m", "dpcomm"]


def trace_of(shape: str, folder: Path, tokens: int) -> Path:
    """Step 1: the trace file of one shape (written by ``dpcomm profile``, kept in ``folder``)."""
    out = folder / f"{shape}-h100bf16-t{tokens}.json"
    if not out.exists():
        cmd = [*DPCOMM, "profile", "--model", "dpcomm.models.llama:llama", "--model-args",
               json.dumps({"shape": shape}), "--input", f"long[1,{tokens}]:vocab=128256", "--analytic",
               "h100-bf16", "--reduce-dtype", "bf16", "-o", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    return out


def _args(trace: Path, servers: int, state: float, max_depth: int = 2) -> argparse.Namespace:
    """``dpcomm simulate``'s own parsed flags for this cell (its defaults for the rest)."""
    from dpcomm.cli import simulate

    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    return parser.parse_args(["--trace", str(trace), "--topology", f"dgx-h100:{servers}", "--nodes",
                              str(8 * servers), "--memory", str(BUDGET), "--state-bytes", str(int(state)),
                              "--max-depth", str(max_depth)])  # fmt: skip


def fsdp2_default(trace, costs, nodes: int, state: float):
    """FSDP2's defaults on per-block units (module docstring), or None where they do not fit."""
    from dpcomm.errors import UserError
    from dpcomm.planner.fsdp import Modules, fsdp_time, plan_fsdp
    from dpcomm.sim.fsdp_costs import linear_costs

    mods = Modules.from_trace(trace)
    f, b, m = mods.arrays
    lines, _ = linear_costs(costs, float(m[m > 0].min()), float(m.sum()))
    ag, rs, _ = lines(nodes)
    try:
        plan = plan_fsdp("per-block", mods, ag, rs, memory=BUDGET - state / nodes, depth=1, reshard=True)
    except UserError:
        return None
    ag, rs, _ = costs(nodes)  # timed by the prices themselves, as dpcomm simulate does
    t = float(fsdp_time(plan.units, f, b, m, ag, rs, depth=1, reshard=True))
    return {"t_iter_s": t, "memory_bytes": plan.peak_bytes + state / nodes, "units": len(plan.units),
            "depth": 1, "reshard_after_forward": True, "shard_group": nodes}  # fmt: skip


def cell(trace_path: Path, servers: int) -> list[dict]:
    """Every schedule on ``dgx-h100:servers``, a row each (``fits``: False where the budget cannot hold)."""
    from dpcomm.cli._costargs import costs_of, fsdp_costs_of, fsdp_options
    from dpcomm.errors import UserError
    from dpcomm.planner import parse_schedules
    from dpcomm.sim import sweep
    from dpcomm.sim.fsdp import plan_row
    from dpcomm.trace import load_trace

    trace = load_trace(trace_path)
    params = sum(x.params for x in trace.layers)
    state = STATE_PER_PARAM * params
    nodes = 8 * servers
    args = _args(trace_path, servers, state)
    cost, model = costs_of(args, nodes)
    costs_for, shards_for = fsdp_costs_of(args, model)
    costs = costs_for(nodes)
    rows = []
    ddp = sweep(trace, cost, [nodes], parse_schedules("ddp"))[0]
    ddp_memory = trace.dtype_bytes * params + state  # every GPU: parameters and the whole state
    rows.append({"schedule": "ddp", "t_iter_s": ddp.t_iter_s, "memory_bytes": ddp_memory,
                 "fits": ddp_memory <= BUDGET, "units": len(ddp.plan.groups)})  # fmt: skip
    default = fsdp2_default(trace, costs, nodes, state)
    rows.append({"schedule": "fsdp2-default", "fits": default is not None, **(default or {})})
    opts = fsdp_options(args)
    for s in SCHEDULES:
        t0 = time.perf_counter()
        try:
            r = plan_row(s, trace, costs, nodes, shards=shards_for(nodes), **opts).to_dict()
        except UserError as exc:
            rows.append({"schedule": s, "fits": False, "why": str(exc)})
            continue
        rows.append({**r, "fits": True, "planning_s": time.perf_counter() - t0})
    for r in rows:
        r.update(servers=servers, gpus=nodes, compute_s=trace.t_f + trace.t_b)
    return rows


def _table(model: str, rows: list[dict]) -> str:
    out = [f"**{model}**", "", "| servers (GPUs) | schedule | t_iter ms | exposed ms | GiB a GPU | units "
           "| depth | reshard | shard group | vs per-block | vs FSDP2 defaults |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for servers in sorted({r["servers"] for r in rows}):
        here = {r["schedule"]: r for r in rows if r["servers"] == servers}
        block, dflt = here.get("fsdp:per-block", {}), here.get("fsdp2-default", {})
        for name, r in here.items():
            if not r.get("fits") and name != "ddp":
                out.append(f"| {servers} ({r['gpus']}) | {name} | does not fit | | | | | | | | |")
                continue
            t = r["t_iter_s"]
            gain = name.endswith("optimal")
            vs = [f"{(o['t_iter_s'] / t - 1) * 100:+.1f}%" if o.get("fits") and gain else ""
                  for o in (block, dflt)]  # fmt: skip
            fit = "" if r.get("fits") else " (over)"
            out.append(
                f"| {servers} ({r['gpus']}) | {name} | {t * 1e3:.1f} | {(t - r['compute_s']) * 1e3:.1f} | "
                f"{r['memory_bytes'] / 2**30:.1f}{fit} | {r.get('units', '')} | {r.get('depth', '')} | "
                f"{r.get('reshard_after_forward', '')} | {r.get('shard_group', '')} | {vs[0]} | {vs[1]} |"
            )
    return "\n".join(out)


def main() -> int:
    from dpcomm.trace import load_trace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="2,8,32,128", help="DGX H100 servers per cluster")
    parser.add_argument("--models", default=",".join(MODELS), help="Llama shapes (dpcomm.models.llama)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens a GPU per iteration")
    parser.add_argument("--out", default="docs/data/fsdp/study.json", help="rows as JSON")
    parser.add_argument("--plots", default="docs/reproductions", help="folder for the fronts (PNG)")
    parser.add_argument("--traces", default="docs/data/fsdp", help="folder for the two traces")
    args = parser.parse_args()
    servers = [int(s) for s in args.servers.split(",")]
    folder = ROOT / args.traces
    folder.mkdir(parents=True, exist_ok=True)
    everything: dict[str, list[dict]] = {}
    for name in args.models.split(","):
        path = trace_of(name, folder, args.tokens)
        rows = []
        for s in servers:
            t0 = time.perf_counter()
            rows += cell(path, s)
            print(f"{name} on dgx-h100:{s}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        everything[name] = rows
        print(_table(name, rows) + "\n")
        fits = [r["servers"] for r in rows if r["schedule"] == "fsdp:optimal" and r.get("fits")]
        if fits and args.plots:
            png = ROOT / args.plots / f"fsdp_front_{name}_t{args.tokens}.png"
            state = STATE_PER_PARAM * sum(x.params for x in load_trace(path).layers)
            cmd = [*DPCOMM, "plan", "--fsdp", "optimal", "--trace", str(path), "--topology",
                   f"dgx-h100:{fits[0]}", "--memory", str(BUDGET), "--state-bytes", str(int(state)),
                   "--plot", str(png)]  # fmt: skip
            subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
            shown = " ".join(c.replace(f"{ROOT}/", "") for c in cmd[3:])
            print(f"front: dpcomm {shown}\n", file=sys.stderr)
    out = ROOT / args.out
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(everything, indent=1) + "\n")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
