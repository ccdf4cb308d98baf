"""Allreduce on the emulated cluster: busbw against the link rate, and BML's GST against a PS.

    # ring/lp/be/mst/native busbw on star:4 (links, not the CPUs, must be the bottleneck: low rate)
    .venv/bin/python benchmarks/testbed_allreduce.py busbw --rate 100mbit --sizes 1MB,4MB,16MB,64MB
    # BML (bcube on bcube:3,2) against the P2P parameter server (ps on star:9), same per-NIC rate
    .venv/bin/python benchmarks/testbed_allreduce.py gst --rate 100mbit --sizes 12500000,50000000

Needs root (``dpcomm testbed``). Each part builds its testbed (name ``bench``), launches
``dpcomm bench`` on every server (``--repeat`` times), tears the testbed down, prints measured numbers next to
the theory and writes JSON (``--out``). Theory, with ``r`` the link rate and ``S`` the message:

- the TCP ceiling: a 1500-byte MTU frame (1514 B on the wire, as tbf counts it) carries 1448 payload bytes,
  so goodput <= ``r * 1448 / 1514`` = 95.6% of ``r``; the duplex ceiling: where a NIC also receives at full
  rate (every rank of an allreduce does), its link also carries the ACKs of the incoming flow, one 66-byte
  frame per two segments (delayed ACK, RFC 5681 sec. 4.2), so goodput <= ``r * 1448 / (1514 + 33)`` = 93.6%;
- busbw = ``2 (P-1)/P * S / t`` (every bandwidth-optimal allreduce sends that much per rank);
- BML paper: ``T_F = 8 S / r``; PS on a Fat-Tree ``GST = 2 (N-1)/N T_F``; BML on BCube(n,k)
  ``GST = 2 (N-1)/(k N) T_F``; ratio ``1/k``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from _common import loadavg, sigterm_exits
from dpcomm.testbed import TestbedConfig, down, launch_workers, names, parse_rate, qdiscs, up
from dpcomm.topology import parse_topology
from dpcomm.utils.sizes import parse_size

NAME = "bench"  # the testbed's name; --name changes it (testbeds of others running at the same time)


def _ceiling(mtu: int) -> float:
    return (mtu - 52) / (mtu + 14)  # TCP payload (MTU - 20 IP - 32 TCP with timestamps) per tbf-counted frame


def _duplex_ceiling(mtu: int) -> float:
    return (mtu - 52) / (mtu + 14 + 66 / 2)  # plus half a 66-byte ACK frame per segment of the reverse flow


def _sample(netns: str, out: list, stop: threading.Event, period_s: float = 0.05) -> None:
    """Every ``period_s``: (seconds, {NIC: tx bytes}) of server 0, to draw its links' use over time."""
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            q = qdiscs(netns)
        except Exception:  # the namespace is not there yet or any more
            q = {}
        out.append((round(time.monotonic() - t0, 3), {dev: v["bytes"] for dev, v in q.items()}))
        time.sleep(period_s)


def _losses(state: dict) -> dict:
    """Frames the switch ports and NICs dropped and segments TCP retransmitted, over the whole run."""
    import subprocess

    from dpcomm.testbed import link_counters

    links = link_counters(state).values()
    retrans = 0
    for srv in state["servers"]:
        out = subprocess.run(
            ["ip", "netns", "exec", srv["netns"], "nstat", "-az", "TcpRetransSegs"],
            capture_output=True,
            text=True,
        ).stdout.split()
        retrans += int(out[out.index("TcpRetransSegs") + 1]) if "TcpRetransSegs" in out else 0
    return {
        "switch_port_drops": sum(c["rx_drops"] for c in links),
        "nic_drops": sum(c["tx_drops"] for c in links),
        "frames_sent": sum(c["tx"] for c in links) // 1514,
        "tcp_retransmitted_segments": retrans,
    }


def measure(
    topology: str,
    rate_bps: int,
    algorithms: list[str],
    sizes: list[str],
    repeat: int,
    mtu: int = 1500,
    port: int = 29450,
    congestion_control: str = "reno",
    queue_ms: float = 20.0,
    name: str = NAME,
) -> dict:
    """Build ``topology``, time ``algorithms`` x ``sizes`` on it, tear it down; returns rows and context."""
    down(name)
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    up(
        TestbedConfig(
            name=name,
            topology=topology,
            rate_bps=rate_bps,
            mtu=mtu,
            congestion_control=congestion_control,
            queue_ms=queue_ms,
        )
    )
    load_before = loadavg()
    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(names.host_ns(name, 0), samples, stop), daemon=True)
    sampler.start()
    try:
        from dpcomm.testbed import load_state

        # `repeat` launches of `dpcomm bench` (one warm-up call checked against torch.distributed, then one
        # call timed after a barrier, as the slowest rank saw it): each row keeps every launch's time
        runs, seconds = [], 0.0
        for _ in range(repeat):
            res = launch_workers(
                load_state(name),
                [
                    "python",
                    "-m",
                    "dpcomm",
                    "bench",
                    "--ops",
                    "allreduce",
                    "--algos",
                    ",".join(algorithms),
                    "--sizes",
                    ",".join(sizes),
                    "--iters",
                    "1",
                    "--warmup",
                    "1",
                    "--check",
                    "--json",
                    "--timeout",
                    "600",
                ],
                master_port=port,
                timeout_s=1800,
            )
            seconds += res.seconds
            if not res.ok:
                break
            runs.append(json.loads(res.stdout(0).strip().splitlines()[-1]))
        losses = _losses(load_state(name))
    finally:
        stop.set()
        sampler.join()
        down(name)
    if not res.ok:
        tail = [line for i in range(len(res.returncodes)) for line in res.stderr(i).splitlines()[-2:]]
        raise SystemExit(f"launch failed {res.returncodes}: {' | '.join(tail[-4:])}")
    rows = [
        {
            "algorithm": first["algo"],
            "bytes": first["bytes"],
            "world": first["nproc"],
            "exact": all(run[i]["check"] == "ok" for run in runs),
            "seconds": [run[i]["time_s"] for run in runs],
        }
        for i, first in enumerate(runs[0])
    ]
    return {
        "host0_tx_samples": samples,
        "losses": losses,
        "topology": topology,
        "rate_bps": rate_bps,
        "mtu": mtu,
        "congestion_control": congestion_control,
        "queue_ms": queue_ms,
        "rows": rows,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "seconds": seconds,
    }


def busbw(args: argparse.Namespace) -> dict:
    rate = parse_rate(args.rate)
    out = measure(
        args.topology,
        rate,
        args.algorithms.split(","),
        args.sizes.split(","),
        args.repeat,
        args.mtu,
        congestion_control=args.cc,
        queue_ms=args.queue_ms,
        name=args.name,
    )
    p = parse_topology(args.topology).servers
    ceiling, duplex = _ceiling(args.mtu), _duplex_ceiling(args.mtu)
    print(
        f"# busbw on {args.topology} at {args.rate} (MTU {args.mtu}: TCP ceiling {ceiling:.1%} of the rate, "
        f"duplex {duplex:.1%}; TCP {args.cc}); "
        f"load {out['loadavg_before']} -> {out['loadavg_after']}"
    )
    print(
        f"{'algorithm':>10} {'bytes':>11} {'median s':>9} {'busbw Mbit/s':>13} {'of rate':>8} "
        f"{'of ceiling':>10} {'of duplex':>9} exact"
    )
    for row in out["rows"]:
        t = statistics.median(row["seconds"])
        bw = 2 * (p - 1) / p * row["bytes"] * 8 / t
        row.update(median_s=t, busbw_bps=bw, of_rate=bw / rate, of_ceiling=bw / (rate * ceiling))
        row["of_duplex_ceiling"] = bw / (rate * duplex)
        print(
            f"{row['algorithm']:>10} {row['bytes']:>11} {t:9.3f} {bw / 1e6:13.1f} {bw / rate:8.1%} "
            f"{bw / rate / ceiling:10.1%} {bw / rate / duplex:9.1%} {row['exact']}"
        )
    out["ceiling"], out["duplex_ceiling"] = ceiling, duplex
    return out


def gst(args: argparse.Namespace) -> dict:
    rate = parse_rate(args.rate)
    sizes = args.sizes.split(",")
    bml = measure(
        args.bcube,
        rate,
        args.bml_algorithms.split(","),
        sizes,
        args.repeat,
        args.mtu,
        29451,
        args.cc,
        args.queue_ms,
        args.name,
    )
    n_servers = parse_topology(args.bcube).servers
    k = parse_topology(args.bcube).nics_per_server
    star = measure(
        f"star:{n_servers}",
        rate,
        args.ps_algorithms.split(","),
        sizes,
        args.repeat,
        args.mtu,
        29452,
        args.cc,
        args.queue_ms,
        args.name,
    )
    ceiling = _ceiling(args.mtu)
    print(
        f"# GST: {args.bcube} vs star:{n_servers} at {args.rate} per NIC; TCP ceiling {ceiling:.1%}; "
        f"load {bml['loadavg_before']} .. {star['loadavg_after']}"
    )
    table = []
    for s in sizes:
        nbytes = parse_size(s)
        t_f = nbytes * 8 / rate
        th_ps, th_bml = 2 * (n_servers - 1) / n_servers * t_f, 2 * (n_servers - 1) / (k * n_servers) * t_f
        med = {}
        for part, tag in ((bml, args.bcube), (star, f"star:{n_servers}")):
            for row in part["rows"]:
                if abs(row["bytes"] - nbytes) <= 4:
                    med[(row["algorithm"], tag)] = statistics.median(row["seconds"])
                    row["median_s"] = med[(row["algorithm"], tag)]
        ps_t = med.get(("ps", f"star:{n_servers}"))
        bml_t = med.get(("bcube", args.bcube))
        entry = {
            "bytes": nbytes,
            "T_F": t_f,
            "theory_ps": th_ps,
            "theory_bml": th_bml,
            "measured": {f"{a}@{t}": v for (a, t), v in med.items()},
            "ratio_bml_ps": (bml_t / ps_t) if ps_t and bml_t else None,
        }
        table.append(entry)
        print(
            f"S={nbytes / 1e6:.1f} MB: T_F={t_f:.3f} s; theory PS {th_ps:.3f} s (TCP {th_ps / ceiling:.3f}), "
            f"BML {th_bml:.3f} s (TCP {th_bml / ceiling:.3f}), ratio {1 / k:.2f}"
        )
        for (a, t), v in sorted(med.items()):
            print(f"    {a:>8} on {t:<10} {v:8.3f} s")
        if entry["ratio_bml_ps"]:
            print(f"    measured ratio bcube/ps = {entry['ratio_bml_ps']:.3f}")
    return {"bcube": bml, "star": star, "table": table}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    b = sub.add_parser("busbw")
    b.add_argument("--topology", default="star:4")
    b.add_argument("--rate", default="100mbit")
    b.add_argument("--algorithms", default="ring,lp,be,mst,native")
    b.add_argument("--sizes", default="1MB,4MB,16MB,64MB")
    g = sub.add_parser("gst")
    g.add_argument("--bcube", default="bcube:3,2")
    g.add_argument("--rate", default="100mbit")
    g.add_argument(
        "--sizes", default="12500000,50000000", help="bytes: T_F = 1 s and 4 s at 100 Mbit/s; MB = 2**20"
    )
    g.add_argument("--bml-algorithms", default="bcube,ps")
    g.add_argument("--ps-algorithms", default="ps,native")
    for q in (b, g):
        q.add_argument("--repeat", type=int, default=3)
        q.add_argument("--mtu", type=int, default=1500)
        q.add_argument("--cc", default="reno", help="TCP congestion control in the namespaces (reno, bbr)")
        q.add_argument("--queue-ms", type=float, default=20.0, help="switch-port queue (tbf latency), ms")
        q.add_argument(
            "--name", default=NAME, help="testbed name (unique among testbeds up at the same time)"
        )
        q.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    result = busbw(args) if args.part == "busbw" else gst(args)
    result["command"] = " ".join(sys.argv)
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
