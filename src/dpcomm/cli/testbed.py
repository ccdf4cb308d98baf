"""Emulated cluster on this machine: network namespaces as servers, Linux bridges as switches, tbf-capped
veth links (BML paper section 4.2's testbed, scaled down). Needs root and iproute2.

  dpcomm testbed up --topology bcube:3,2 --rate 100mbit      build it (name 'tb' unless --name)
  dpcomm testbed status                                      hosts, NICs, addresses, rates, byte counters
  dpcomm testbed exec h0 -- ip addr                          run a command in server 0
  dpcomm testbed launch -- dpcomm train ...                  one worker per server, rank 0's output
  dpcomm testbed rate --rate 10mbit [--server 2]             change the link rate of a running testbed
  dpcomm testbed down                                        remove everything (also after a crash)
"""

from __future__ import annotations

import argparse
import json
import sys

from dpcomm.errors import UserError

COMMAND = "testbed"
HELP = "emulated cluster in network namespaces: up, status, exec, launch, rate, down (root)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("up", help="build the emulated cluster")
    p.add_argument("--topology", required=True, help="star:N or bcube:n,k")
    p.add_argument("--rate", default="500mbit", help="per-direction link rate, e.g. 100mbit, 1gbit")
    p.add_argument("--name", default="tb", help="testbed name (1-8 of a-z0-9); default tb")
    p.add_argument("--mtu", type=int, default=1500, help="MTU of every link (default 1500)")
    p.add_argument("--queue-ms", type=float, default=20.0, help="tbf queue (latency), ms (default 20)")
    p.add_argument("--burst", type=int, default=None, help="tbf bucket, bytes (default max(1 ms, 64 KiB))")
    p.add_argument(
        "--host-queue",
        default="fifo",
        help="a server NIC's queue: fifo (one queue; default) or fair (one per destination, round robin)",
    )
    p.add_argument(
        "--cpus",
        type=float,
        default=None,
        help="CPU cores per server (a CFS quota on its processes; default: no cap, servers share the cores)",
    )
    p.add_argument(
        "--gpus-per-server",
        type=int,
        default=1,
        help="ranks per server, sharing its NIC and talking over its loopback (launch gives --nproc G)",
    )
    p.add_argument(
        "--intra-rate",
        default=None,
        help="rate of each server's loopback, both directions together, e.g. 400mbit (default: unshaped)",
    )
    p.add_argument("--cc", default="reno", help="TCP congestion control in every server (default reno)")
    p.add_argument(
        "--no-slow-start-after-idle",
        dest="slow_start_after_idle",
        action="store_false",
        help="keep TCP windows across idle time (net.ipv4.tcp_slow_start_after_idle=0; default: Linux's 1)",
    )
    p.add_argument("--json", action="store_true", help="print the state as JSON")
    p = sub.add_parser("down", help="remove a testbed (default: every dpc- testbed); idempotent")
    p.add_argument("--name", default=None, help="only this testbed (1-8 of a-z0-9)")
    p = sub.add_parser("status", help="show a testbed: hosts, NICs, addresses, rates, byte counters")
    p.add_argument("--name", default="tb")
    p.add_argument("--json", action="store_true", help="print the state and counters as JSON")
    p = sub.add_parser("exec", help="run a command in one server: exec HOST -- CMD...")
    p.add_argument("--name", default="tb")
    p.add_argument("host", help="server index, hN, or namespace name")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    p = sub.add_parser("launch", help="start CMD once per server as a multi-node job: launch -- CMD...")
    p.add_argument("--name", default="tb")
    p.add_argument(
        "--master-port", type=int, default=29400, help="rendezvous port on server 0 (default 29400)"
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="stop the workers after this many seconds")
    p.add_argument("--out-dir", default=None, help="where rank<i>.out/.err go (default: a new temp folder)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- dpcomm train ...")
    p = sub.add_parser("rate", help="change the link rate of a running testbed (tc qdisc change ... tbf)")
    p.add_argument("--name", default="tb")
    p.add_argument("--rate", required=True, help="new per-direction link rate, e.g. 10mbit, 1gbit")
    p.add_argument("--server", type=int, default=None, help="only this server's links (default: all)")


def _strip(cmd: list[str]) -> list[str]:
    return cmd[1:] if cmd and cmd[0] == "--" else cmd


def _check_out_dir(text: str) -> None:
    """``--out-dir``: an existing folder, or a new one in a folder that exists (never a tree of new ones)."""
    from pathlib import Path

    p = Path(text)
    if p.exists() and not p.is_dir():
        raise UserError(f"--out-dir {text}: is not a folder")
    if not p.exists() and not p.absolute().parent.is_dir():
        raise UserError(f"--out-dir {text}: no folder {p.absolute().parent} (create it first)")


def run(args: argparse.Namespace) -> int:
    from dpcomm.testbed import build, status
    from dpcomm.testbed import run as tbrun
    from dpcomm.testbed.config import TestbedConfig, format_rate, parse_rate
    from dpcomm.testbed.names import check_name
    from dpcomm.testbed.state import load_state

    if args.name is not None:  # every action, before anything is read, run or removed
        check_name(args.name)
    new_rate = parse_rate(args.rate) if args.action == "rate" else None  # before any state is read
    if args.action == "up":
        cfg = TestbedConfig(
            name=args.name,
            topology=args.topology,
            rate_bps=parse_rate(args.rate),
            mtu=args.mtu,
            queue_ms=args.queue_ms,
            burst_bytes=args.burst,
            congestion_control=args.cc,
            host_queue=args.host_queue,
            cpus=args.cpus,
            slow_start_after_idle=args.slow_start_after_idle,
            gpus=args.gpus_per_server,
            intra_rate_bps=parse_rate(args.intra_rate) if args.intra_rate else None,
        )
        state = build.up(cfg)
        if args.json:
            print(json.dumps(state, indent=1))
        else:
            status.print_status(state, counters=False)
        return 0
    if args.action == "down":
        removed = build.down(args.name)
        print(f"removed {len(removed)}: {' '.join(removed)}" if removed else "nothing to remove")
        return 0
    state = load_state(args.name)
    if args.action == "status":
        if args.json:
            print(json.dumps(status.status_dict(state), indent=1))
        else:
            status.print_status(state, counters=True)
        return 0
    if args.action == "rate":
        from dpcomm.testbed.rate import set_rate

        set_rate(state, new_rate, args.server)
        where = f"server {args.server}'s links" if args.server is not None else "every link"
        print(f"testbed {args.name}: {where} now {format_rate(new_rate)} each direction")
        return 0
    if args.action == "exec":
        return tbrun.exec_in(state, args.host, _strip(args.cmd))
    if args.action == "launch":
        cmd = _strip(args.cmd)
        if not cmd:
            raise UserError("nothing to launch: give the command after --, e.g. -- dpcomm train ...")
        _check_dpcomm_command(cmd)
        if args.out_dir is not None:  # the folder itself may be new, the one it goes in must exist
            _check_out_dir(args.out_dir)
        res = tbrun.launch_workers(
            state, cmd, master_port=args.master_port, timeout_s=args.timeout, out_dir=args.out_dir
        )
        sys.stdout.write(res.stdout(0))
        bad = {i: rc for i, rc in enumerate(res.returncodes) if rc != 0}
        print(
            f"testbed launch: {len(res.returncodes)} workers, exit codes {res.returncodes}, "
            f"{res.seconds:.1f} s, outputs in {res.out_dir}",
            file=sys.stderr,
        )
        if bad:
            first = min(bad)
            tail = res.stderr(first).strip().splitlines()
            print(f"rank {first} failed: {tail[-1] if tail else f'exit {bad[first]}'}", file=sys.stderr)
            return 1
        return 0
    raise UserError(f"unknown action {args.action}")


def _check_dpcomm_command(argv: list[str]) -> None:
    """A ``dpcomm SUB`` without the multi-node flags would fail on every server: say so once, up front."""
    from dpcomm.cli.main import command_parser
    from dpcomm.launch import takes_launch_arguments
    from dpcomm.testbed.run import PLACEHOLDERS

    if len(argv) < 2 or argv[0] != "dpcomm" or any(ph in a for a in argv for ph in PLACEHOLDERS):
        return
    sub = command_parser(argv[1])
    if sub is not None and not takes_launch_arguments(sub):
        raise UserError(
            f"`dpcomm {argv[1]}` has no --nnodes/--node-rank/--master-addr/--master-port, so it cannot run "
            "across the servers; use `dpcomm bench` (collectives) or placeholders"
        )
