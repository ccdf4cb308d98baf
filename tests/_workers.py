"""Module-level worker functions for launcher tests (spawned workers need importable functions)."""

import torch
import torch.distributed as dist

from dpcomm.launch import init_worker


def allreduce_rank(scale):
    rank, world = init_worker()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return rank, world, t.item() * scale


def fail_on_rank(bad):
    rank, _ = init_worker()
    if rank == bad:
        raise RuntimeError(f"boom on rank {rank}")
    dist.destroy_process_group()
    return rank
