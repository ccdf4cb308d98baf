"""Every rank holds the same state: the root's parameters and buffers broadcast as one message, and the
check that every rank runs the same plan.

MG-WFBP Alg. 2 line 5 ("initialize W in all workers") is the parameter broadcast at start; buffers (e.g.
batch-norm statistics) follow the root at every training forward, as in PyTorch DDP. A plan that differed
between ranks would pair unrelated messages (wrong sums or a hang), so each plan is checked by hash first.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError, first_line
from dpcomm.plan import Plan
from dpcomm.runtime.comm_thread import CommFailure

__all__ = ["PlanMismatchError", "StateBroadcast", "byte_views", "check_same_plan", "groups_text"]


class PlanMismatchError(UserError):
    """Ranks hold different plans: running them would pair unrelated messages (wrong sums or a hang)."""


def check_same_plan(plan: Plan, group: Any) -> str:
    """All-gather ``plan.sha256()``; raise :class:`PlanMismatchError` naming the ranks that differ."""
    mine = plan.sha256()
    world = dist.get_world_size(group)
    hashes: list[Any] = [None] * world
    dist.all_gather_object(hashes, mine, group=group)
    if len(set(hashes)) > 1:
        odd = [r for r, h in enumerate(hashes) if h != hashes[0]]
        raise PlanMismatchError(
            f"ranks hold different plans: rank 0 has sha256 {hashes[0][:12]}, rank(s) "
            f"{', '.join(map(str, odd))} {', '.join(hashes[r][:12] for r in odd)}; "
            "every rank must run the same plan"
        )
    return mine


def groups_text(plan: Plan) -> str:
    """The plan's groups as layer ranges in communication order: ``[3, 1-2, 0]``."""
    return "[" + ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in plan.groups) + "]"


def byte_views(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """One uint8 buffer holding every tensor, widest dtype first (so each view is aligned to its element
    size); returns the buffer, one typed view per tensor in that order, and the order (indices)."""
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())
    sizes = [tensors[i].numel() * tensors[i].element_size() for i in order]
    flat = torch.empty(sum(sizes), dtype=torch.uint8, device=tensors[0].device)
    views, off = [], 0
    for i, n in zip(order, sizes, strict=True):
        t = tensors[i]
        views.append(flat[off : off + n].view(t.dtype).view(t.shape))
        off += n
    return flat, views, order


class StateBroadcast:
    """The root's parameters (optionally) and buffers to every rank of ``group`` as one message of bytes (a
    broadcast does no arithmetic, so every dtype shares it: one collective instead of one per dtype)."""

    def __init__(self, module: nn.Module, collective: Any, group: Any, rank: int, world: int, root: int):
        self.module, self._coll, self._pg = module, collective, group
        self.rank, self.world, self.root = rank, world, root
        self._buffers_pack: tuple | None = None
        """(layout key, byte buffer, typed views, tensor order) of the buffers, reused every forward."""

    def __call__(self, params: bool) -> float:
        """Broadcast now (on the calling thread: nothing else is queued where the state is broadcast);
        returns the seconds it took. Raises :class:`CommFailure` naming the cause."""
        if self.world == 1:
            return 0.0
        tensors = [t.detach() for t in self.module.buffers()]
        if params:
            tensors = [p.detach() for p in dict.fromkeys(self.module.parameters())] + tensors
        if not tensors:
            return 0.0
        t0 = time.perf_counter()
        key = tuple((t.data_ptr(), t.dtype, t.shape) for t in tensors)
        packed = None if params else self._buffers_pack
        if packed is None or packed[0] != key:
            packed = (key, *byte_views(tensors))
            if not params:  # buffers go every forward: keep their layout; parameters go rarely
                self._buffers_pack = packed
        _, flat, views, order = packed
        ts = [tensors[i] for i in order]
        what = "params+buffers" if params else "buffers"
        try:
            with torch.no_grad():
                if self.rank == self.root:
                    torch._foreach_copy_(views, ts)
                self._coll.broadcast(flat, root=self.root, group=self._pg)
                if self.rank != self.root:
                    torch._foreach_copy_(ts, views)
        except Exception as exc:
            raise CommFailure(
                f"DataParallel rank {self.rank} of {self.world}: broadcast {what} "
                f"({flat.numel()} B) failed: {first_line(exc)}"
            ) from exc
        return time.perf_counter() - t0
