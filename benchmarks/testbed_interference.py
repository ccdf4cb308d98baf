"""Does communication on the emulated cluster slow compute? A backward pass alone and beside all-reduces.

    sudo .venv/bin/python benchmarks/testbed_interference.py --rate 80mbit [--mtu 9000]

Needs root. Builds ``star:2`` at ``--rate`` (named ``ti<pid in hex>``, removed at the end) and starts one
worker per server (gloo, one torch thread). Each worker runs GPT-2 tiny's backward pass (batch 96 x 64
tokens) ``--reps`` times alone, then ``--reps`` times beside 10 all-reduces of 0.33 MB issued as backward
starts (3.3 MB in all, the model's gradient), and prints, per pass: the backward's wall time, the time
until the all-reduces are done too, the backward thread's own CPU time (``time.thread_time``) and its
voluntary and involuntary context switches (``/proc/self/task/<tid>/status``); then the all-reduces alone
(wall, this process's CPU time). docs/compile.md reads it: where the thread is preempted about once per
received packet and its own CPU time grows, the slowdown is CPU shared with the network path, and it
falls with fewer, larger packets (``--mtu 9000``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_WORKER = r"""
import json, os, threading, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
rank, world = int(os.environ["DPCOMM_NODE_RANK"]), int(os.environ["DPCOMM_NNODES"])
dist.init_process_group("gloo", init_method="tcp://%s:%s" % (os.environ["DPCOMM_MASTER_ADDR"],
                        os.environ["DPCOMM_MASTER_PORT"]), rank=rank, world_size=world)
from dpcomm.models.zoo import get_model
torch.manual_seed(0)
m, x = get_model("gpt2-tiny"), torch.randint(0, 256, (96, 64))
def switches():
    path = "/proc/self/task/%d/status" % threading.get_native_id()
    d = dict(ln.split(":") for ln in open(path) if "ctxt_switches" in ln)
    return int(d["voluntary_ctxt_switches"]), int(d["nonvoluntary_ctxt_switches"])
n = 830_000
pieces = torch.randn(n).chunk(10)
def one(comm):
    loss = m(x).float().logsumexp(-1).mean()
    dist.barrier()
    s0, c0, t0 = switches(), time.thread_time(), time.perf_counter()
    works = [dist.all_reduce(p, async_op=True) for p in pieces] if comm else []
    loss.backward()
    t1, c1, s1 = time.perf_counter(), time.thread_time(), switches()
    for w in works:
        w.wait()
    t2 = time.perf_counter()
    m.zero_grad(set_to_none=True)
    return {"backward_s": t1 - t0, "until_comm_done_s": t2 - t0, "thread_cpu_s": c1 - c0,
            "voluntary": s1[0] - s0[0], "involuntary": s1[1] - s0[1]}
reps = int(os.environ["TI_REPS"])
one(False)
out = {"rank": rank, "alone": [one(False) for _ in range(reps)], "beside": [one(True) for _ in range(reps)]}
dist.barrier()
c0, t0 = time.process_time(), time.perf_counter()
for _ in range(3):
    for w in [dist.all_reduce(p, async_op=True) for p in pieces]:
        w.wait()
wall, cpu = (time.perf_counter() - t0) / 3, (time.process_time() - c0) / 3
out["comm_alone"] = {"wall_s": wall, "process_cpu_s": cpu}
print(json.dumps(out))
dist.destroy_process_group()
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="80mbit")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None, help="write both workers' results here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from dpcomm.testbed import TestbedConfig, down, launch_workers, load_state, parse_rate, up

    name = f"ti{os.getpid():x}"[:8]
    script = Path(f"/tmp/{name}_worker.py")
    script.write_text(_WORKER)
    try:
        up(TestbedConfig(name=name, topology="star:2", rate_bps=parse_rate(args.rate), mtu=args.mtu))
        res = launch_workers(load_state(name), ["python", str(script)], master_port=29650, timeout_s=600,
                             env={"TI_REPS": str(args.reps)})  # fmt: skip
        if not res.ok:
            print(res.stderr(0)[-2000:], file=sys.stderr)
            return 1
        ranks = [json.loads(res.stdout(r).strip().splitlines()[-1]) for r in range(2)]
    finally:
        down(name)
        script.unlink(missing_ok=True)
    for r in ranks:
        for kind in ("alone", "beside"):
            print(f"rank {r['rank']} {kind:<6} " + "  ".join(
                f"{x['backward_s'] * 1e3:4.0f}/{x['until_comm_done_s'] * 1e3:4.0f} ms "
                f"cpu {x['thread_cpu_s'] * 1e3:4.0f} "
                f"inv {x['involuntary']:4d}" for x in r[kind]))  # fmt: skip
        c = r["comm_alone"]
        print(
            f"rank {r['rank']} all-reduces alone: {c['wall_s'] * 1e3:.0f} ms, "
            f"CPU {c['process_cpu_s'] * 1e3:.0f} ms"
        )
    if args.json:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        meta = {"rate": args.rate, "mtu": args.mtu, "date_utc": when,
                "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])}  # fmt: skip
        Path(args.json).write_text(json.dumps({**meta, "ranks": ranks}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
