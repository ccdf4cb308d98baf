"""Training on the emulated cluster through ``dpcomm testbed launch -- dpcomm train``.

    # BML (Fig. 6): LeNet-5 on 9 servers, bcube on bcube:3,2 vs ps on star:9, sub-minibatch 16..128
    .venv/bin/python benchmarks/testbed_train.py bml --rate 100mbit --batches 16,32,64,128 --iters 24
    # MG-WFBP vs WFBP vs single vs DDP on star:4
    .venv/bin/python benchmarks/testbed_train.py schedules --rate 100mbit --model lenet5 --iters 30

Needs root. Each testbed is built once, every configuration is one launch (one ``dpcomm train`` per
server, ``--json``), and the testbed is removed at the end. Every worker gets ``--threads`` torch threads
(default: this machine's cores / servers, at least 1): the emulated servers share the machine's cores, and
``dpcomm train`` alone gives each of them all the cores (it knows only its own node), e.g. 8 threads on 2
cores for ``star:4``, where a ResNet-20 iteration then took 2.8 s instead of 0.42 s (docs/testbed.md sec. 4).
``t_iter`` is ``dpcomm train``'s median steady-state iteration (after the profiled and timed ones: use
``--iters`` >= 22 for ``mgwfbp``/``optimal``); the BML paper's JCT is 1000 iterations, i.e.
``1000 * t_iter``, so the JCT reduction of BML against PS is ``1 - t_iter(BML) / t_iter(PS)`` (paper,
Fig. 6: 18.7%-56.4% for LeNet-5).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _common import loadavg, sigterm_exits
from dpcomm.testbed import TestbedConfig, down, launch_workers, load_state, parse_rate, up

NAME = "train"


def run_configs(
    topology: str, rate_bps: int, configs: list[dict], iters: int, port: int, threads: int | None = None
) -> list[dict]:
    """Build ``topology`` once and run one ``dpcomm train`` launch per config on it, ``threads`` torch
    threads per worker (None: cores / servers, at least 1)."""
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // len(load_servers(topology)))
    down(NAME)
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    up(TestbedConfig(name=NAME, topology=topology, rate_bps=rate_bps))
    out = []
    try:
        state = load_state(NAME)
        for i, cfg in enumerate(configs):
            argv = [
                "dpcomm",
                "train",
                "--model",
                cfg["model"],
                "--iters",
                str(iters),
                "--batch-size",
                str(cfg["batch"]),
                "--schedule",
                cfg["schedule"],
                "--collective",
                cfg["collective"],
                "--threads",
                str(threads),
                "--timeout",
                "300",
                "--json",
            ]
            load = loadavg()
            res = launch_workers(state, argv, master_port=port + i, timeout_s=1200)
            row = {
                **cfg,
                "topology": topology,
                "rate_bps": rate_bps,
                "iters": iters,
                "threads": threads,
                "returncodes": res.returncodes,
                "launch_s": res.seconds,
                "loadavg": load,
                "command": "dpcomm testbed launch -- " + " ".join(argv),
            }
            if res.ok:
                data = json.loads(res.stdout(0).strip().splitlines()[-1])
                row.update({k: v for k, v in data.items() if k != "params_sha256"})
                row["replicas_identical"] = len(set(data.get("params_sha256", []))) == 1
            else:
                row["error"] = (res.stderr(0).strip().splitlines() or ["?"])[-1]
            print(
                json.dumps(
                    {
                        k: row.get(k)
                        for k in (
                            "topology",
                            "collective",
                            "schedule",
                            "batch",
                            "t_iter_s",
                            "exposed_comm_s",
                            "loadavg",
                            "error",
                        )
                    }
                ),
                flush=True,
            )
            out.append(row)
    finally:
        down(NAME)
    return out


def bml(args: argparse.Namespace) -> dict:
    rate = parse_rate(args.rate)
    batches = [int(b) for b in args.batches.split(",")]
    sched = args.schedule
    rows = run_configs(
        args.bcube,
        rate,
        [{"model": args.model, "batch": b, "schedule": sched, "collective": "bcube"} for b in batches],
        args.iters,
        29500,
        args.threads,
    )
    n = len(load_servers(args.bcube))
    rows += run_configs(
        f"star:{n}",
        rate,
        [{"model": args.model, "batch": b, "schedule": sched, "collective": "ps"} for b in batches],
        args.iters,
        29520,
        args.threads,
    )
    table = []
    for b in batches:
        tb = next((r.get("t_iter_s") for r in rows if r["batch"] == b and r["collective"] == "bcube"), None)
        tp = next((r.get("t_iter_s") for r in rows if r["batch"] == b and r["collective"] == "ps"), None)
        red = (1 - tb / tp) if tb and tp else None
        table.append({"batch": b, "t_iter_bml_s": tb, "t_iter_ps_s": tp, "jct_reduction": red})
        print(
            f"batch {b:4d}: BML {tb or float('nan'):.3f} s/iter, PS {tp or float('nan'):.3f} s/iter, "
            f"JCT reduction {red if red is not None else float('nan'):.1%} (paper: 18.7%-56.4%)"
        )
    return {"rows": rows, "table": table}


def load_servers(spec: str) -> range:
    from dpcomm.topology import parse_topology

    return range(parse_topology(spec).servers)


def schedules(args: argparse.Namespace) -> dict:
    rate = parse_rate(args.rate)
    configs = [
        {"model": args.model, "batch": args.batch, "schedule": s, "collective": args.collective}
        for s in args.schedules.split(",")
    ]
    rows = run_configs(args.topology, rate, configs, args.iters, 29540, args.threads)
    base = next((r.get("t_iter_s") for r in rows if r["schedule"] == "wfbp"), None)
    for r in rows:
        t = r.get("t_iter_s")
        rel = f"{t / base:.3f} of WFBP" if t and base else ""
        print(
            f"{r['schedule']:>8}: t_iter {t or float('nan'):.3f} s, exposed comm "
            f"{r.get('exposed_comm_s') or float('nan'):.3f} s {rel}"
        )
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    b = sub.add_parser("bml")
    b.add_argument("--bcube", default="bcube:3,2")
    b.add_argument("--batches", default="16,32,64,128")
    b.add_argument("--schedule", default="wfbp", help="layer-wise, as BML's TensorFlow implementation")
    b.add_argument("--model", default="lenet5")
    s = sub.add_parser("schedules")
    s.add_argument("--topology", default="star:4")
    s.add_argument("--schedules", default="mgwfbp,wfbp,single,ddp")
    s.add_argument("--collective", default="native")
    s.add_argument("--model", default="lenet5")
    s.add_argument("--batch", type=int, default=32)
    for q in (b, s):
        q.add_argument("--rate", default="100mbit")
        q.add_argument(
            "--iters", type=int, default=24, help="per run; >= 22 for mgwfbp/optimal (3 profiled + 9 timed)"
        )
        q.add_argument(
            "--threads", type=int, default=None, help="torch threads per worker (default cores/servers)"
        )
        q.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    result = bml(args) if args.part == "bml" else schedules(args)
    result["command"] = " ".join(sys.argv)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
