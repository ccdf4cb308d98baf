"""nccl-tests all_reduce_perf logs written from rows or from the model, for the calibrate tests."""

from __future__ import annotations


def nccl_tests_log(rows, ranks=None, host="node", per_host=8, extra=""):
    """An all_reduce_perf output with ``rows`` of ``(bytes, seconds)`` (nccl-tests 2.13's columns)."""
    head = [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20",
        "#",
    ]
    for r in range(ranks or 0):
        head.append(
            f"#  Rank {r:2d} Group  0 Pid {100 + r} on {host}-{r // per_host} device {r % per_host} [0x1]"
        )
    body = []
    for n, t in rows:
        us, p = t * 1e6, ranks or 16
        alg = n / us / 1e3
        bus = alg * 2 * (p - 1) / p
        body.append(f"{n:12d} {n // 4:12d}     float     sum      -1  {us:9.2f} {alg:7.2f} {bus:7.2f}      0"
                    f"  {us:9.2f} {alg:7.2f} {bus:7.2f}      0")  # fmt: skip
    return "\n".join([*head, extra, *body, "# Avg bus bandwidth    : 1.0", ""])


def model_rows(spec, algo, alpha, sizes):
    from dpcomm.sim.network import make_fabric, simulate_allreduce
    from dpcomm.sim.network.pricing import default_model

    model = default_model(make_fabric(spec, 10e9), alpha)
    return [(n, simulate_allreduce(model, algo, n)[0].time_s) for n in sizes]


SIZES = [8 << k for k in range(0, 14)] + [64 << 20, 128 << 20, 256 << 20, 512 << 20, 1 << 30]
