"""Measured GPU traces of the zoo in a low-precision dtype (bf16 parameters, gradients and activations).

Each model is built on the GPU, cast to the dtype (pure low-precision parameters: a gradient is 2 bytes, the
trace's ``dtype_bytes``), and profiled layer by layer as ``dpcomm profile --device cuda`` does; token
models take int64 ids. One file per model, ``<model>-<gpu><dtype>-b<B>.json`` (``gpt2-h100bf16-b8.json``),
``<gpu>`` from the device's name. Run where a GPU is::

    PYTHONPATH=src python3 benchmarks/gpu_traces.py --out src/dpcomm/data/traces [--models gpt2,resnet50]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

# model -> batch size: the CNNs at the batch sizes of their fp32 H100 traces, the transformers at sizes that
# keep one iteration in tens of milliseconds
BATCHES = {
    "lenet5": 128, "resnet20": 128, "alexnet": 128, "googlenet": 64, "resnet50": 32, "inception-v3": 32,
    "vgg19": 32, "vgg19-22k": 32, "gpt2": 8, "bert-base": 32, "vit-b16": 64, "tinyllama-1.1b": 4,
    "gpt2-tiny": 64, "llama-tiny": 64, "bert-tiny": 64, "vit-cifar": 128,
}  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> int:
    from dpcomm.models import example_input, get_model
    from dpcomm.trace.format import save_trace
    from dpcomm.trace.profiler import profile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the traces (must exist)")
    p.add_argument("--models", default=",".join(BATCHES), help="comma-separated zoo models")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    out = Path(args.out)
    if not out.is_dir():
        print(f"error: --out {out} is not a folder", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name().split()[1].lower()  # "NVIDIA H100 80GB HBM3" -> "h100"
    dtype = DTYPES[args.dtype]
    failed = 0
    for name in args.models.split(","):
        batch = BATCHES[name]
        t0 = time.perf_counter()
        try:
            torch.manual_seed(0)
            model = get_model(name).to("cuda", dtype)
            x = example_input(name, batch, device="cuda")
            x = x.to(dtype) if x.is_floating_point() else x
            trace = profile(model, x, iters=args.iters, warmup=args.warmup, device="cuda", model_name=name)
            path = save_trace(trace, out / f"{name}-{gpu}{args.dtype}-b{batch}.json")
            took = time.perf_counter() - t0
            print(f"{name} b{batch}: t_f {trace.t_f * 1e3:.2f} ms, t_b {trace.t_b * 1e3:.2f} ms, "
                  f"{trace.num_layers} layers, {took:.0f} s -> {path}", flush=True)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - report and go on to the next model
            failed += 1
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
        finally:
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
