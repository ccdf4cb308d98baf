"""Time every planner and the simulator; print the figures and the goals side by side.

    .venv/bin/python benchmarks/planners.py [--repeat 20]

Traces: ResNet-50 at batch 32 from the analytic K80 model (107 learnable layers in dpcomm's zoo: conv and
batch-norm modules each own parameters), a synthetic 161-layer trace (MG-WFBP's L = 161, the layer count
of Caffe's ResNet-50 with its separate BatchNorm and Scale layers), and a synthetic 2,000-layer trace.
Costs: ring all-reduce on the 10GbE preset at N = 16 (planning) and N = 1,024 (simulation).
Goals: optimal plans ResNet-50 in < 10 ms and 2,000 layers in < 1 s; simulating 1,024 nodes x
ResNet-50 x the four schedules (plan + simulate each) takes < 1 s. It also times MG-WFBP's Algorithm 1
transcribed literally (tau_c recomputed after every merge, O(L^2)) against dpcomm's O(L) form, checking
that both merge the same layers, and checks that ``optimal`` never loses to another planner.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from dpcomm.costmodel import PRESETS, allreduce_cost
from dpcomm.planner import make_plan
from dpcomm.sim import simulate
from dpcomm.trace.format import Layer, Trace

SCHEDULES = ["wfbp", "single", "bucket:25MB", "mgwfbp", "optimal"]
FOUR = ["wfbp", "single", "mgwfbp", "optimal"]


def synthetic(num_layers: int, seed: int = 0) -> Trace:
    """Layers of 100 .. 2.4 M parameters (log-uniform, as MG-WFBP Fig. 5a's range), 0.1-3 ms times."""
    rnd = random.Random(seed)
    layers = tuple(
        Layer(
            name=f"layer{i}",
            params=int(10 ** rnd.uniform(2, 6.4)),
            forward_s=rnd.uniform(1e-4, 1.5e-3),
            backward_s=rnd.uniform(2e-4, 3e-3),
        )
        for i in range(num_layers)
    )
    return Trace(
        model=f"synthetic{num_layers}", batch_size=32, device="synthetic", dtype_bytes=4, layers=layers
    )


def resnet50() -> Trace:
    try:
        from dpcomm.trace.analytic import analytic_trace
    except ImportError:  # analytic traces not available: fall back on the synthetic stand-in
        return synthetic(161, seed=50)
    return analytic_trace("resnet50", 32, "k80")


def _timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _algorithm1_literal(trace: Trace, cost) -> list[int]:
    """MG-WFBP Algorithm 1 line by line (1-indexed, CALCULATECOMMSTART after every merge)."""
    L = trace.num_layers
    p = [0] + [trace.layer_bytes(l) for l in range(L)]
    tb = [0.0] + [layer.backward_s for layer in trace.layers]
    tc = [0.0] + [cost(p[l]) for l in range(1, L + 1)]
    tau_b = [0.0] * (L + 1)
    tau_b[L] = trace.t_f
    for l in range(L - 1, -1, -1):  # down to 0: see the mgwfbp docstring, point 2
        tau_b[l] = tau_b[l + 1] + tb[l + 1]

    def comm_start():
        tau_c = [0.0] * (L + 1)
        tau_c[L] = tau_b[L] + tb[L]
        for l in range(L - 1, 0, -1):
            tau_c[l] = max(tau_c[l + 1] + tc[l + 1], tau_b[l] + tb[l])
        return tau_c

    tau_c, merged = comm_start(), []
    for l in range(L, 1, -1):
        if tau_b[l - 2] - tau_c[l] < cost.a:
            tc[l] = 0.0
            p[l - 1] += p[l]
            tc[l - 1] = cost(p[l - 1])
            tau_c = comm_start()
            merged.append(l - 1)  # as a 0-indexed layer
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs per figure (median reported)")
    args = parser.parse_args()
    net = PRESETS["10gbe"]
    load = open("/proc/loadavg").read().split()[:3]
    print(f"load average: {' '.join(load)}  python {sys.version.split()[0]}  cpus {os.cpu_count()}")
    ok = True

    traces = [resnet50(), synthetic(161), synthetic(2000)]
    cost16 = allreduce_cost(net, 16)
    print(f"\nplanning, ring all-reduce on 10gbe at N=16 ({cost16})")
    print(f"median of {args.repeat} runs (2,000 layers: 3)")
    print(f"{'trace':<22}{'L':>6}" + "".join(f"{s:>14}" for s in SCHEDULES) + "   (ms)")
    for trace in traces:
        repeat = 3 if trace.num_layers >= 1000 else args.repeat
        cells, t_iter = [], {}
        for s in SCHEDULES:
            secs, plan = _timed(lambda s=s, tr=trace: make_plan(s, tr, cost16, 16), repeat)
            cells.append(secs)
            t_iter[s] = simulate(trace, plan, cost16, 16).t_iter_s
        print(f"{trace.model:<22}{trace.num_layers:>6}" + "".join(f"{c * 1e3:>14.3f}" for c in cells))
        if any(t_iter["optimal"] > t + 1e-12 for t in t_iter.values()):
            print(f"  FAIL: optimal loses on {trace.model}: {t_iter}")
            ok = False
        goal = 1.0 if trace.num_layers >= 1000 else 0.010
        opt = cells[SCHEDULES.index("optimal")]
        print(f"  optimal {opt * 1e3:.2f} ms vs goal {goal * 1e3:.0f} ms: {opt / goal:.2f} of the budget")

    print("\nMG-WFBP: Algorithm 1 as printed (O(L^2)) vs dpcomm's incremental form (O(L)), N=16")
    for trace in traces:
        repeat = 1 if trace.num_layers >= 1000 else 5
        lit_s, lit = _timed(lambda tr=trace: _algorithm1_literal(tr, cost16), repeat)
        fast_s, plan = _timed(lambda tr=trace: make_plan("mgwfbp", tr, cost16, 16), repeat)
        same = sorted(lit) == sorted(plan.meta["merged_layers"])
        ok &= same
        print(
            f"  {trace.model:<20} L={trace.num_layers:<5} literal {lit_s * 1e3:9.2f} ms"
            f"   dpcomm {fast_s * 1e3:7.3f} ms   x{lit_s / fast_s:7.1f}"
            f"   same merged layers: {same} ({len(lit)} merges)"
        )

    trace = traces[0]
    cost1024 = allreduce_cost(net, 1024)
    print(
        f"\nsimulation: {trace.model} ({trace.num_layers} layers) x 1,024 nodes, plan + simulate per schedule"
    )

    def all_four():
        return [simulate(trace, make_plan(s, trace, cost1024, 1024), cost1024, 1024) for s in FOUR]

    secs, results = _timed(all_four, args.repeat)
    for res in results:
        print(
            f"  {res.schedule:<8} t_iter {res.t_iter_s * 1e3:9.2f} ms  speedup {res.speedup:7.1f}"
            f"  ({len(res.comm)} all-reduces)"
        )
    print(f"  four schedules: {secs * 1e3:.2f} ms vs goal 1000 ms: {secs:.4f} of the budget")
    plan = make_plan("optimal", trace, cost1024, 1024)
    sim_s, _ = _timed(lambda: simulate(trace, plan, cost1024, 1024), args.repeat)
    print(f"  simulate alone (optimal plan): {sim_s * 1e3:.3f} ms")

    from dpcomm.sim import sweep

    nodes = [2**k for k in range(1, 11)]
    secs, rows = _timed(lambda: sweep(trace, net, nodes, FOUR), max(1, args.repeat // 5))
    print(f"  sweep N = 2..1024 (10 node counts) x 4 schedules: {secs * 1e3:.1f} ms for {len(rows)} cells")
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
