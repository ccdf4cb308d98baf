"""A BSP parameter server on torch.distributed point-to-point messages: the worker's client and the server.

Roles (``W`` workers, ``S`` servers; :class:`Layout`): co-located, rank ``s`` is worker ``s`` and server
``s`` (``S = W``; BigDL's parameter manager, the iBatch paper's implementation); dedicated, ranks ``W..W+S-1``
are servers only (the paper's Fig. 1, BytePS). Parameters are split into keys (:mod:`dpcomm.ps.keys`).

A *unit* is a contiguous run of layers: a push group (gradient plan) or a pull batch (pull plan). Every
(unit, server) pair is one message per worker; its keys are a contiguous slice of that server's shard, so
a message is one slice. Messages from a rank to itself are local copies.

One iteration ``t`` (BSP: the pulls for ``t+1`` are only sent once all ``W`` pushes of ``t`` are summed):

1. worker: forward; before each pull batch ``k``'s first layer runs, :meth:`PsWorker.wait` on batch ``k``'s
   ticket (all batches were posted at the end of ``t-1``, so batch ``k+1`` arrives while ``k`` computes);
2. worker: backward; each push group is pushed (:meth:`PsWorker.push`) as soon as its gradients exist;
3. server (:meth:`PsServer.serve`): wait for the ``W`` pushes of every group, sum them in rank order,
   divide by ``W``, apply ``torch.optim.SGD`` (the worker's own lr, momentum, weight decay) to the shard,
   post the receives for ``t+1``'s pushes, send every pull batch to every worker, in plan order, the
   workers of each batch in a rotated order (:meth:`Layout.send_order`);
4. worker: post the receives of ``t+1``'s pulls (:meth:`PsWorker.pull`); a co-located worker does this
   before its own server's step 3 (:meth:`dpcomm.ps.rank.PsRank.iteration`): gloo sends a message once
   the receiver has answered "ready", and a worker that posted late had its "ready"s queue behind data.

The first iteration of a run pulls nothing: every rank starts from the same parameters (one seed, or the
checkpoint). :meth:`PsWorker.wait` after the last iteration makes every worker current.

Request mode (``pulls=request``; :data:`dpcomm.ps.spec.PULL_MODES`): in step 3 the server does not send;
:meth:`PsServer.answer` starts a thread per remote worker that waits for that worker's request of each batch
(a one-element message) and then sends the batch; the receives of ``t+1``'s pushes are posted only once
every worker's pull is answered. gloo sends a message's data once the receiver has posted its receive, so
a worker done early keeps its pushes at home until then; before, they filled the server's switch-port
queue (FIFO) while slower workers still asked, and every request waited behind them (nine co-located
workers on ``star:9`` at 100 Mbit/s, 16 cores: layer-by-layer ``F_N`` 207-213 ms, modelled 143-149;
with the pushes held, 147-160 ms, modelled 141-149; ``docs/ps.md``).

In step 4 :meth:`PsWorker.request` starts a thread that asks every server for batch ``k`` only once batch
``k-1`` has arrived from all of them, so every pull pays a round trip and the threads' wake-ups: the pull
start-up ``Ts`` of the paper's model, which in send mode the back-to-back messages hide. The threads only
block in ``wait`` (which releases the GIL) and :meth:`PsWorker.wait` waits on the batch's event; parameters
are still written by the waiting thread.

Sparsified pushes (``topk`` with error feedback): each push message carries the ``k = ceil(ratio n)``
entries of largest magnitude of (gradient + residual) as indices and values; the rest stays in the
worker's residual and is added to the next push; servers add the sparse pushes into a dense sum.

Two process groups, one per direction (``lanes``: messages from a lower to a higher rank on the first,
the others on the second). gloo's TCP transport matches every point-to-point message with a rendezvous on
the pair's one connection: the sender announces it, the receiver answers "ready", then the data flows. In
a co-located run every pair exchanges pulls both ways at once, so on one connection a receiver's "ready"
queued behind megabytes of its own data going the other way, and one of the two pulls waited for the
other: on ``star:2`` at 100 Mbit/s one worker got LeNet-5's parameters in the link's time (528 ms) and the
other in twice that (1050 ms), every iteration. With a connection per direction, the data of each goes one
way only and the answers never wait behind it (``docs/ps.md``). Pull requests go on a third group: on the
data lanes a worker's request to a server went the same way as that worker's own server's batch to the
server's worker, and waited behind it (GoogLeNet on ``star:2`` at 250 Mbit/s, request mode: the one-batch
pull took 0.84 s or, in rounds where the other worker's request had arrived first, 1.68 s).

Every wait honours its process group's timeout (:class:`dpcomm.ps.rank.PsRank` makes the lanes with the
run's), in the request and answer threads too; a peer that died or never answers becomes a
:class:`PsError` with one line naming the rank, the message and the cause, and a thread's error is raised
by whoever waits on what it would have delivered.

Modules: :mod:`dpcomm.ps.layout` (roles, keys and slices, lanes), :mod:`dpcomm.ps.server` (the server loop),
:mod:`dpcomm.ps.worker` (push, pull, request, wait), :mod:`dpcomm.ps.tags` (every message tag); this module
holds what they share: the error, the tickets and the threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.errors import first_line
from dpcomm.ps.keys import Key

__all__ = ["PsError", "Ticket"]


class PsError(RuntimeError):
    """A parameter-server message failed (a peer died or timed out); the message is one line."""


def _wait(work: Any, what: str, rank: int) -> None:
    try:
        work.wait()
    except Exception as exc:  # gloo: "Connection closed by peer", timeouts
        raise PsError(f"parameter server: rank {rank}: {what}: {first_line(exc)}") from None


class _Job:
    """A daemon thread running ``fn(*args)``; :meth:`join` re-raises its error as the caller's."""

    def __init__(self, fn: Callable[..., None], *args: Any) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # handed to whoever joins or waits
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def join(self) -> None:
        self.thread.join()
        self.check()


def _after(jobs: list[_Job], then: Callable[[], None]) -> None:
    """Run ``then`` once ``jobs`` have ended, none failed (whoever joins them raises the first error)."""
    for job in jobs:
        job.thread.join()
    if not any(job.error for job in jobs):
        then()


@dataclass(slots=True)
class Ticket:
    """The receives of one unit, posted (send mode) or to be asked for by a thread (request mode);
    :meth:`PsWorker.wait` completes it once."""

    unit: int
    parts: list[tuple[int, list[Key], torch.Tensor, Any]]
    """(server, keys, buffer, work or None for a local copy)."""
    done: bool = False
    arrived: threading.Event | None = None
    """Request mode: set by the worker's request thread once every part is in (the works are its own)."""
    job: _Job | None = None
    """Request mode: that thread (its error is the waiter's)."""
    asked_s: float | None = None
    """Request mode: ``time.perf_counter()`` when the request thread asked every server for this unit."""
    arrived_s: float | None = None
    """Request mode: ``time.perf_counter()`` when the request thread saw every part in."""
