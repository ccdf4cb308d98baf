"""How one server's link is shared between two connections, by host queue and GSO (``docs/testbed.md``).

    sudo .venv/bin/python benchmarks/testbed_host_queue.py --repeats 2

For each variant, builds ``star:3`` at ``--rate`` (MTU 9000, slow start after idle off), has server 2 send
8 MB to server 0 and, 0.1 s later, 4 MB to server 1 (:func:`dpcomm.testbed.flows.send_from`), and prints the
second connection's rate: half the link (99.3% TCP goodput over two) is an even share. The variants: the
host queue ``fifo`` or ``fair`` (``testbed up --host-queue``), each with GSO as the testbed leaves it
(``fifo``: on; ``fair``: ``gso_max_segs 1``) and the other way round.
"""

from __future__ import annotations

import argparse
import json

from _common import loadavg, sigterm_exits

VARIANTS = [("fifo", True), ("fair", False), ("fair", True), ("fifo", False)]  # (host queue, GSO on)


def main() -> int:
    from dpcomm.testbed import TestbedConfig, down, names, parse_rate, up
    from dpcomm.testbed.flows import send_from
    from dpcomm.testbed.shell import batch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    sigterm_exits()
    rate = parse_rate(args.rate)
    results = []
    for queue, gso in VARIANTS:
        cfg = TestbedConfig(name="hqb", topology="star:3", rate_bps=rate, mtu=9000, host_queue=queue,
                            slow_start_after_idle=False)  # fmt: skip
        load = loadavg()
        state = up(cfg)
        try:
            segs = 65535 if gso else 1  # 65535: the kernel's default for a veth
            batch("ip", state["servers"][2]["netns"], [f"link set dev {names.nic(0)} gso_max_segs {segs}"])
            mbit = []
            for _ in range(args.repeats):
                seconds = send_from(state, 2, [(0, 8_000_000, 0.0), (1, 4_000_000, 0.1)])
                mbit.append(4_000_000 * 8 / seconds[1] / 1e6)
        finally:
            down(cfg.name)
        results.append({"host_queue": queue, "gso": gso, "second_mbit_s": mbit, "load_before": load})
        got = ", ".join(f"{m:.1f}" for m in mbit)
        print(f"host queue {queue}, GSO {'on' if gso else 'off'}: the second connection got {got} Mbit/s "
              f"of {rate / 1e6:g} (load before {load})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rate_bps": rate, "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
