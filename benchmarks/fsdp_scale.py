"""FSDP plans at scale, closed form (issue 30, item 6): where ``optimal`` units beat ``per-block`` units, by
how much, and at what memory, for GPT-2-XL- and Llama-7B-shaped analytic traces on 8 to 1,024 GPUs.

    .venv/bin/python benchmarks/fsdp_scale.py [--out docs/data/fsdp/scale.json]

Traces: :func:`dpcomm.trace.analytic.layer_costs` of the zoo's GPT and Llama classes at the published sizes,
built on the meta device (no memory), timed by a bf16 H100 roofline (989 TFLOP/s dense bf16 at 40%, 3.35
TB/s at 70%; assumed), parameters gathered and gradients reduced in bf16 (2 bytes). Each block is cut into
two modules, attention (with its norm) and MLP (with its norm), so ``optimal`` chooses among cuts at those
points (an upper bound on the optimum over every module; GPT-2-XL: 98 modules, Llama-7B: 66). Costs: ring
all-gather and reduce-scatter (:func:`dpcomm.planner.fsdp.ring_costs`) with ``alpha`` 5 us per step and
``beta`` of the link rate. Budgets: none, ``per-block``'s peak with FSDP2's defaults (prefetch 1,
reshard), and its largest block alone. ``max_depth`` 1. Every number is the model's
(:mod:`dpcomm.planner.fsdp_model`), nothing is run.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

WORLDS = (8, 64, 1024)
RATES_GBIT = (10, 100, 400)
ALPHA = 5e-6  # s per ring step, assumed (RDMA-class start-up)


def _traces():
    import torch

    from dpcomm.models.gpt import GPT, GPTConfig
    from dpcomm.models.llama import Llama, LlamaConfig
    from dpcomm.trace.analytic import DevicePreset, layer_costs, trace_from_costs

    h100 = DevicePreset(
        name="h100-bf16", peak_flops=989e12, efficiency=0.4, mem_bw=3.35e12, mem_efficiency=0.7,
        source="NVIDIA H100 SXM5 datasheet (989 TFLOP/s dense bf16, 3.35 TB/s); efficiencies assumed",
    )  # fmt: skip
    shapes = {
        "gpt2-xl-b8": (
            lambda: GPT(GPTConfig(n_layer=48, n_head=25, n_embd=1600, block_size=1024)), 8, 1024, 50257,
        ),
        "llama-7b-b2": (
            lambda: Llama(LlamaConfig(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                                      ffn_dim=11008, max_seq_len=2048)), 2, 2048, 32000,
        ),
    }  # fmt: skip
    out = {}
    for name, (build, batch, seq, vocab) in shapes.items():
        with torch.device("meta"):
            net = build()
            x = torch.randint(0, vocab, (batch, seq), device="meta")
        net.train()
        costs = layer_costs(net, x, dtype_bytes=2)
        out[name] = _halves(trace_from_costs(costs, h100, model=name, batch_size=batch, dtype_bytes=2))
    return out


def _halves(trace):
    """Each block's modules merged into two: up to its second norm (attention), then the rest (MLP)."""
    from dataclasses import replace

    from dpcomm.trace.format import Layer

    rows: list[list] = []
    key = None
    for x in trace.layers:
        m = re.match(r"^(.*?\.\d+)\.(.+)$", x.name)
        block = m.group(1) if m else None
        norm = bool(m) and re.search(r"(^|\.)(ln_\d|\w*norm)$", m.group(2)) is not None
        if block is None or block != (key or (None,))[0] or (norm and rows[-1][1] > 0):
            part = 0 if block is None or block != (key or (None,))[0] else 1
            key = (block, part)
            rows.append([f"{block}.{'attn' if part == 0 else 'mlp'}" if block else x.name, 0, []])
        rows[-1][1] += 1
        rows[-1][2].append(x)
    layers = tuple(
        Layer(name=n, params=sum(x.params for x in xs), forward_s=sum(x.forward_s for x in xs),
              backward_s=sum(x.backward_s for x in xs))
        for n, _, xs in rows
    )  # fmt: skip
    return replace(trace, layers=layers, extra={})


def main(argv: list[str] | None = None) -> int:
    from dpcomm.costmodel.network import Network
    from dpcomm.errors import UserError
    from dpcomm.planner.fsdp import Modules, plan_fsdp, ring_costs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    ap.add_argument("--rates", default=",".join(map(str, RATES_GBIT)), help="Gbit/s")
    args = ap.parse_args(argv)
    rows = []
    print("| model | GPUs | Gbit/s | budget GiB | per-block ms (d, reshard) | optimal ms (units, d, reshard) "
          "| gain | optimal peak GiB | planning s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, tr in _traces().items():
        total = sum(Modules.from_trace(tr).param_bytes)
        comp = sum(x.forward_s + x.backward_s for x in tr.layers)
        print(
            f"<!-- {name}: {tr.num_layers} modules, {total / 2**30:.2f} GiB bf16, "
            f"compute {comp * 1e3:.0f} ms -->"
        )
        for P in [int(v) for v in args.worlds.split(",")]:
            for g in [float(v) for v in args.rates.split(",")]:
                net = Network(name=f"{g:g} Gbit/s", alpha=ALPHA, beta=8 / (g * 1e9), gamma=0.0)
                ag, rs = ring_costs(net, P)
                b1 = plan_fsdp("per-block", tr, ag, rs, depth=1, reshard=True)
                b0 = plan_fsdp("per-block", tr, ag, rs, depth=0, reshard=True)
                for label, M in (("none", None), ("block", b1.peak_bytes), ("tight", b0.peak_bytes)):
                    blk = plan_fsdp("per-block", tr, ag, rs, memory=M, max_depth=1)
                    t0 = time.perf_counter()
                    try:
                        opt = plan_fsdp("optimal", tr, ag, rs, memory=M, max_depth=1)
                    except UserError as exc:
                        print(f"| {name} | {P} | {g:g} | {label} | {exc} |")
                        continue
                    took = time.perf_counter() - t0
                    gain = 1 - opt.time_s / blk.time_s
                    mg = "none" if M is None else f"{M / 2**30:.2f}"
                    print(
                        f"| {name} | {P} | {g:g} | {mg} ({label}) | {blk.time_s * 1e3:.1f} ({blk.depth}, "
                        f"{'yes' if blk.reshard_after_forward else 'no'}) | {opt.time_s * 1e3:.1f} "
                        f"({len(opt.units)}, {opt.depth}, {'yes' if opt.reshard_after_forward else 'no'}) | "
                        f"{gain * 100:.1f}% | {opt.peak_bytes / 2**30:.2f} | {took:.1f} |", flush=True,
                    )  # fmt: skip
                    rows.append({
                        "model": name, "world": P, "gbit": g, "budget": label, "budget_bytes": M,
                        "compute_s": comp, "per_block_s": blk.time_s, "per_block_peak": blk.peak_bytes,
                        "optimal_s": opt.time_s, "optimal_peak": opt.peak_bytes, "optimal": opt.to_dict(),
                        "gain": gain, "planning_s": took,
                    })  # fmt: skip
    if args.out:
        from dpcomm.utils.io import atomic_write_json

        atomic_write_json(args.out, {"alpha_s": ALPHA, "max_depth": 1, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
