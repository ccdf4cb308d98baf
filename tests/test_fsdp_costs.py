"""dpcomm.fsdp.costs measures FSDP2's two collectives on the torch it runs on (torch 2.11 has no
``dist.all_gather_single``: ``shard`` failed there on every multi-rank group; ``make test-compat`` runs this
on the oldest supported torch)."""

import pytest
import torch.distributed as dist

from dpcomm.fsdp.costs import measure_fsdp_collectives


@pytest.mark.slow  # a process group in this process
def test_fsdp_collectives_are_measured_on_this_torch():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ag, rs = measure_fsdp_collectives(1 << 12, reps=1)
    finally:
        dist.destroy_process_group()
    assert [b for b, _ in ag] == [b for b, _ in rs] == [16, 64, 256, 1024, 4096]  # full bytes, / 4^k
    assert all(t > 0 for _, t in ag + rs)
