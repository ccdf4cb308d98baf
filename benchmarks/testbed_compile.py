"""Compiled DDP on the emulated cluster: dpcomm's plan against compiled DDP's defaults, eager beside them.

    sudo .venv/bin/python benchmarks/testbed_compile.py --topology star:2 --rate 80mbit --mtu 9000 \\
        --model gpt2-tiny --batch 96 --iters 30 --repeats 3 --modes ddp_optimizer,python_reducer \\
        --probe-overlap --json docs/data/testbed/compile_mtu9000.json          # docs/compile.md's table

Needs root. The testbed is built once (named ``tc<pid in hex>``, removed at the end, also on an error or
SIGTERM) and every configuration is one launch of ``dpcomm train --json`` per server (``--threads``
torch threads each, default this machine's cores / servers), rounds of all configurations one after
another (``--repeats``), so each configuration meets the machine's load in turn:

- ``ddp --compile B``: ``DistributedDataParallel(torch.compile(model))``, dynamo's ``DDPOptimizer`` splitting
  the graph at DDP's 25 MB cap (1 MB for the subgraph nearest the output) and DDP's default buckets;
- ``ddp:mgwfbp --compile B`` and ``ddp:optimal --compile B``: ``dpcomm.ddp.wrap(torch.compile(model), P)``:
  planned on the compiled model's times (``dpcomm.ddp.planning.compiled_times``), the graph split at the
  plan's cuts (``dpcomm.ddp.compiled``); no timed trial (docs/compile.md);
- ``ddp`` and ``ddp:optimal`` eager (``ddp:optimal`` with its timed trial).

Per configuration: ``t_iter`` (``dpcomm train``'s median steady iteration), the ratio to compiled DDP's
defaults of the same round, and for ``ddp:PLANNER`` the prediction ``dpcomm train --json`` reports
(``predicted_t_iter_s``: the simulator on the profile the plan was made on, the plan, the all-reduce line
fitted on the workers and the measured optimizer time) with its error, and the same with the profile
scaled to the run's steady forward and backward medians (``predicted_steady_t_iter_s``, as ``dpcomm
validate`` predicts: what is left is the communication model's error). Medians of the per-iteration
forward, backward and exposed communication, and the profile, come from ``--records-json``.

``--modes`` picks the compile modes (default ``ddp_optimizer``: the configurations above).
``python_reducer`` adds compiled autograd (``dpcomm train --compile inductor --compiled-autograd``: the
backward traced with DDP's all-reduces in it and compiled by inductor, whose post-grad pass fuses them;
only inductor does, so these run ``inductor`` whatever ``--backend`` says):

- ``ddp --compile inductor --compiled-autograd``: DDP's defaults, inductor's greedy fusion (1 MB, then 25 MB);
- ``ddp:mgwfbp ...`` and ``ddp:optimal ...``: the plan's groups as the fused all-reduces (``fuse_by_plan``),
  planned on the eager profile scaled to an inductor-compiled copy's times.

Each mode's ratio is to its own defaults of the same round (``vs_defaults_of``; eager rows: compiled DDP's,
else compiled autograd's). Under compiled autograd the backward is one graph with its all-reduces: a
record's backward is the whole of it and the exposed communication is not measured (``-``), nor is the
steady-compute prediction made (it would scale the profile to a backward that includes communication);
each row has ``compiled_allreduces`` (and for a plan ``compiled_buckets``) from ``dpcomm train --json``.
``--probe-overlap`` runs the planned configurations with ``dpcomm train --probe-overlap``: their
prediction charges backward's measured slowdown beside the all-reduces (``dpcomm.ddp.overlap_probe``), and
each row also has the prediction without it (``predicted_unprobed_t_iter_s``). ``--mtu`` sets the
testbed's frames (9000: jumbo; fewer packets, less CPU taken from compute, docs/compile.md).
Inductor's CPU compile takes minutes per worker here: every launch shares one ``TORCHINDUCTOR_CACHE_DIR``
(``--inductor-cache``, default a folder of the run's scratch), so later rounds reuse what inductor cached
(``fuse_by_plan`` makes inductor bypass its FX graph cache, so the planned runs compile their graphs anew),
and ``--timeout`` (seconds per launch) defaults to 900.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import busy_share, cpu_ticks, loadavg, sigterm_exits

MODES = ("ddp_optimizer", "python_reducer")
"""Compile modes ``--modes`` takes: compiled DDP (dynamo's DDPOptimizer) and compiled autograd."""
CONFIGS = (
    ("ddp", None),
    ("ddp:optimal", None),
    ("ddp", "ddp_optimizer"),
    ("ddp:mgwfbp", "ddp_optimizer"),
    ("ddp:optimal", "ddp_optimizer"),
    ("ddp", "python_reducer"),
    ("ddp:mgwfbp", "python_reducer"),
    ("ddp:optimal", "python_reducer"),
)
"""(schedule, compile mode or None for eager) in launch order within a round."""


def _key(schedule: str, mode: str | None, backend: str) -> str:
    if mode == "python_reducer":
        return f"{schedule} --compile inductor --compiled-autograd"
    return f"{schedule} --compile {backend}" if mode else schedule


def _compile_args(mode: str | None, backend: str) -> list[str]:
    if mode == "python_reducer":
        return ["--compile", "inductor", "--compiled-autograd"]
    return ["--compile", backend] if mode else []


def _medians(path: Path, nproc: int) -> dict[str, float]:
    """Medians of the steady records' forward, backward, exposed communication, step and update (seconds),
    and the steady-compute prediction: the simulator on the plan's profile scaled to the steady forward
    and backward medians (``dpcomm.train.report.predict(steady_compute=True)``, as ``dpcomm validate``
    predicts), which leaves the communication model's and the overlap's error."""
    from types import SimpleNamespace

    from dpcomm.train.report import predict

    try:
        saved = json.loads(path.read_text())
        records = saved["records"]
    except (OSError, ValueError, KeyError):
        return {}
    steady = [r for r in records[1:] if r.get("phase") == "steady"] or records
    out = {
        f"{k}_median_s": statistics.median(r[k] or 0.0 for r in steady)
        for k in ("forward_s", "backward_s", "exposed_comm_s", "step_s", "update_s")
    }
    cost = saved.get("cost") or {}
    if cost.get("overlap_per_byte_s") is not None:  # --probe-overlap: the prediction without it, beside
        out["overlap_per_byte_s"] = cost["overlap_per_byte_s"]
        bare_cost = {k: v for k, v in cost.items() if k != "overlap_per_byte_s"}
        bare = SimpleNamespace(trace=saved.get("trace"), plan=saved.get("plan"), cost=bare_cost,
                               update_s=out["update_s_median_s"], nproc=nproc)  # fmt: skip
        sim = predict(bare)
        if sim is not None:
            out["predicted_unprobed_t_iter_s"] = sim.t_iter_s
    if any(r.get("compiled_autograd") for r in steady):  # one backward graph with its all-reduces in it:
        out["exposed_comm_s_median_s"] = None  # not measured, and no steady-compute prediction
        return out | _profile(saved)
    run = SimpleNamespace(trace=saved.get("trace"), plan=saved.get("plan"), cost=cost,
                          forward_s=out["forward_s_median_s"], backward_s=out["backward_s_median_s"],
                          update_s=out["update_s_median_s"], nproc=nproc)  # fmt: skip
    sim = predict(run, steady_compute=True)
    if sim is not None:
        out["predicted_steady_t_iter_s"] = sim.t_iter_s
    return out | _profile(saved)


def _profile(saved: dict) -> dict[str, float]:
    """What the plan was made on: the profile's sums and, for a compiled model, how it was timed."""
    out = {}
    trace = saved.get("trace") or {}
    keys = ("measured_by", "compiled_forward_s", "compiled_backward_s", "eager_forward_s", "eager_backward_s")
    for k in keys:
        if k in trace:
            out[f"profile_{k}"] = trace[k]
    if trace.get("layers"):  # what the plan was made on
        out["profile_forward_s"] = sum(x["forward_s"] for x in trace["layers"])
        out["profile_backward_s"] = sum(x["backward_s"] for x in trace["layers"])
    return out


def _plan_line(path: Path) -> str | None:
    try:
        log = json.loads(path.read_text())["log"]
    except (OSError, ValueError, KeyError):
        return None
    return next((ln for ln in log if "DDP with plan" in ln), None)


def run(args: argparse.Namespace) -> dict:
    from dpcomm.testbed import TestbedConfig, down, launch_workers, load_state, parse_rate, up
    from dpcomm.topology import parse_topology

    servers = parse_topology(args.topology).servers
    threads = args.threads or max(1, (os.cpu_count() or 1) // servers)
    name = f"tc{os.getpid():x}"[:8]
    scratch = Path(tempfile.mkdtemp(prefix="dpcomm-testbed-compile-"))
    cache = Path(args.inductor_cache or scratch / "inductor-cache")  # shared by every launch of the run
    cache.mkdir(parents=True, exist_ok=True)
    configs = [(s, m) for s, m in CONFIGS if m is None or m in args.modes]
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    rows = []
    try:
        up(TestbedConfig(name=name, topology=args.topology, rate_bps=parse_rate(args.rate), mtu=args.mtu))
        state = load_state(name)
        port = 29700
        for rnd in range(args.repeats):
            for schedule, mode in configs:
                key = _key(schedule, mode, args.backend)
                records = scratch / f"r{rnd}-{len(rows)}.records.json"
                wait = "600" if mode == "python_reducer" else "300"  # a peer may still be compiling
                argv = ["dpcomm", "train", "--model", args.model, "--batch-size", str(args.batch),
                        "--iters", str(args.iters), "--schedule", schedule, "--threads", str(threads),
                        "--timeout", wait, "--json", "--records-json", str(records),
                        *_compile_args(mode, args.backend)]  # fmt: skip
                if args.probe_overlap and ":" in schedule:
                    argv.append("--probe-overlap")
                load0, ticks0, t0 = loadavg(), cpu_ticks(), time.time()
                res = launch_workers(state, argv, master_port=port, timeout_s=args.timeout,
                                     env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})  # fmt: skip
                port += 1
                row = {"round": rnd, "config": key, "schedule": schedule, "compiled": bool(mode),
                       "compile_mode": mode, "loadavg_before": load0, "loadavg_after": loadavg(),
                       "cpu_busy_share": busy_share(ticks0, cpu_ticks()), "launch_s": res.seconds,
                       "started_unix": t0, "returncodes": res.returncodes}  # fmt: skip
                if res.ok:
                    data = json.loads(res.stdout(0).strip().splitlines()[-1])
                    row.update({k: v for k, v in data.items() if k != "params_sha256"})
                    row["replicas_identical"] = len(set(data.get("params_sha256", []))) == 1
                    row.update(_medians(records, data["nproc"]))
                    row["plan"] = _plan_line(records)
                else:
                    err = [ln for ln in res.stderr(0).splitlines() if ln.strip() and not ln.startswith("[W")]
                    row["error"] = err[-1] if err else "no error message"
                rows.append(row)
                pred, fused = row.get("predicted_t_iter_s"), row.get("compiled_allreduces")
                print(f"round {rnd} {key:<50} t_iter {row.get('t_iter_s', float('nan')) * 1e3:7.1f} ms"
                      + (f", predicted {pred * 1e3:7.1f} ms" if pred else "")
                      + (f", {fused} all-reduces compiled" if fused is not None else "")
                      + f", load {load0} -> {row['loadavg_after']}, {res.seconds:.0f} s"
                      + (f", ERROR {row['error']}" if "error" in row else ""), flush=True)  # fmt: skip
    finally:
        down(name)
    return {"rows": rows, "table": table(rows, args.backend), "inductor_cache": str(cache)}


def _defaults_of(mode: str | None, present: set[str], backend: str) -> str:
    """The configuration a row's ratio is taken against: its compile mode's defaults (``ddp`` compiled that
    way); eager rows: compiled DDP's, else compiled autograd's."""
    if mode is not None:
        return _key("ddp", mode, backend)
    return next(
        (k for k in (_key("ddp", m, backend) for m in MODES) if k in present), _key("ddp", MODES[0], backend)
    )


def table(rows: list[dict], backend: str) -> list[dict]:
    """Per configuration: median t_iter over the rounds, against compiled DDP's defaults in its compile mode
    (per round, then the median ratio), and the prediction's error (per round, the median)."""
    present = {r["config"] for r in rows}
    out = []
    for key in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == key and "t_iter_s" in r]
        if not mine:
            out.append({"config": key, "error": next(r.get("error") for r in rows if r["config"] == key)})
            continue
        base_key = _defaults_of(mine[0].get("compile_mode", "ddp_optimizer" if mine[0]["compiled"] else None),
                                present, backend)  # fmt: skip
        base = {r["round"]: r["t_iter_s"] for r in rows if r["config"] == base_key and "t_iter_s" in r}
        ratios = [r["t_iter_s"] / base[r["round"]] for r in mine if r["round"] in base]
        exposed = [r["exposed_comm_s"] for r in mine if r.get("exposed_comm_s_median_s", 0.0) is not None]
        fused = [r["compiled_allreduces"] for r in mine if r.get("compiled_allreduces") is not None]
        preds = [r for r in mine if r.get("predicted_t_iter_s")]
        predicted = [r["predicted_t_iter_s"] for r in preds]
        steady_rows = [r for r in mine if "predicted_steady_t_iter_s" in r]
        unprobed = [r for r in mine if "predicted_unprobed_t_iter_s" in r]
        steady = [r["predicted_steady_t_iter_s"] for r in steady_rows]
        out.append({
            "config": key,
            "t_iter_s": statistics.median(r["t_iter_s"] for r in mine),
            "t_iter_s_all": [r["t_iter_s"] for r in mine],
            "vs_compiled_ddp": statistics.median(ratios) if ratios else None,
            "vs_defaults_of": base_key,
            "predicted_t_iter_s": statistics.median(predicted) if preds else None,
            "prediction_error": statistics.median(r["predicted_t_iter_s"] / r["t_iter_s"] - 1 for r in preds)
            if preds else None,
            "exposed_comm_s": statistics.median(exposed) if exposed else None,
            "compiled_allreduces": fused or None,
            "unprobed_prediction_error": statistics.median(
                r["predicted_unprobed_t_iter_s"] / r["t_iter_s"] - 1 for r in unprobed
            ) if unprobed else None,
            "overlap_per_byte_s": statistics.median(r["overlap_per_byte_s"] for r in unprobed)
            if unprobed else None,
            "predicted_steady_t_iter_s": statistics.median(steady) if steady else None,
            "steady_prediction_error": statistics.median(
                r["predicted_steady_t_iter_s"] / r["t_iter_s"] - 1 for r in steady_rows
            ) if steady_rows else None,
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="star:2")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--mtu", type=int, default=1500, help="the testbed's MTU (9000: jumbo frames)")
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--batch", type=int, default=96, help="samples per worker")
    p.add_argument("--iters", type=int, default=30, help="per launch (the first is never steady)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of every configuration")
    p.add_argument("--backend", default="aot_eager", help="--compile's backend")
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (cores/servers)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch (inductor: minutes)")
    p.add_argument(
        "--modes", default="ddp_optimizer", help=f"compile modes, comma-separated: {', '.join(MODES)}"
    )
    p.add_argument("--inductor-cache", default=None, help="TORCHINDUCTOR_CACHE_DIR of every launch")
    p.add_argument(
        "--probe-overlap",
        action="store_true",
        help="ddp:PLANNER: dpcomm train --probe-overlap (backward slowed beside all-reduces)",
    )
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        p.error(
            f"--modes takes {', '.join(MODES)} (comma-separated), got {','.join(args.modes) or 'nothing'}"
        )
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    import platform

    import torch

    result = run(args)
    result |= {"command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
               "machine": f"2-core VM ({platform.machine()}), {os.cpu_count()} CPU cores",
               "torch": torch.__version__, "python": platform.python_version(),
               "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "topology": args.topology,
               "rate": args.rate, "mtu": args.mtu, "model": args.model, "batch": args.batch,
               "iters": args.iters,
               "modes": args.modes}  # fmt: skip
    for t in result["table"]:
        if "error" in t:
            print(f"{t['config']:<50} ERROR {t['error']}")
            continue
        ratio = f"{t['vs_compiled_ddp']:.3f}" if t["vs_compiled_ddp"] is not None else "-"
        exposed = f"{t['exposed_comm_s'] * 1e3:6.1f}" if t["exposed_comm_s"] is not None else "     -"
        fused = f"  all-reduces {t['compiled_allreduces']}" if t["compiled_allreduces"] else ""
        pred = (f"predicted {t['predicted_t_iter_s'] * 1e3:7.1f} ms ({t['prediction_error']:+.1%})"
                if t["predicted_t_iter_s"] else "")  # fmt: skip
        if t["unprobed_prediction_error"] is not None:
            pred += f", without the probe {t['unprobed_prediction_error']:+.1%}"
        if t["predicted_steady_t_iter_s"]:
            pred += (
                f", steady compute {t['predicted_steady_t_iter_s'] * 1e3:7.1f} ms "
                f"({t['steady_prediction_error']:+.1%})"
            )
        print(f"{t['config']:<50} t_iter {t['t_iter_s'] * 1e3:7.1f} ms  x{ratio} of {t['vs_defaults_of']}  "
              f"exposed {exposed} ms  {pred}{fused}")  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
