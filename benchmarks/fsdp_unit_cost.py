"""FSDP2's fixed cost of a unit per pass, the model's ``c`` (:mod:`dpcomm.planner.fsdp_unit`), measured here.

One rank (a gloo group of one in this process, or NCCL on one GPU with ``--device cuda``), so no byte moves
between ranks: a stack of ``--layers`` small ``nn.Linear`` (``--width`` square, zero weights: no random
numbers drawn) trained forward and backward with ``fully_shard`` on the whole stack (1 unit) and on every
layer (``--layers`` units, the root holding nothing), ``--iters`` timed iterations each after 3 warm-ups,
interleaved; the cost is the difference of the medians per extra unit per pass::

    c = (t_n - t_1) / (n - 1) / 2

    .venv/bin/python benchmarks/fsdp_unit_cost.py [--layers 16] [--width 64] [--iters 30] [--device cpu]

Prints both medians and ``c`` in microseconds, and the load average (the cost is CPU time: measure on a
quiet machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import loadavg  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from dpcomm.timing import now

    torch.set_num_threads(1)
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")

    def stack(units: bool) -> nn.Module:
        model = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers))).to(dev)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        if units:
            for layer in model:
                fully_shard(layer)
        fully_shard(model)
        if args.device == "cpu":
            for m in model.modules():
                if hasattr(m, "_set_unshard_async_op"):
                    m._set_unshard_async_op(True)  # as dpcomm.fsdp.shard runs FSDP2 on CPU
        return model

    models = {1: stack(False), args.layers: stack(True)}
    x = torch.ones(8, args.width, device=dev)
    times: dict[int, list[float]] = {k: [] for k in models}
    for step in range(3 + args.iters):
        for k, model in models.items():
            t0 = now(dev)
            model(x).sum().backward()
            t1 = now(dev)
            if step >= 3:
                times[k].append(t1 - t0)
    t1, tn = (statistics.median(times[k]) for k in (1, args.layers))
    c = (tn - t1) / (args.layers - 1) / 2
    print(f"device {args.device}, torch {torch.__version__}, load average {loadavg()}")
    print(f"1 unit: {t1 * 1e6:.1f} us; {args.layers} units: {tn * 1e6:.1f} us (median of {args.iters})")
    print(f"fixed cost per unit per pass c = {c * 1e6:.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
