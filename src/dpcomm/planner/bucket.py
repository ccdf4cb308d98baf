"""Size-capped gradient buckets: PyTorch DDP's ``bucket_cap_mb=25`` and Horovod's 128 MB tensor fusion.

Walk the layers in backward order (``L-1`` down to 0) and close the current group as soon as it holds
``>= size`` bytes; the last group holds whatever is left. DDP also makes its first bucket 1 MiB
(``first_bytes``, :data:`DDP_FIRST_BUCKET_BYTES`); :func:`plan_ddp` is DDP's default as it runs after its
first iteration (the reducer's rebuilt buckets: gradient-ready order, which for a model whose modules are
registered in the order they run is reverse registration order; 1 MiB first, then 25 MiB caps,
``torch/nn/parallel/distributed.py`` and the reducer's ``compute_bucket_assignment_by_size``). DDP buckets
parameters, not layers (a trace's gradient units), so a cap met inside a unit closes the bucket at the
unit's end here.

Sizes (:mod:`dpcomm.utils.sizes`): ``25MB``, ``128MB``, ``4KB``, ``1.5GB`` or plain bytes (``4096``). Units
are binary as in the tools (DDP: ``bucket_cap_mb * 1024 * 1024``; Horovod: ``HOROVOD_FUSION_THRESHOLD``
default 128 * 1024 * 1024): ``B``, ``K``/``KB``/``KiB`` = 2**10, ``M``/``MB``/``MiB`` = 2**20,
``G``/``GB``/``GiB`` = 2**30.
"""

from __future__ import annotations

import time

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner._common import check_nodes, finish
from dpcomm.trace.format import Trace
from dpcomm.utils.sizes import parse_size

__all__ = [
    "plan_ddp",
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
    "HOROVOD_FUSION_BYTES",
    "parse_bucket_size",
    "plan_bucket",
]

DDP_BUCKET_BYTES = 25 * 2**20  # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDP's first bucket
HOROVOD_FUSION_BYTES = 128 * 2**20  # HOROVOD_FUSION_THRESHOLD default


def parse_bucket_size(text: str) -> int:
    """``"25MB"`` -> 26214400 bytes (:func:`dpcomm.utils.sizes.parse_size`, at least 1 byte)."""
    return parse_size(text, what="bucket size", minimum=1)


def plan_bucket(
    trace: Trace,
    cost: CommCost,
    nodes: int,
    *,
    size_bytes: int,
    name: str | None = None,
    first_bytes: int | None = None,
) -> Plan:
    """Groups closed once they hold ``>= size_bytes`` bytes, in backward order; ``name`` labels the plan.
    ``first_bytes``: the first group closes at this size instead (DDP: 1 MiB)."""
    t0 = time.perf_counter()
    check_nodes(nodes)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
        raise UserError(f"bucket size must be an integer >= 1 byte, got {size_bytes!r}")
    if first_bytes is not None and (isinstance(first_bytes, bool) or first_bytes < 1):
        raise UserError(f"first bucket size must be an integer >= 1 byte, got {first_bytes!r}")
    sizes, count, held = [], 0, 0
    for l in range(trace.num_layers - 1, -1, -1):
        count += 1
        held += trace.layer_bytes(l)
        if held >= (first_bytes if first_bytes is not None and not sizes else size_bytes):
            sizes.append(count)
            count, held = 0, 0
    if count:
        sizes.append(count)
    return finish(name or f"bucket:{size_bytes}", sizes, trace, nodes, t0, bucket_bytes=size_bytes)


def plan_ddp(trace: Trace, cost: CommCost, nodes: int) -> Plan:
    """PyTorch DDP's default buckets (module docstring): 1 MiB first, then 25 MiB, backward order; ``ddp``."""
    return plan_bucket(
        trace, cost, nodes, size_bytes=DDP_BUCKET_BYTES, first_bytes=DDP_FIRST_BUCKET_BYTES, name="ddp"
    )
