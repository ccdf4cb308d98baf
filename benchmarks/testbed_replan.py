"""Online re-planning on the emulated cluster: change the link rate under a running ``dpcomm train``.

    sudo .venv/bin/python benchmarks/testbed_replan.py --rate 100mbit --change 12:10mbit
    sudo .venv/bin/python benchmarks/testbed_replan.py --rate 10mbit --change 12:100mbit

Builds ``star:4`` at ``--rate`` (testbed ``--name``, removed at the end whatever happens), starts
``dpcomm testbed launch -- dpcomm train --model resnet20 --schedule mgwfbp --replan-every K ...`` and, from
this process, for each ``--change SECONDS:RATE``, that many seconds after training traffic began
``dpcomm testbed rate --rate RATE`` (as another shell would). Training began when server 0 has sent
``--start-bytes`` (default 2 MB: the initial parameter broadcast and the first all-reduce of ResNet-20), read
from the tbf byte counters; worker start-up takes 6-25 s on the loaded 2-core VM, so a clock from the launch
would not say which iterations run at which rate. Saves the command lines, the machine's load,
the times of the changes, rank 0's log and its per-iteration records (``end_unix`` lines them up with the
changes; ``rate`` says which rate each iteration ended under) as JSON (``--out``), and prints the re-plan
lines and the median iteration time of each steady stretch between re-plans.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import loadavg, sigterm_exits
from dpcomm.testbed import TestbedConfig, down, link_counters, load_state, parse_rate, up
from dpcomm.utils.io import atomic_write_json

DEFAULT_CHANGES = ["12:10mbit"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="h7bdemo", help="testbed name (default h7bdemo)")
    ap.add_argument("--rate", default="100mbit", help="link rate at start")
    ap.add_argument(
        "--change", action="append", default=None, metavar="SECONDS:RATE",
        help=f"set every link to RATE SECONDS after training began (repeatable; default {DEFAULT_CHANGES})",
    )  # fmt: skip
    ap.add_argument("--start-bytes", type=float, default=2e6, help="server 0 bytes sent: training began")
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--schedule", default="mgwfbp", help="mgwfbp, optimal, ddp:mgwfbp, ...")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--replan-every", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", default="docs/data/testbed_replan.json")
    a = ap.parse_args()
    changes = [(float(c.split(":")[0]), c.split(":")[1]) for c in a.change or DEFAULT_CHANGES]
    for _, r in changes:
        parse_rate(r)  # a bad rate fails here, before the testbed exists
    dpcomm = [sys.executable, "-m", "dpcomm"]
    records = Path(tempfile.mkdtemp(prefix="replan-")) / "records.json"
    train = ["dpcomm", "train", "--model", a.model, "--schedule", a.schedule, "--replan-every",
             str(a.replan_every), "--iters", str(a.iters), "--batch-size", str(a.batch_size),
             "--verify-iters", "0", "--threads", "1", "--timeout", "300",
             "--records-json", str(records)]  # fmt: skip
    launch = [*dpcomm, "testbed", "launch", "--name", a.name, "--", *train]
    down(a.name)
    sigterm_exits()  # a killed run still takes its testbed down (finally)
    up(TestbedConfig(name=a.name, topology="star:4", rate_bps=parse_rate(a.rate)))
    done: list[tuple[float, str, str]] = []  # (unix time, rate, the tool's output)
    try:
        load_before = loadavg()
        t0 = time.time()
        proc = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        state = load_state(a.name)
        while proc.poll() is None and link_counters(state)[(0, 0)]["tx"] < a.start_bytes:
            time.sleep(0.2)
        t_start = time.time()
        for at, rate in changes:
            try:
                proc.wait(timeout=max(0.0, t_start + at - time.time()))
            except subprocess.TimeoutExpired:
                pass
            cmd = [*dpcomm, "testbed", "rate", "--name", a.name, "--rate", rate]
            res = subprocess.run(cmd, capture_output=True, text=True)
            done.append((time.time(), rate, (res.stdout + res.stderr).strip()))
        out, err = proc.communicate(timeout=1800)
        load_after = loadavg()
    finally:
        down(a.name)
    if proc.returncode != 0 or not records.exists():
        print(f"launch failed ({proc.returncode}): {err.strip().splitlines()[-3:]}", file=sys.stderr)
        return 1
    data = json.loads(records.read_text())
    recs = data["records"]
    for r in recs:
        r["rate"] = a.rate
        for when, rate, _ in done:
            if r.get("end_unix", 0) > when:
                r["rate"] = rate
    result = {
        "machine": "2-core CPU VM",
        "topology": "star:4",
        "rate": a.rate,
        "command": f"dpcomm testbed launch --name {a.name} -- " + " ".join(train),
        "changes": [
            {
                "after_s": w - t_start,
                "unix": w,
                "rate": r,
                "output": o,
                "command": f"dpcomm testbed rate --name {a.name} --rate {r}",
            }
            for w, r, o in done
        ],  # fmt: skip
        "training_began_after_s": t_start - t0,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "log": data["log"],
        "plan": data["plan"],
        "records": recs,
        "stdout": out,
    }
    atomic_write_json(a.out, result)
    for line in data["log"]:
        if "re-plan at" in line or line.split("] ", 1)[-1].startswith(("plan ", "measured t_f")):
            print(line)
    print(f"training began {t_start - t0:.1f} s after the launch")
    for w, _, o in done:
        print(f"{w - t_start:.1f} s later: {o}")
    _segments(recs)
    print(f"load {load_before} -> {load_after}; saved {a.out}")
    return 0


def _segments(recs: list[dict]) -> None:
    """Median steady iteration time per stretch between profiling phases, and the rates they ran under."""
    seg: list[dict] = []
    for r in [*recs, {"phase": "profile"}]:
        if r["phase"] == "steady":
            seg.append(r)
        elif seg:
            med = statistics.median(x["total_s"] for x in seg)
            rates = ", ".join(f"{n} at {r}" for r, n in Counter(x["rate"] for x in seg).items())
            span = f"{seg[0]['iteration']}-{seg[-1]['iteration']}"
            print(f"iterations {span}: median t_iter {med * 1e3:.0f} ms ({rates})")
            seg = []


if __name__ == "__main__":
    sys.exit(main())
