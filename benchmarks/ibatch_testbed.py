"""Parameter-server pulls on the emulated cluster: all, layer, ibatch, optimal side by side, with the model.

    .venv/bin/python benchmarks/ibatch_testbed.py --topology star:4 --rate 1gbit --model lenet5 --batch 64

Needs root. Builds one testbed (name ``h5ps``), runs one process per server, co-located servers, and in
that one run trains one parameter-server replica per pull method on the same batches, one method after the
other (each replica on its own process group). Not interleaved iteration by iteration: a replica posts its
pulls at the end of an iteration, and they must travel under its own next forward, not under another
replica's iteration. Each replica's
``F_N`` (pulls + forward: the forward's wall time, pre-hooks waiting on pulls included) is measured per
iteration; the model's prediction uses the ``Ts``/``beta`` that the ``ibatch`` replica's probe measured on
these links and the forward times rank 0 profiled: ``pull_time(batches, C, Tt, Ts)`` for every method's
batches. Prints a Markdown table (medians over the iterations after the first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

METHODS = ["all", "layer", "ibatch", "optimal"]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from dpcomm.models import get_model, input_shape, num_classes
    from dpcomm.planner.pull import pull_time
    from dpcomm.ps.rank import PsRank
    from dpcomm.ps.spec import PsSpec
    from dpcomm.runtime.data import TrainData, derive_seed

    world, rank = int(os.environ["DPCOMM_NNODES"]), int(os.environ["DPCOMM_NODE_RANK"])
    addr, port = os.environ["DPCOMM_MASTER_ADDR"], os.environ["DPCOMM_MASTER_PORT"]
    import datetime

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    data = TrainData(
        "synthetic",
        input_shape=input_shape(args.model),
        num_classes=num_classes(args.model),
        batch_size=args.batch,
        world_size=world,
        rank=rank,
        seed=0,
    )
    reps = {}
    for m in METHODS:
        torch.manual_seed(0)
        model = get_model(args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        group = dist.new_group(list(range(world)))
        reps[m] = PsRank(
            model,
            opt,
            PsSpec(pull=m, probe_rounds=3),
            rank=rank,
            workers=world,
            sample=data.batch(0)[0] if rank == 0 else None,
            group=group,
            stop=args.iters,
        )
    for m in METHODS:  # one method after the other: a replica's pulls must run under its own next forward,
        for it in range(args.iters):  # not under another replica's iteration (as interleaving would have it)
            x, y = data.batch(it)
            torch.manual_seed(derive_seed(0, rank, it))
            reps[m].iteration(x, y)
    for r in reps.values():
        r.finish()
    if rank == 0:
        meta = reps["ibatch"].pull_plan.meta
        C, Ts, beta = meta["C_s"], meta["Ts_s"], meta["beta_s_per_byte"]
        lay = reps["ibatch"].layout
        nbytes = [sum(lay.numels[i] * 4 for i in ps) for ps in lay.layer_params]
        Tt = [beta * b * (world - 1) / world for b in nbytes]  # the co-located share arrives over the link
        out = {"Ts_s": Ts, "beta_s_per_byte": beta, "C_s": C, "methods": {}}
        for m, r in reps.items():
            steady = r.records[1:]
            out["methods"][m] = {
                "batches": [list(b) for b in r.pull_plan.batches],
                "fn_s": statistics.median(x["forward_s"] for x in steady),
                "pull_wait_s": statistics.median(x["pull_wait_s"] for x in steady),
                "t_iter_s": statistics.median(x["total_s"] for x in steady),
                "predicted_fn_s": pull_time(r.pull_plan.batches, C, Tt, Ts),
            }
        print("RESULT " + json.dumps(out))
    dist.barrier()


def driver(args: argparse.Namespace) -> int:
    from dpcomm.testbed import TestbedConfig, down, launch_workers, parse_rate, up

    cfg = TestbedConfig(name="h5ps", topology=args.topology, rate_bps=parse_rate(args.rate))
    load = open("/proc/loadavg").read().split()[:3]
    state = up(cfg)
    try:
        argv = [
            "python",
            str(Path(__file__).resolve()),
            "--worker",
            "--model",
            args.model,
            "--batch",
            str(args.batch),
            "--iters",
            str(args.iters),
        ]
        res = launch_workers(state, argv, timeout_s=args.timeout)
        text = (res.out_dir / "rank0.out").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            print((res.out_dir / "rank0.err").read_text()[-3000:])
            return 1
        out = json.loads(lines[-1][7:])
    finally:
        down(cfg.name)
    print(
        f"{args.model}, batch {args.batch}, {args.topology} at {args.rate}, co-located, "
        f"{args.iters} iterations; "
        f"load average before {' '.join(load)}; measured Ts {out['Ts_s'] * 1e3:.2f} ms, "
        f"beta {out['beta_s_per_byte'] * 1e9:.2f} ns/B, forward {sum(out['C_s']) * 1e3:.1f} ms\n"
    )
    print(
        "| pull method | batches | F_N measured (ms) | F_N model (ms) | model/measured "
        "| exposed pull wait (ms) | t_iter (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for m, r in out["methods"].items():
        print(
            f"| {m} | {len(r['batches'])} | {r['fn_s'] * 1e3:.1f} | {r['predicted_fn_s'] * 1e3:.1f} | "
            f"{r['predicted_fn_s'] / r['fn_s']:.2f} | {r['pull_wait_s'] * 1e3:.1f} | "
            f"{r['t_iter_s'] * 1e3:.1f} |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topology", default="star:4")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900.0)
    args, extra = (
        parser.parse_known_args()
    )  # the testbed appends --nnodes/--node-rank/.. (read from env here)
    if extra and not args.worker:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
