"""Parameter-server pulls on the emulated cluster: all, layer, ibatch, optimal side by side, with the model.

    .venv/bin/python benchmarks/ibatch_testbed.py --topology star:4 --rate 100mbit --model resnet20 --batch 32
    .venv/bin/python benchmarks/ibatch_testbed.py --topology star:4 --servers 2 ...   # dedicated servers
    .venv/bin/python benchmarks/ibatch_testbed.py ... --pulls request   # each batch on the worker's request

Needs root. Builds one testbed (name ``h5ps``), runs one process per emulated server, and in that one run
trains one parameter-server replica per pull method on the same batches, each on its own process group.
With ``--servers S`` the last ``S`` servers of the topology are dedicated parameter servers and the others
workers; without it every server is a worker and serves one shard (co-located).

The methods run one after the other, ``--iters`` iterations each, and that round is repeated ``--rounds``
times in a rotated order (so no method always runs first or last). Not interleaved iteration by iteration:
a replica posts its pulls at the end of an iteration, and they must travel under its own next forward, not
under another replica's iteration; for the same reason the first iteration of every round is left out.

Measured, per method: ``F_N``, the forward's end with the pre-hooks waiting on pulls (the model's
execution time: pulls overlapped with forward), counted from when the last server began sending, as the
model's time is, the median over every worker and steady iteration; the exposed pull wait (with any time
the pulls ran before the forward began, ``head_start_s``); the forward's own compute (``F_N`` less the
wait); ``t_iter``. Predicted:
``pull_time(batches, C, Tt, Ts, slowdown=d)`` with the very inputs the planners had (the ``ibatch``
replica's plan meta): ``Ts`` and ``Tt_i`` from its timed pulls on these links, ``C_i`` from the forwards
every worker timed at once before training; ``d`` is 0 (the paper's model) unless ``--probe slowdown``
fitted it to the probe's forward beside the pulls of the plan made without one. With ``--probe confirm``
(the default, ``PsSpec.probe``) the JSON's ``probes`` give each probed plan's ``F_N`` against the model
and whether it was kept. ``cpu_busy``: the share of both cores busy over the whole run (``/proc/stat``),
which tells a network-bound case from one where the cores set the pace.

``--model emulated:TRACE`` (a shipped trace or a trace file; :mod:`dpcomm.trace.emulated`) trains a model
whose layers sleep the trace's forward and backward times: the traffic is real, the CPU stays free for
it, as on machines whose accelerators compute (no all-reduce replica then: it builds zoo models only).

``--mtu`` is 9000 by default: at 1500 the kernel's per-packet work on the emulated links (veth, tbf, TCP)
took CPU from the overlapped forward on this 2-core machine (ResNet-20: its compute 33-37 ms when nothing
was on the wire, 33-60 ms while pulls arrived; ``docs/ps.md``); with jumbo frames there are 6x fewer packets
and the forward runs at its profiled speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

from _common import busy_share, cpu_ticks, loadavg, sigterm_exits

METHODS = ["all", "layer", "ibatch", "optimal"]
ALLREDUCE = "allreduce"


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from dpcomm.models import get_model, input_shape, num_classes
    from dpcomm.planner.pull import pull_time
    from dpcomm.ps.rank import PsRank
    from dpcomm.ps.spec import PsSpec
    from dpcomm.runtime.data import TrainData, derive_seed
    from dpcomm.trace.emulated import PREFIX, emulated_model
    from dpcomm.utils.groups import group_timeout

    world, rank = int(os.environ["DPCOMM_NNODES"]), int(os.environ["DPCOMM_NODE_RANK"])
    addr, port = os.environ["DPCOMM_MASTER_ADDR"], os.environ["DPCOMM_MASTER_PORT"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    workers = world - args.servers
    emulated = args.model.startswith(PREFIX)
    build = (lambda: emulated_model(args.model)) if emulated else (lambda: get_model(args.model))
    data = None
    if rank < workers:
        data = TrainData(
            "synthetic",
            input_shape=(1,) if emulated else input_shape(args.model),
            num_classes=10 if emulated else num_classes(args.model),
            batch_size=args.batch,
            world_size=workers,
            rank=rank,
            seed=0,
        )
    total = args.iters * args.rounds
    reps = {}
    for m in METHODS:
        torch.manual_seed(0)
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        group = dist.new_group(list(range(world)), timeout=group_timeout())
        reps[m] = PsRank(
            model,
            opt,
            PsSpec(
                pull=m,
                servers=args.servers,
                pulls=args.pulls,
                probe_rounds=args.probe_rounds,
                probe=args.probe,
            ),
            rank=rank,
            workers=workers,
            sample=data.batch(0)[0] if data is not None else None,
            group=group,
            stop=total,
            align_sends=not args.unaligned,
        )
    methods = list(METHODS)
    if args.allreduce and not args.servers and not emulated:  # every rank a worker: all-reduce on all
        methods.append(ALLREDUCE)
        reps[ALLREDUCE] = allreduce_replica(args, rank, world)
        warm = 0
        while not reps[ALLREDUCE].settled:  # profiled and timed iterations, then the kept plan
            x, y = data.batch(warm)
            reps[ALLREDUCE].iteration(x, y)
            warm += 1
    steady: dict[str, list[dict]] = {m: [] for m in methods}
    done = {m: 0 for m in methods}
    n = len(methods)
    for rnd in range(args.rounds):
        for m in methods[rnd % n :] + methods[: rnd % n]:  # rotated: no method always first
            for i in range(args.iters):
                it = done[m]
                x, y = data.batch(it) if data is not None else (None, None)
                torch.manual_seed(derive_seed(0, rank, it))
                reps[m].iteration(x, y)
                done[m] += 1
                # a round's first iteration pulled under another replica's run: kept for its sends only
                steady[m].append({**reps[m].records[-1], "first_of_round": i == 0})
    for r in reps.values():
        r.finish()
    every: list = [None] * world
    dist.all_gather_object(every, steady)
    if rank == 0:
        meta = reps["ibatch"].pull_plan.meta
        C, Tt, Ts = meta["C_s"], meta["Tt_s"], meta["Ts_s"]
        d = meta.get("slowdown", 0.0)  # fitted to the ibatch replica's probe (--probe slowdown only)
        out = {
            "Ts_s": Ts,
            "beta_s_per_byte": meta["beta_s_per_byte"],
            "C_s": C,
            "Tt_s": Tt,
            "overlap_batches": meta.get("overlap_batches"),
            "overlap_forward_s": meta.get("overlap_forward_s"),
            "slowdown": d,
            "slowdown_optimal": reps["optimal"].pull_plan.meta.get("slowdown", 0.0),
            # --probe confirm: each probe's F_N against the model's, and whether the plan was kept
            "probes": {
                m: {k: reps[m].pull_plan.meta.get(k) for k in ("probe_s", "probe_model_s", "confirmed")}
                | {"refuted_batches": reps[m].pull_plan.meta.get("refuted_batches")}
                for m in ("ibatch", "optimal")
            },
            "probe_rounds_s": meta.get("probe_rounds_s"),
            "workers": workers,
            "servers": args.servers or workers,
            "placement": "dedicated" if args.servers else "co-located",
            "methods": {},
        }
        if ALLREDUCE in reps:
            ar = [x["total_s"] for mine in every for x in mine[ALLREDUCE] if not x["first_of_round"]]
            plan = reps[ALLREDUCE].plan
            out["allreduce"] = {
                "schedule": args.allreduce,
                "groups": len(plan.groups) if plan is not None else None,
                "t_iter_s": statistics.median(ar),
                "samples": len(ar),
            }
        for m, r in reps.items():
            if m == ALLREDUCE:
                continue
            recs, fn, wait, lags = [], [], [], []
            sending: dict[int, list[float]] = {}
            for mine in every:  # when each server began sending iteration t's pulls (at the end of t - 1)
                for x in mine[m]:
                    if x["pulls_sending_unix"] is not None:
                        sending.setdefault(x["iteration"] + 1, []).append(x["pulls_sending_unix"])
            origins = []
            rank_of = {id(x): q for q, mine in enumerate(every[:workers]) for x in mine[m]}
            for x in (x for mine in every[:workers] for x in mine[m]):
                if x["first_of_round"]:
                    continue
                # F_N counts from when the pulls start, as the model's time does (and the probe that
                # measures Ts and Tt): the moment the last server began sending (or, in request mode,
                # answering; BSP: no batch is whole before it). Not the moment it had posted every send:
                # posting hundreds of sends takes a share of the cores, the data flows meanwhile. Nor the
                # forward's start where that is later: a co-located worker's forward starts once its own
                # server has posted every send, with the pulls under way (five workers, layer by layer:
                # 8-12 ms, which the probe counted and training did not; ``head_start_s``, docs/ps.md)
                origin = max(sending[x["iteration"]])
                recs.append({**x, "rank": rank_of[id(x)]})
                origins.append(origin)
                lag = x["start_unix"] - origin  # > 0: a head start; < 0: the forward waited (BSP)
                lags.append(lag)
                fn.append(x["forward_s"] + lag)
                wait.append(max(0.0, x["pull_wait_s"] + lag))
            out["methods"][m] = {
                "batches": [list(b) for b in r.pull_plan.batches],
                "algorithm": r.pull_plan.meta.get("algorithm"),
                "samples": len(recs),
                "fn_s": statistics.median(fn),
                "fn_q1_s": statistics.quantiles(fn, n=4)[0],
                "fn_q3_s": statistics.quantiles(fn, n=4)[2],
                "pull_wait_s": statistics.median(wait),
                "compute_s": statistics.median(f - w for f, w in zip(fn, wait, strict=True)),
                "t_iter_s": statistics.median(x["total_s"] for x in recs),
                # the forward's wait for the last server to begin (BSP), which F_N does not count, and
                # how long the pulls had been under way when the forward started, which it does
                "sync_s": statistics.median(max(0.0, -lag) for lag in lags),
                "head_start_s": statistics.median(max(0.0, lag) for lag in lags),
                "predicted_fn_s": pull_time(r.pull_plan.batches, C, Tt, Ts, slowdown=d),
                "predicted_fn_d0_s": pull_time(r.pull_plan.batches, C, Tt, Ts),
                # request mode: the pulls' own time, origin to the last batch in (the model's P_N)
                "pulls_in_s": statistics.median(p)
                if (
                    p := [
                        x["pulls_in_unix"] - o
                        for x, o in zip(recs, origins, strict=True)
                        if x["pulls_in_unix"]
                    ]
                )
                else None,
                "per_rank": per_rank(recs, fn, wait, workers),
                "samples_fn_s": [
                    [x["rank"], x["iteration"], round(f, 6)] for x, f in zip(recs, fn, strict=True)
                ],
            }
        print("RESULT " + json.dumps(out))
    dist.barrier()


def per_rank(recs: list[dict], fn: list[float], wait: list[float], workers: int) -> dict[int, list[float]]:
    """Each worker's medians of ``F_N``, pull wait and forward compute (s), from its steady iterations."""
    out = {}
    for q in range(workers):
        mine = [(f, w) for x, f, w in zip(recs, fn, wait, strict=True) if x["rank"] == q]
        out[q] = [statistics.median(f for f, _ in mine), statistics.median(w for _, w in mine),
                  statistics.median(f - w for f, w in mine)]  # fmt: skip
    return out


def allreduce_replica(args: argparse.Namespace, rank: int, world: int):
    """The all-reduce schedule ``args.allreduce`` (dpcomm's runtime, planned on the workers as ``dpcomm
    train`` does) on the default group, over the same model and batches."""
    from dpcomm.train.config import TrainConfig
    from dpcomm.train.replica import ReplicaContext, check_schedule, make_replica

    cfg = TrainConfig(model=args.model, batch_size=args.batch, lr=0.01, momentum=0.9, schedule=args.allreduce)
    parsed = check_schedule(cfg, args.allreduce)
    return make_replica(
        ReplicaContext(cfg=cfg, schedule=args.allreduce, parsed=parsed, rank=rank, world=world, state=None)
    )


def table(out: dict) -> str:
    lines = [
        "| pull method | batches | F_N measured (ms, median [quartiles]) | F_N model (ms) | model/measured "
        "| model with d = 0 (ms) | pull wait (ms) | forward compute (ms) | BSP sync (ms) | t_iter (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in out["methods"].items():
        n = str(len(r["batches"])) + (f" ({r['algorithm']})" if r["algorithm"] else "")
        lines.append(
            f"| {m} | {n} | {r['fn_s'] * 1e3:.1f} [{r['fn_q1_s'] * 1e3:.1f}, {r['fn_q3_s'] * 1e3:.1f}] | "
            f"{r['predicted_fn_s'] * 1e3:.1f} | {r['predicted_fn_s'] / r['fn_s']:.2f} | "
            f"{r['predicted_fn_d0_s'] * 1e3:.1f} | "
            f"{r['pull_wait_s'] * 1e3:.1f} | {r['compute_s'] * 1e3:.1f} | {r['sync_s'] * 1e3:.1f} | "
            f"{r['t_iter_s'] * 1e3:.1f} |"
        )
    if out.get("allreduce"):
        a = out["allreduce"]
        lines.append(
            f"| all-reduce {a['schedule']} | {a['groups']} groups | | | | | | | | {a['t_iter_s'] * 1e3:.1f} |"
        )
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    from dpcomm.testbed import TestbedConfig, down, launch_workers, parse_rate, up
    from dpcomm.testbed.counters import link_counters

    cfg = TestbedConfig(
        name="h5ps",
        topology=args.topology,
        rate_bps=parse_rate(args.rate),
        mtu=args.mtu,
        queue_ms=args.queue_ms,
        slow_start_after_idle=args.slow_start_after_idle,
        host_queue=args.host_queue,
        cpus=args.cpus,
    )
    load = loadavg()
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    state = up(cfg)
    try:
        argv = ["python", str(Path(__file__).resolve()), "--worker", "--model", args.model]
        argv += ["--batch", str(args.batch), "--iters", str(args.iters), "--rounds", str(args.rounds)]
        argv += [
            "--servers",
            str(args.servers),
            "--pulls",
            args.pulls,
            "--probe-rounds",
            str(args.probe_rounds),
            "--allreduce",
            args.allreduce,
        ]
        argv += ["--unaligned"] if args.unaligned else []
        argv += ["--probe", args.probe]
        ticks = cpu_ticks()
        res = launch_workers(state, argv, timeout_s=args.timeout)
        # the whole run's (set-up, probes, every method): where it nears 1, the cores, not the links, bound
        busy = busy_share(ticks, cpu_ticks())
        text = (res.out_dir / "rank0.out").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            print((res.out_dir / "rank0.err").read_text()[-3000:])
            return 1
        out = json.loads(lines[-1][7:])
        out["cpu_busy"] = busy
        out["drops"] = sum(c["tx_drops"] + c["rx_drops"] for c in link_counters(state).values())
    finally:
        down(cfg.name)
    out.update(
        {
            "model": args.model,
            "batch": args.batch,
            "topology": args.topology,
            "rate": args.rate,
            "mtu": args.mtu,
            "queue_ms": args.queue_ms,
            "slow_start_after_idle": args.slow_start_after_idle,
            "host_queue": args.host_queue,
            "cpus_per_server": args.cpus,
            "iters": args.iters,
            "rounds": args.rounds,
            "aligned_sends": not args.unaligned,
            "pulls": args.pulls,
            "probe_rounds": args.probe_rounds,
            "probe": args.probe,
            "load_before": load,
            "date": datetime.date.today().isoformat(),
        }
    )
    busy_txt = "n/a" if out["cpu_busy"] is None else f"{out['cpu_busy']:.0%} of the run"
    print(
        f"{args.model}, batch {args.batch}, {args.topology} at {args.rate}, MTU {args.mtu}, "
        f"switch-port queue {args.queue_ms:g} ms ({out['drops']} frames dropped in the run), "
        f"slow start after idle {'on' if args.slow_start_after_idle else 'off'}, "
        f"host queue {args.host_queue}, "
        f"{'CPUs shared' if args.cpus is None else f'{args.cpus:g} CPUs per server'}, "
        f"pulls {'on request' if args.pulls == 'request' else 'sent'}"
        f"{', unaligned' if args.unaligned else ''}, "
        f"{out['workers']} workers, {out['servers']} {out['placement']} servers, {args.rounds} rounds of "
        f"{args.iters} iterations per method; load average before {load}; cores busy {busy_txt}; measured Ts "
        f"{out['Ts_s'] * 1e3:.3f} ms, beta {out['beta_s_per_byte'] * 1e9:.2f} ns/B, probe {args.probe}: "
        + (
            f"slowdown d {out['slowdown']:.2f} (optimal's probe {out['slowdown_optimal']:.2f}), "
            if args.probe == "slowdown"
            else "".join(
                f"{m}'s probe {p['probe_s'] * 1e3:.1f} ms against {p['probe_model_s'] * 1e3:.1f} modelled"
                f" ({'kept' if p['confirmed'] else 'refuted'}), "
                for m, p in out["probes"].items()
                if p["probe_s"] is not None
            )
        )
        + f"profiled forward {sum(out['C_s']) * 1e3:.1f} ms, pulls {sum(out['Tt_s']) * 1e3:.1f} ms\n"
    )
    print(table(out))
    if args.json:
        from dpcomm.utils.io import atomic_write_text

        atomic_write_text(args.json, json.dumps(out, indent=1) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topology", default="star:4")
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--queue-ms", type=float, default=20.0, help="switch-port queue (tbf latency)")
    parser.add_argument("--slow-start-after-idle", action="store_true", help="Linux's default (off here)")
    parser.add_argument(
        "--host-queue",
        choices=["fifo", "fair"],
        default="fifo",
        help="server NIC queue (testbed up --host-queue)",
    )
    parser.add_argument("--servers", type=int, default=0, help="dedicated servers (0: co-located)")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=8, help="iterations per method per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--unaligned", action="store_true", help="co-located servers send pulls as each is ready (no barrier)"
    )
    parser.add_argument(
        "--pulls", choices=["send", "request"], default="send", help="servers send, or answer requests"
    )
    parser.add_argument(
        "--allreduce",
        default="mgwfbp",
        help="co-located cases: also time this all-reduce schedule in the same run ('' for none)",
    )
    parser.add_argument(
        "--probe-rounds", type=int, default=5, help="timed pull rounds of the planners' probe"
    )
    parser.add_argument(
        "--probe",
        choices=["confirm", "slowdown", "none"],
        default="confirm",
        help="what the probe of ibatch's and optimal's plan does (PsSpec.probe; none: the paper's model)",
    )
    parser.add_argument(
        "--cpus",
        type=float,
        default=None,
        help="CPU cores per emulated server (testbed up --cpus; default: shared)",
    )
    parser.add_argument("--json", help="write the results here")
    args, extra = parser.parse_known_args()  # the testbed appends --nnodes/--node-rank/.. (read from env)
    if extra and not args.worker:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
