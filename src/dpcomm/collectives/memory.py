"""Extra resident memory of one collective call per (algorithm, op): ``benchmarks/collectives.py --memory``.

The peak RSS during the call minus the RSS before it (Linux ``VmHWM`` after resetting it through
``/proc/self/clear_refs``), max over ranks; see :func:`measure_memory`.
"""

from __future__ import annotations

from typing import Any

from dpcomm.ops import OPS
from dpcomm.timing import call_op, rank_input

__all__ = ["measure_memory"]


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def _mem_worker(algos: tuple[str, ...], ops: tuple[str, ...], nbytes: int, timeout_s: float) -> list:
    import gc

    import torch
    import torch.distributed as dist

    from dpcomm.collectives import _p2p
    from dpcomm.collectives.base import get
    from dpcomm.launch import init_worker

    rank, _ = init_worker(timeout_s=timeout_s)
    out = []
    for name in algos:
        for op in ops:
            algo = get(name)  # a fresh instance: no buffers kept from an earlier call
            x = rank_input(max(1, nbytes // 4), rank, torch.float32)
            _p2p._scratch.buf = None  # the calling thread's reusable receive buffer: this call pays for it
            gc.collect()
            dist.barrier()
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            rss0 = _status_kb("VmRSS")
            call_op(algo, op, x)
            out.append((name, op, (_status_kb("VmHWM") - rss0) * 1024))
    dist.barrier()
    dist.destroy_process_group()
    return out


def measure_memory(
    nproc: int,
    algos: tuple[str, ...],
    ops: tuple[str, ...] = OPS,
    nbytes: int = 16 << 20,
    timeout_s: float = 120,
) -> list[dict[str, Any]]:
    """Extra resident memory of one call per (algo, op): the peak RSS during the call minus the RSS before
    it (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``), max over ranks, for a float32
    message of ``nbytes``. Counts every thread's allocations (gloo's included); first call of a fresh
    instance, so buffers an algorithm keeps for later calls are charged here."""
    from dpcomm.launch import LaunchOptions, launch

    # A fixed mmap threshold: every buffer >= 64 KiB is its own mapping, returned to the OS when freed
    # (glibc's dynamic threshold would serve later buffers from freed heap memory, already resident).
    env = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    per_rank = launch(_mem_worker, LaunchOptions(nproc=nproc, env=env), algos, ops, nbytes, timeout_s)
    rows = []
    for i, (algo, op, _) in enumerate(per_rank[0]):
        extra = max(r[i][2] for r in per_rank)
        rows.append({"algo": algo, "op": op, "nproc": nproc, "bytes": nbytes, "extra_bytes": extra})
    return rows
