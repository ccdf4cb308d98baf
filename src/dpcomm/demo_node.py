"""One emulated server's process in ``make demo``: join the job, train every schedule side by side.

``make demo`` (:mod:`dpcomm.demo`) starts this module once per server of its emulated cluster, through
:func:`dpcomm.testbed.launch_workers`, which appends ``--nnodes N --node-rank i --master-addr A
--master-port P --nproc 1``. Each process runs :func:`dpcomm.train.compare_schedules` with one worker (one
replica per schedule, interleaved iteration by iteration on the same batches, as ``dpcomm train`` does), and
node 0 writes every schedule's :class:`~dpcomm.train.TrainResult` to ``--results`` as JSON.

The model is ``emulated:TRACE`` (:mod:`dpcomm.trace.emulated`): the trace's layers and parameter sizes,
with forward and backward sleeping the trace's times, so the gradients are real tensors on real TCP and the
two cores are left to the network. ``dpcomm.train`` builds zoo models by name, so this module adds the
emulated model to the zoo (:data:`dpcomm.models.MODELS`) under that name when ``$DPCOMM_DEMO_TRACE`` names
a trace. It does so at import: the training workers are spawned processes, and a spawned process imports
its parent's ``__main__`` module (this one, run with ``python -m``) before it runs, so they see it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

__all__ = ["ENV_TRACE", "register_emulated", "main"]

ENV_TRACE = "DPCOMM_DEMO_TRACE"
"""Names the shipped trace (or trace file) whose emulated model the demo trains."""


def register_emulated(spec: str) -> str:
    """Add ``emulated:SPEC`` to the model zoo (idempotent); returns the model name."""
    from dpcomm.models import MODELS, ModelSpec
    from dpcomm.trace.emulated import PREFIX, emulated_model
    from dpcomm.trace.format import load_trace
    from dpcomm.trace.shipped import find_trace

    spec = spec.removeprefix(PREFIX)
    name = PREFIX + spec
    if name not in MODELS:
        trace = load_trace(spec) if os.path.isfile(spec) else find_trace(spec)
        MODELS[name] = ModelSpec(
            name=name,
            build=lambda classes: emulated_model(trace, classes),
            input_shape=(1,),  # the emulated model reads only the batch size
            num_classes=10,
            params=max(1, sum(max(1, layer.params) for layer in trace.layers)),
            description=f"{trace.model}'s trace {spec}: its layers and sizes, compute that sleeps its times",
        )
    return name


if os.environ.get(ENV_TRACE):  # also in the spawned training workers (see the module docstring)
    register_emulated(os.environ[ENV_TRACE])


def main(argv: list[str] | None = None) -> int:
    from dpcomm.launch import add_launch_arguments
    from dpcomm.train import TrainConfig, compare_schedules
    from dpcomm.utils.io import atomic_write_json

    ap = argparse.ArgumentParser(prog="python -m dpcomm.demo_node", description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", required=True, help="comma-separated, e.g. ddp,wfbp,single,mgwfbp")
    ap.add_argument("--iters", type=int, required=True, help="iterations per schedule")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--chrome-trace", default=None, help="rank 0's Chrome traces: PATH -> PATH.<schedule>")
    ap.add_argument("--results", required=True, help="JSON file node 0 writes the results to")
    ap.add_argument("--timeout", type=float, default=60.0, help="gloo timeout, s")
    ap.add_argument("--nproc", type=int, default=1)
    add_launch_arguments(ap, required=True)
    args = ap.parse_args(argv)
    if not os.environ.get(ENV_TRACE):
        print(f"{ap.prog}: error: ${ENV_TRACE} names no trace", file=sys.stderr)
        return 2
    cfg = TrainConfig(
        model=register_emulated(os.environ[ENV_TRACE]),
        data="synthetic",
        iters=args.iters,
        batch_size=args.batch_size,
        nproc=args.nproc,
        nnodes=int(args.nnodes),
        node_rank=int(args.node_rank),
        master_addr=args.master_addr,
        master_port=int(args.master_port),
        threads=1,
        timeout_s=args.timeout,
        progress=False,
        chrome_trace=args.chrome_trace,
    )
    results = compare_schedules(cfg, [s for s in args.schedules.split(",") if s])
    if cfg.node_rank == 0:
        atomic_write_json(args.results, [dataclasses.asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
