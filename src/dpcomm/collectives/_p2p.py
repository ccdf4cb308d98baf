"""Point-to-point plumbing every collective algorithm shares: peers, counted sends, chunks, error naming.

* :class:`P2P` wraps one call of one algorithm on one process group. Peers are *group* ranks; they are
  translated to the global ranks torch.distributed's ``isend``/``irecv`` take (:func:`global_rank`).
  Every send is counted (messages and bytes, see :func:`count_traffic`) so tests can compare an
  algorithm with the formula in its docstring.
* Any failure of a point-to-point wait -- a peer that died (gloo: "Connection closed by peer") or never
  arrived (gloo raises after the group's timeout, ``init_worker(timeout_s=...)``; ``Work.wait()`` with no
  argument honours it) -- becomes a :class:`CollectiveError` naming the algorithm, the op, the step and
  the peer, so no rank hangs and the message says where the schedule broke.
* :func:`chunk_bounds` / :func:`block_bounds` cut ``n`` elements into nearly equal pieces or byte-sized
  blocks; :func:`reduce_into` sums a received buffer into a slice (with torch ops, so every dtype works even
  where gloo has no reduction for it; gloo *sends* float16, bfloat16 and the integer types as they are).

Zero-length messages are sent like any other (gloo accepts them), so an algorithm's message count is the
same for every element count ``n >= 1``; each algorithm returns at once for ``n == 0``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.errors import first_line
from dpcomm.schedules import block_bounds, chunk_bounds  # noqa: F401 - the collectives import them from here

__all__ = [
    "CollectiveError",
    "P2P",
    "Pending",
    "Traffic",
    "begin",
    "block_bounds",
    "chunk_bounds",
    "count_traffic",
    "flat_view",
    "global_rank",
    "reduce_into",
    "scratch",
]


class CollectiveError(RuntimeError):
    """A point-to-point step of a collective failed: ``"<algo> <op>: step <s>: peer <p> (...): <cause>"``."""


# ---------------------------------------------------------------------------------------------------------
# Traffic counters (per process; every thread's sends count).


@dataclass(slots=True, kw_only=True)
class Traffic:
    """Messages and bytes this process sent while a :func:`count_traffic` block was open."""

    sends: int = 0
    """Point-to-point messages posted (zero-length ones included)."""
    bytes: int = 0
    """Payload bytes of those messages."""


_active: list[Traffic] = []
_lock = threading.Lock()


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """``with count_traffic() as t: algo.allreduce(x)`` -> ``t.sends``, ``t.bytes`` sent by this process."""
    t = Traffic()
    with _lock:
        _active.append(t)
    try:
        yield t
    finally:
        with _lock:
            _active.remove(t)


def _count(nbytes: int) -> None:
    if _active:
        with _lock:
            for t in _active:
                t.sends += 1
                t.bytes += nbytes


# ---------------------------------------------------------------------------------------------------------
# Ranks, tensors, pieces.


def global_rank(group: Any, rank: int) -> int:
    """Global rank of ``rank`` of ``group`` (None or WORLD: the same number)."""
    if group is None or group is dist.GroupMember.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


def flat_view(tensor: torch.Tensor, algo: str) -> torch.Tensor:
    """1-D view sharing storage with ``tensor`` (collectives work in place on contiguous tensors)."""
    if not tensor.is_contiguous():
        raise ValueError(f"{algo}: the tensor must be contiguous (got strides {tuple(tensor.stride())})")
    return tensor.view(-1)


# Elements per torch add: at most torch's intra-op grain size (at::internal::GRAIN_SIZE = 32768), so the sum
# runs on the calling thread as gloo's own reduction does. Letting torch fan a large add out to its intra-op
# threads made an 8 MB add take 25 ms instead of 1-3 ms with two workers on a loaded 2-core VM.
_REDUCE_PIECE = 1 << 15


def reduce_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst += src`` in place (sum; torch ops, so float16/bfloat16/integers work whatever gloo supports)."""
    n = dst.numel()
    if n <= _REDUCE_PIECE:
        dst.add_(src)
        return
    for a in range(0, n, _REDUCE_PIECE):
        dst[a : a + _REDUCE_PIECE].add_(src[a : a + _REDUCE_PIECE])


_scratch = threading.local()


def scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A receive buffer of ``numel`` elements, reused across calls by the calling thread (grow-only, one per
    thread): a fresh multi-megabyte ``torch.empty`` costs page faults on every call (14 ms per 8 MB here)."""
    nbytes = numel * dtype.itemsize
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        _scratch.buf = buf
    return buf[:nbytes].view(dtype)


# ---------------------------------------------------------------------------------------------------------
# One call's point-to-point operations.


@dataclass(slots=True)
class Pending:
    """A posted send or receive: its torch Work and where it sits in the schedule (for error messages)."""

    work: Any
    step: int | str
    peer: int
    what: str


class P2P:
    """Point-to-point operations of one call of ``algo``'s ``op`` on ``group``; peers are group ranks.

    ``rank``/``size`` are this process's rank in the group and the group's size; ``tag`` is put on every
    message (concurrent schedules on one group, e.g. one per thread, use different tags). Errors of posting
    or waiting raise :class:`CollectiveError` naming ``algo``, ``op``, the step and the peer.
    """

    __slots__ = ("algo", "op", "group", "tag", "rank", "size", "_pg")

    def __init__(self, algo: str, op: str, group: Any = None, *, tag: int = 0):
        self.algo, self.op, self.group, self.tag = algo, op, group, tag
        self._pg = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self._pg)
        self.size = dist.get_world_size(self._pg)
        if self.rank < 0:
            raise ValueError(f"{algo} {op}: this process is not a member of the group")

    def _fail(self, step: int | str, peer: int, what: str, exc: BaseException) -> CollectiveError:
        return CollectiveError(f"{self.algo} {self.op}: step {step}: peer {peer} ({what}): {first_line(exc)}")

    def isend(self, tensor: torch.Tensor, peer: int, step: int | str) -> Pending:
        nbytes = tensor.numel() * tensor.element_size()
        what = f"send of {nbytes} bytes"
        try:
            work = dist.isend(tensor, global_rank(self.group, peer), group=self._pg, tag=self.tag)
        except Exception as exc:
            raise self._fail(step, peer, what, exc) from exc
        _count(nbytes)
        return Pending(work, step, peer, what)

    def irecv(self, tensor: torch.Tensor, peer: int, step: int | str) -> Pending:
        what = f"receive of {tensor.numel() * tensor.element_size()} bytes"
        try:
            work = dist.irecv(tensor, global_rank(self.group, peer), group=self._pg, tag=self.tag)
        except Exception as exc:
            raise self._fail(step, peer, what, exc) from exc
        return Pending(work, step, peer, what)

    def wait(self, *pending: Pending | None) -> None:
        """Wait for each posted operation in order (within the group's timeout); None entries are skipped."""
        for p in pending:
            if p is None:
                continue
            try:
                p.work.wait()
            except Exception as exc:
                raise self._fail(p.step, p.peer, p.what, exc) from exc

    def send(self, tensor: torch.Tensor, peer: int, step: int | str) -> None:
        self.wait(self.isend(tensor, peer, step))

    def recv(self, tensor: torch.Tensor, peer: int, step: int | str) -> None:
        self.wait(self.irecv(tensor, peer, step))

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, step: int | str) -> None:
        """Send ``send`` to ``dst`` while receiving ``recv`` from ``src`` (both posted, then both waited)."""
        r = self.irecv(recv, src, step)
        s = self.isend(send, dst, step)
        self.wait(r, s)


def begin(
    algo: str, op: str, tensor: torch.Tensor, group: Any, root: int = 0
) -> tuple[P2P, torch.Tensor] | None:
    """Start one call: check ``root`` and the tensor; ``None`` when there is nothing to move (``P == 1`` or
    an empty tensor), else the call's :class:`P2P` and the tensor's flat view."""
    comm = P2P(algo, op, group)
    if not 0 <= root < comm.size:
        raise ValueError(f"{algo} {op}: root {root} is not a rank of a group of {comm.size}")
    flat = flat_view(tensor, algo)
    if comm.size == 1 or flat.numel() == 0:
        return None
    return comm, flat
