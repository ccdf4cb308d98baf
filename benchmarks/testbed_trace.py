"""One allreduce on the emulated cluster, traced: when each rank's point-to-point steps finished, and how busy
server 0's link was every 10 ms (its tbf byte counter). Shows where a synchronous algorithm loses time.

    # ring, 64 MB on star:4 at 100 Mbit/s, under reno and under BBR
    .venv/bin/python benchmarks/testbed_trace.py --algorithm ring --size 64MB --cc reno,bbr \\
        --out docs/testbed/trace_star4_ring.json

Needs root. For each congestion control: builds the testbed ``trace``, launches this script on every server
(``--worker``), which runs one warm-up and ``--repeat`` timed allreduces and records every completed wait of
:class:`dpcomm.collectives._p2p.P2P` (the wrapper below: step, peer, send/receive, start, end, wall clock),
while the parent samples ``tc -s qdisc`` of server 0's NIC; tears the testbed down. Printed per call: wall
time, busbw, the link's wire rate and payload share while the call ran, and per step the slowest rank's
time. The wrapper only observes: it calls the original ``wait`` and adds a clock read per completed wait.
BML (``bcube``) sends on its level groups instead, so those are wrapped the same way (step ``tag<t>/L<l>``:
BML's thread and phase, and the level). Each call also records every server's TCP loss counters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import sigterm_exits

NAME = "trace"  # the testbed's name; --name changes it
EVENTS: list[tuple] = []
TCP_COUNTERS = ("RetransSegs", "TCPTimeouts", "TCPLossProbes", "TCPFastRetrans", "TCPSpuriousRTOs")


def _tcp_counters() -> dict[str, int]:
    """This network namespace's TCP loss counters (``/proc/net/snmp`` and ``netstat``, as ``nstat`` reads)."""
    out: dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        lines = Path(path).read_text().splitlines()
        for head, vals in zip(lines[::2], lines[1::2], strict=False):
            out.update(zip(head.split()[1:], map(int, vals.split()[1:]), strict=False))
    return {k: out.get(k, 0) for k in TCP_COUNTERS}


def _traced_wait() -> None:
    """Record (kind, step, peer, start, end) for every wait of a point-to-point operation."""
    from dpcomm.collectives import _p2p

    original = _p2p.P2P.wait

    def wait(self, *pending):
        for p in pending:
            if p is not None:
                t0 = time.time()
                original(self, p)
                kind = "send" if p.what.startswith("send") else "recv"
                EVENTS.append((kind, str(p.step), p.peer, t0, time.time()))

    _p2p.P2P.wait = wait
    _traced_bcube()


class _TracedGroup:
    """A level group of BML whose ``send``/``recv`` hand back works that record when their wait returned."""

    def __init__(self, pg, level: int) -> None:
        self.pg, self.level = pg, level

    def _op(self, kind: str, bufs, peer: int, tag: int):
        work, t0 = getattr(self.pg, kind)(bufs, peer, tag), time.time()
        step = f"tag{tag}/L{self.level}"  # the tag names BML's thread and phase, the level its step
        group = self

        class _Work:
            def wait(self):
                out = work.wait()
                EVENTS.append((kind, step, f"L{group.level}:{peer}", t0, time.time()))
                return out

        return _Work()

    def send(self, bufs, peer, tag):
        return self._op("send", bufs, peer, tag)

    def recv(self, bufs, peer, tag):
        return self._op("recv", bufs, peer, tag)


def _traced_bcube() -> None:
    """BML's steps run on its level groups inside k threads: record each of their sends and receives."""
    import dataclasses

    from dpcomm.collectives import bcube

    original = bcube.Bcube.level_groups

    def level_groups(self, group=None):
        lg = original(self, group)
        if lg.groups and isinstance(lg.groups[0], _TracedGroup):
            return lg
        return dataclasses.replace(lg, groups=tuple(_TracedGroup(g, i) for i, g in enumerate(lg.groups)))

    bcube.Bcube.level_groups = level_groups


def _worker(algorithm: str, nbytes: int, repeat: int, log_dir: str) -> list[dict]:
    import torch
    import torch.distributed as dist

    from dpcomm.collectives import get
    from dpcomm.launch import init_worker

    _traced_wait()
    rank, world = init_worker(timeout_s=600)
    algo = get(algorithm)
    t = torch.full((nbytes // 4,), float(rank + 1))
    calls = []
    for i in range(repeat + 1):  # call 0 is the warm-up
        t.fill_(1.0)
        dist.barrier()
        EVENTS.clear()
        tcp0 = _tcp_counters()
        t0 = time.time()
        algo.allreduce(t)
        t1 = time.time()
        tcp = {k: v - tcp0[k] for k, v in _tcp_counters().items()}  # this server's losses during the call
        calls.append({"call": i, "start": t0, "end": t1, "waits": list(EVENTS), "tcp": tcp})
    Path(log_dir, f"rank{rank}.json").write_text(json.dumps(calls))
    dist.destroy_process_group()
    return []


def _sample(netns: str, out: list, stop: threading.Event) -> None:
    while not stop.is_set():
        q = subprocess.run(
            ["tc", "-n", netns, "-s", "-j", "qdisc", "show", "dev", "dpc-l0"], capture_output=True, text=True
        ).stdout
        if q.strip():
            out.append((time.time(), json.loads(q)[0]["bytes"]))
        time.sleep(0.01)


def _rate(samples: list, a: float, b: float) -> float | None:
    """Wire bits/s between the first and last samples inside [a, b]."""
    pts = [s for s in samples if a <= s[0] <= b]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return (pts[-1][1] - pts[0][1]) * 8 / (pts[-1][0] - pts[0][0])


def trace(
    topology: str,
    rate: str,
    mtu: int,
    cc: str,
    algorithm: str,
    size: str,
    repeat: int,
    name: str = NAME,
    queue_ms: float = 20.0,
) -> dict:
    from dpcomm.testbed import TestbedConfig, down, launch_workers, load_state, names, parse_rate, up
    from dpcomm.topology import parse_topology
    from dpcomm.utils.sizes import parse_size

    rate_bps, nbytes, p = parse_rate(rate), parse_size(size), parse_topology(topology).servers
    log_dir = tempfile.mkdtemp(prefix="dpcomm-trace-")
    down(name)
    cfg = TestbedConfig(
        name=name, topology=topology, rate_bps=rate_bps, mtu=mtu, congestion_control=cc, queue_ms=queue_ms
    )
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    up(cfg)
    load = [" ".join(open("/proc/loadavg").read().split()[:3])]
    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(names.host_ns(name, 0), samples, stop), daemon=True)
    try:
        sampler.start()
        res = launch_workers(
            load_state(name),
            ["python", os.path.abspath(__file__), "--worker", "--algorithm", algorithm, "--size", size]
            + ["--repeat", str(repeat), "--log-dir", log_dir],
            master_port=29470,
            timeout_s=900,
            out_dir=log_dir,
        )
    finally:
        stop.set()
        sampler.join()
        down(name)
    load.append(" ".join(open("/proc/loadavg").read().split()[:3]))
    if not res.ok:
        raise SystemExit(f"launch failed {res.returncodes}: {res.stderr(0)[-400:]}")
    ranks = [json.loads((res.out_dir / f"rank{r}.json").read_text()) for r in range(p)]
    calls = []
    for i in range(1, repeat + 1):
        start = min(r[i]["start"] for r in ranks)
        end = max(r[i]["end"] for r in ranks)
        wire = _rate(samples, start, end)
        steps: dict[str, float] = {}  # step -> slowest rank's receive end, seconds after the call started
        for r in ranks:
            for kind, step, _peer, _t0, t1 in r[i]["waits"]:
                if kind == "recv":
                    steps[step] = max(steps.get(step, 0.0), t1 - start)
        calls.append(
            {
                "seconds": end - start,
                "busbw_bps": 2 * (p - 1) / p * nbytes * 8 / (end - start),
                "host0_wire_bps": wire,
                "step_done_s": steps,
                "ranks": [r[i]["waits"] for r in ranks],
                "tcp": {k: sum(r[i]["tcp"][k] for r in ranks) for k in TCP_COUNTERS},  # all servers
                "start": start,
            }
        )
    return {"cc": cc, "queue_ms": queue_ms, "loadavg": load, "calls": calls, "host0_tx_samples": samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="star:4")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--cc", default="reno", help="comma list of TCP congestion controls to compare")
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--size", default="64MB")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--queue-ms", type=float, default=20.0, help="switch-port queue (tbf latency), ms")
    p.add_argument("--name", default=NAME, help="testbed name (unique among testbeds up at the same time)")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log-dir", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.worker:
        from dpcomm.launch import add_launch_arguments, launch, launch_options_from_args
        from dpcomm.utils.sizes import parse_size

        q = argparse.ArgumentParser()
        add_launch_arguments(q, required=True)
        q.add_argument("--nproc", type=int, default=1)
        opts = launch_options_from_args(q.parse_args(rest))
        launch(_worker, opts, args.algorithm, parse_size(args.size), args.repeat, args.log_dir)
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from dpcomm.testbed.config import parse_rate, tcp_ceiling

    result = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "algorithm": args.algorithm,
        "size": args.size,
        "runs": [],
    }
    for cc in args.cc.split(","):
        run = trace(
            args.topology,
            args.rate,
            args.mtu,
            cc,
            args.algorithm,
            args.size,
            args.repeat,
            args.name,
            args.queue_ms,
        )
        result["runs"].append(run)
        rate = parse_rate(args.rate)
        print(
            f"# {args.algorithm} {args.size} on {args.topology} at {args.rate}, TCP {cc}; "
            f"load {run['loadavg']}"
        )
        for c in run["calls"]:
            w, bw = c["host0_wire_bps"] or 0.0, c["busbw_bps"]
            print(
                f"  {c['seconds']:.3f} s, busbw {bw / 1e6:.1f} Mbit/s ({bw / rate:.1%} of the rate, "
                f"{bw / rate / tcp_ceiling(args.mtu):.1%} of the TCP ceiling); "
                f"server 0 link busy {w / rate:.1%}"
            )
            done = sorted(c["step_done_s"].items(), key=lambda kv: kv[1])
            prev, parts = 0.0, []
            for step, t in done:
                parts.append(f"{step}:{t - prev:.3f}")
                prev = t
            print("    step durations (slowest rank) s:", " ".join(parts))
            print("    TCP, all servers:", " ".join(f"{k} {v}" for k, v in c["tcp"].items()))
        print(f"    median call {statistics.median(c['seconds'] for c in run['calls']):.3f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
