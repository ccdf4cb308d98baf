"""The communication jobs of every runtime mode, including the LP paper's three BSP-SGD algorithms.

Modes (``DataParallel(mode=...)``); P ranks, ``root`` the rank that owns the authoritative parameters:

- ``overlap`` (default; MG-WFBP Alg. 2): each plan group is all-reduced on the communication thread as soon
  as its gradients are complete, in plan order, while backward goes on; every rank then steps the optimizer.
- ``lp-alg1`` (LP paper Alg. 1, "overlapping communications with computations"): in forward, the broadcast of
  layer ``i+1``'s parameters from the root runs while layer ``i`` computes (lines 3-7); in backward, each plan
  group's gradients are *reduced* to the root while earlier layers compute (lines 8-11); only the root steps
  the optimizer (line 12), and the others receive the new parameters layer by layer in the next forward.
  A ``wfbp`` plan gives the paper's exact layer-wise reduce; other plans merge layers into fewer messages.
- ``lp-alg2`` (LP paper, "broadcast + reduce", fork and join): after backward, reduce every group to the root,
  the root steps the optimizer, then broadcast the parameters from the root. Two synchronisation points.
- ``lp-alg3`` (LP paper, "allreduce", fork and join): after backward, all-reduce every group and every rank
  steps the optimizer; the parameters are re-broadcast from the root every ``broadcast_every`` iterations
  (the paper uses 5) to undo any drift between ranks' floating-point updates.

(The extracted paper text swaps the captions of Alg. 2 and Alg. 3; the descriptions above follow the body
text of its Section 3.3.) All jobs average by multiplying the sum by ``1/P``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpcomm.runtime.buckets import GradBuckets, Group
from dpcomm.runtime.comm_thread import CommJob, CommThread

__all__ = [
    "MODES",
    "LayerwiseBroadcast",
    "allreduce_job",
    "broadcast_params_job",
    "reduce_job",
    "start_allreduce",
]

MODES = ("overlap", "lp-alg1", "lp-alg2", "lp-alg3")


def _label(op: str, g: Group) -> str:
    lo, hi = g.layers[0], g.layers[-1]
    return f"{op} group {g.index} (layers {lo}-{hi}, {g.nbytes} B)"


def allreduce_job(
    coll: Any, b: GradBuckets, g: Group, group: Any, world: int
) -> tuple[str, Callable[[], None]]:
    """Sum the group's buffers over all ranks, then write the average back into ``.grad``."""

    def run() -> None:
        b.pack_grads(g)
        if world > 1:
            for flat in g.flats.values():
                coll.allreduce(flat, group=group)
        b.unpack_grads(g, 1.0 / world)

    return _label("allreduce", g), run


def start_allreduce(comm: CommThread, coll: Any, b: GradBuckets, g: Group, group: Any, world: int) -> CommJob:
    """:func:`allreduce_job` for a collective with ``allreduce_async`` (the backend's own threads): pack and
    start on the calling thread now (as DDP's reducer does in its autograd hook); the average is written back
    into ``.grad`` on the thread that waits for the job."""
    t0 = time.perf_counter()
    b.pack_grads(g)
    works = [coll.allreduce_async(flat, group=group) for flat in g.flats.values()] if world > 1 else []
    label = _label("allreduce", g)
    return comm.start_async(label, works, g.nbytes, lambda: b.unpack_grads(g, 1.0 / world), t0)


def reduce_job(
    coll: Any, b: GradBuckets, g: Group, group: Any, world: int, rank: int, root: int
) -> tuple[str, Callable[[], None]]:
    """Sum the group's buffers on the root; only the root gets averaged gradients in ``.grad``."""

    def run() -> None:
        b.pack_grads(g)
        if world > 1:
            for flat in g.flats.values():
                coll.reduce(flat, root=root, group=group)
        if rank == root:
            b.unpack_grads(g, 1.0 / world)

    return _label("reduce", g), run


def broadcast_params_job(
    coll: Any, b: GradBuckets, g: Group, group: Any, rank: int, root: int
) -> tuple[str, Callable[[], None]]:
    """Copy the root's parameters of the group to every rank, through the group's (free) gradient buffers."""

    def run() -> None:
        if rank == root:
            b.pack_params(g)
        for flat in g.flats.values():
            coll.broadcast(flat, root=root, group=group)
        if rank != root:
            b.unpack_params(g)

    return _label("broadcast params", g), run


class LayerwiseBroadcast:
    """LP Alg. 1 lines 3-7: broadcast layer ``i+1``'s parameters while layer ``i`` runs its forward.

    Created at the start of a forward whose parameters are stale on non-root ranks; the runtime calls
    :meth:`before_layer` from each learnable layer's forward pre-hook and :meth:`finish` after the forward.
    """

    def __init__(self, comm: CommThread, coll: Any, b: GradBuckets, group: Any, rank: int, root: int):
        self._comm, self._coll, self._b, self._group = comm, coll, b, group
        self._rank, self._root = rank, root
        self._jobs: list[CommJob | None] = [None] * len(b.layer_ranges)
        self._next = 0
        self.waited_s = 0.0
        """Seconds the forward waited for a layer's parameters (exposed communication)."""

    def _submit_upto(self, layer: int) -> None:
        last = min(layer, len(self._jobs) - 1)
        while self._next <= last:
            self._jobs[self._next] = self._comm.submit(*self._layer_job(self._next))
            self._next += 1

    def _layer_job(self, layer: int) -> tuple[str, Callable[[], None], int]:
        b, coll, group, root = self._b, self._coll, self._group, self._root
        slots, slices = b.layer_slots(layer), b.layer_slices(layer)
        is_root = self._rank == root

        def run() -> None:
            if is_root:
                for s in slots:
                    b.view(s).copy_(s.param.detach())
            for _, piece in slices:
                coll.broadcast(piece, root=root, group=group)
            if not is_root:
                for s in slots:
                    s.param.detach().copy_(b.view(s))

        nbytes = sum(p.numel() * p.element_size() for _, p in slices)
        return f"broadcast params layer {layer} ({nbytes} B)", run, nbytes

    def before_layer(self, layer: int, wait: Callable[[CommJob], float]) -> None:
        self._submit_upto(layer + 1)  # non-blocking broadcast of the next layer (line 4)
        job = self._jobs[layer]
        if job is not None:
            self.waited_s += wait(job)  # sync_broadcast of this layer (line 6 of the previous step)

    def finish(self, wait: Callable[[CommJob], float]) -> None:
        """Layers the forward did not call still get their parameters before backward."""
        self._submit_upto(len(self._jobs) - 1)
        for job in self._jobs:
            if job is not None and not job.done():
                self.waited_s += wait(job)
