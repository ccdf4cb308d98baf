"""How much a backward pass slows while all-reduces run beside it, measured on the workers before training.

MG-WFBP's simulator (Eq. 6-8, :func:`dpcomm.sim.simulate`) runs backward at its profiled speed while the
all-reduces proceed. Where compute and communication share CPUs that does not hold. On the emulated
cluster (two workers on two cores, tbf-shaped veth links) a backward pass of GPT-2 tiny beside a stream
of all-reduces at 80 Mbit/s was preempted ~2,000 times (once per received packet: the softirq and the
woken gloo thread) against ~40 alone, its own CPU time rose from 0.29 to 0.36-0.41 s, and it ended
0.1-0.17 s late (`docs/compile.md`). A GPU's compute is slowed by NCCL's kernels in the same way, less.

:func:`probe_slowdown` measures it as seconds of backward per byte all-reduced beside it (the cost is per
packet, so per byte): every rank runs ``reps`` backward passes of a copy of the model alone and ``reps``
beside ``K`` all-reduces of ``M`` bytes issued as backward starts, ``M`` sized by the fitted all-reduce
line to end within 3/4 of the backward pass; each pass counts at its slowest rank (a collective waits for
it), and ``per_byte_s = (median with - median alone) / M``, at least 0. The prediction then charges each
group's bytes that the simulator has in flight during backward (:func:`dpcomm.sim.slowdown.overlap_slowed`).
It costs ``2 reps + 1`` training passes of the copy; the caller's model, gradients and random state are
untouched (the copy carries no DDP hooks).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.sim.slowdown import Slowdown
from dpcomm.timing import now, slowest
from dpcomm.trace.profiler import default_loss
from dpcomm.utils.user_run import untouched

__all__ = ["MESSAGES", "probe_slowdown"]

MESSAGES = 8
"""All-reduces issued beside each probed backward (K)."""
_SHARE = 0.75  # the probe's all-reduces end within this share of a backward pass (by the fitted line)
_MIN_BYTES = 64 * 1024  # below this the probe cannot resolve a per-byte cost: None


def probe_slowdown(
    model: nn.Module,
    example: Any,
    cost: Any,
    grad_bytes: int,
    *,
    loss_fn: Any = None,
    reps: int = 3,
    group: Any = None,
) -> Slowdown | None:
    """The backward's slowdown per byte all-reduced beside it (module docstring), or None where the fitted
    line ``cost`` (``a + b M`` seconds) leaves no room for ``64 KiB`` within 3/4 of a backward pass.
    ``grad_bytes``: the model's gradient bytes, the most the probe sends."""
    loss_fn = loss_fn or default_loss
    with untouched(model):
        replica = copy.deepcopy(model)
        device = next(replica.parameters()).device

        def backward(comm: Any = None) -> float:
            loss = loss_fn(replica(example))
            dist.barrier(group=group)
            t0 = now(device)
            works = comm() if comm is not None else []
            loss.backward()
            t = now(device) - t0  # a GPU's backward ends when its queued kernels have run
            for w in works:
                w.wait()
            replica.zero_grad(set_to_none=True)
            return t

        backward()  # warm-up
        alone = statistics.median(slowest([backward() for _ in range(reps)], group))
        a, b = float(getattr(cost, "a", 0.0)), float(getattr(cost, "b", 0.0))
        room = _SHARE * alone - MESSAGES * a
        nbytes = int(min(grad_bytes, room / b if b > 0 else grad_bytes)) // (4 * MESSAGES) * 4 * MESSAGES
        if nbytes < _MIN_BYTES:
            return None
        scratch = torch.zeros(nbytes // 4, device=device)
        pieces = scratch.chunk(MESSAGES)

        def stream() -> list[Any]:
            return [dist.all_reduce(p, async_op=True, group=group) for p in pieces]

        beside = statistics.median(slowest([backward(stream) for _ in range(reps)], group))
    return Slowdown(per_msg_s=0.0, per_byte_s=max(0.0, beside - alone) / nbytes, runs=reps)
