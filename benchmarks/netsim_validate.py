"""The flow model against the emulated cluster: docs/testbed.md sections 1-2, simulated with the same links.

    .venv/bin/python benchmarks/netsim_validate.py [--testbed docs/testbed] [--out docs/data]

Reads the measured JSON of docs/testbed.md (``busbw_star4.json``, ``busbw_star4_mst.json``, ``gst.json``,
and ``gst_10gbit.json`` for the CPU time of one call when the links are not the limit), prices every
configuration with :mod:`dpcomm.sim.network` at the measured link rate (100 Mbit/s per direction, MTU 1500:
goodput 95.6% one way, 93.6% with the reverse flow's ACKs; alpha 45.26 us; LP with the block the testbed ran,
the cost model's optimum for ``link_network``), and prints a Markdown table of errors ``(sim - measured) /
measured``. Where the 10 Gbit/s run measured the same call, a second column adds that CPU time to the
simulated transfer time (a measurement, not a fit: it is what the 9 emulated servers cost on 2 cores when the
network is out of the way). Writes ``<out>/netsim_validation.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpcomm.collectives.lp import LinearPipeline
from dpcomm.costmodel.network import PRESETS
from dpcomm.sim.network import FlowModel, make_fabric, simulate_allreduce
from dpcomm.testbed.config import link_network
from dpcomm.utils.io import atomic_write_json, read_json


def _rows(path: Path) -> list[dict]:
    return read_json(path)["rows"]


def validate(testbed: Path) -> list[dict]:
    out = []
    star4 = read_json(testbed / "busbw_star4.json")
    rate, mtu = star4["rate_bps"], star4["mtu"]
    net = link_network(rate, mtu)
    measured = [r for r in star4["rows"] if r["algorithm"] in ("ring", "be", "lp", "lp:network=10gbe")]
    measured += _rows(testbed / "busbw_star4_mst.json")  # MST re-measured after its one-child-per-round fix
    model = FlowModel(make_fabric("star:4", rate), alpha_s=net.alpha)
    for r in measured:
        algo, block = r["algorithm"], None
        if algo.startswith("lp"):
            which = PRESETS["10gbe"] if algo == "lp:network=10gbe" else net
            block = LinearPipeline(network=which).block_size(r["bytes"], 4, "allreduce")
        row, _ = simulate_allreduce(model, algo.split(":")[0], r["bytes"], block_bytes=block)
        out.append(_entry("star:4", algo, r["bytes"], r["median_s"], row.time_s, None))
    gst = read_json(testbed / "gst.json")
    fast = read_json(testbed / "gst_10gbit.json")
    cpu = {
        (part["topology"], x["algorithm"], x["bytes"]): x["median_s"]
        for part in (fast["bcube"], fast["star"])
        for x in part["rows"]
    }
    for part in ("bcube", "star"):
        spec = gst[part]["topology"]
        rate = gst[part]["rate_bps"]
        model = FlowModel(make_fabric(spec, rate), alpha_s=link_network(rate, gst[part]["mtu"]).alpha)
        for r in gst[part]["rows"]:
            algo = {"bcube": "bml", "native": "ring"}.get(r["algorithm"], r["algorithm"])
            row, _ = simulate_allreduce(model, algo, r["bytes"])
            c = cpu.get((spec, r["algorithm"], r["bytes"]))
            out.append(_entry(spec, r["algorithm"], r["bytes"], r["median_s"], row.time_s, c))
    return out


def _entry(topo: str, algo: str, nbytes: int, meas: float, sim: float, cpu: float | None) -> dict:
    return {
        "topology": topo,
        "algorithm": algo,
        "bytes": nbytes,
        "measured_s": meas,
        "simulated_s": sim,
        "error": sim / meas - 1,
        "cpu_10gbit_s": cpu,
        "error_with_cpu": None if cpu is None else (sim + cpu) / meas - 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", default="docs/testbed", help="folder of the measured JSON")
    ap.add_argument("--out", default="docs/data", help="folder for netsim_validation.json")
    args = ap.parse_args()
    rows = validate(Path(args.testbed))
    print("| topology | algorithm | S | measured | flow model | error | + CPU at 10 Gbit/s | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cpu = "" if r["cpu_10gbit_s"] is None else f"{r['simulated_s'] + r['cpu_10gbit_s']:.3f} s"
        err2 = "" if r["error_with_cpu"] is None else f"{r['error_with_cpu']:+.1%}"
        print(
            f"| `{r['topology']}` | {r['algorithm']} | {r['bytes'] / 1e6:g} MB | {r['measured_s']:.3f} s "
            f"| {r['simulated_s']:.3f} s | {r['error']:+.1%} | {cpu} | {err2} |"
        )
    path = atomic_write_json(Path(args.out) / "netsim_validation.json", rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
