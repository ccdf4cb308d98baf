"""Models FSDP exists for, through ``dpcomm.fsdp.shard`` on ``meta``: the Llama-3-8B- and 70B-shaped models
of ``dpcomm.models.llama`` built under ``torch.device("meta")``, an example ``long[1, T]`` on ``meta``,
``shard(model, "optimal", example=x, memory=total // 10)`` on 2 gloo ranks: planning (units from a forward
and backward on meta, times from FLOPs, the collectives timed and fitted, rank 0's plan at the default
certified gap) and the ``fully_shard`` calls, nothing materialised.

    .venv/bin/python benchmarks/fsdp_meta.py [--models llama3-8b,llama3-70b] [--tokens 4096]

Prints per model and rank the wall time of ``shard`` and the process's peak resident memory (``ru_maxrss``,
GiB), and whether the parameters are still on ``meta``. Goal (issue 48): each under 30 s and 2 GB a rank.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import loadavg  # noqa: E402

GOAL_S, GOAL_GIB = 30.0, 2.0


def _worker(name: str, tokens: int) -> dict:
    import resource
    import time

    import torch

    import dpcomm.fsdp
    from dpcomm.launch import init_worker
    from dpcomm.models.llama import llama

    init_worker()
    torch.set_num_threads(1)
    with torch.device("meta"):
        model = llama(name)
        x = torch.randint(0, 1000, (1, tokens))
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    t0 = time.perf_counter()
    model = dpcomm.fsdp.shard(model, "optimal", example=x, memory=total // 10)
    secs = time.perf_counter() - t0
    plan = model.dpcomm.plan
    return {
        "seconds": secs,
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
        "on_meta": all(p.device.type == "meta" for p in model.parameters()),
        "units": len(plan.units),
        "depth": plan.depth,
    }


def main(argv: list[str] | None = None) -> int:
    from dpcomm.launch import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama3-8b,llama3-70b")
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args(argv)
    ok = True
    print("| model | rank | shard s | peak GiB | on meta | units, depth | load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        load = loadavg()
        for rank, r in enumerate(launch(_worker, 2, name.strip(), args.tokens)):
            good = r["seconds"] < GOAL_S and r["peak_gib"] < GOAL_GIB and r["on_meta"]
            ok &= good
            miss = "" if good else " MISSED"
            print(f"| {name} | {rank} | {r['seconds']:.1f} | {r['peak_gib']:.2f} | {r['on_meta']} | "
                  f"{r['units']}, {r['depth']} | {load}{miss} |", flush=True)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
