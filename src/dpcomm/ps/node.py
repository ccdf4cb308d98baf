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
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.errors import first_line
from dpcomm.ps.keys import Key, assign_keys

__all__ = ["Layout", "PsError", "PsServer", "PsWorker", "Ticket"]

_PUSH_TAG = 1000  # + 2 g (values or indices) / + 2 g + 1 (values of a sparse push)
_PULL_TAG = 500000  # + k
_PROBE_TAG = 900000  # + k
_REQUEST = 20000  # a request of batch k of a pull tagged ``tag``: ``tag + _REQUEST + k``


class PsError(RuntimeError):
    """A parameter-server message failed (a peer died or timed out); the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Who is who and which slice of which server each (unit, server) message is; the same on every rank."""

    workers: int
    servers: int
    colocated: bool
    numels: tuple[int, ...]
    """Elements per parameter tensor (model parameter order)."""
    layer_params: tuple[tuple[int, ...], ...]
    """Parameter indices of each layer, forward order (ascending, contiguous)."""
    keys: tuple[Key, ...] = field(init=False)
    _memo: dict[Any, Any] = field(init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(assign_keys(self.numels, self.servers)))
        object.__setattr__(self, "_memo", {})

    def server_rank(self, s: int) -> int:
        return s if self.colocated else self.workers + s

    @property
    def world(self) -> int:
        return self.workers if self.colocated else self.workers + self.servers

    def is_worker(self, rank: int) -> bool:
        return rank < self.workers

    def server_of(self, rank: int) -> int | None:
        """The server index this rank runs, or None."""
        if self.colocated:
            return rank if rank < self.workers else None
        return rank - self.workers if rank >= self.workers else None

    def send_order(self, s: int) -> list[int]:
        """The workers server ``s`` sends each pull batch to, in order: ``s + 1, s + 2, ...`` (mod ``W``;
        its own worker last, and skipped). At any turn the servers then send to different workers, as the
        shift schedule of an all-to-all does, and every worker's link carries one server's slice at a time.
        In worker order (0, 1, ...), with three co-located workers, servers 1 and 2 both sent each batch
        to worker 0 first, sharing its link while worker 2's stood idle. Measured once that way (star:3 at
        50 Mbit/s, compute emulated, receives first): ``ibatch``'s three batches at 0.89 of the model,
        quartiles 122-151 ms; in the rotated order no plan measured below 0.98 of it (``docs/ps.md``)."""
        return [(s + j) % self.workers for j in range(1, self.workers + 1)]

    def shard_keys(self, s: int) -> list[Key]:
        if ("shard", s) not in self._memo:
            self._memo["shard", s] = [k for k in self.keys if k.server == s]
        return self._memo["shard", s]

    def message(self, layers: tuple[int, int], s: int) -> list[Key]:
        """Keys of server ``s`` for the layers ``first..last`` (inclusive), in shard order."""
        memo = ("msg", tuple(layers), s)
        if memo not in self._memo:
            first, last = layers
            params = {p for l in range(first, last + 1) for p in self.layer_params[l]}
            self._memo[memo] = [k for k in self.shard_keys(s) if k.tensor in params]
        return self._memo[memo]

    def shard_slice(self, layers: tuple[int, int], s: int) -> tuple[int, int]:
        """``[start, stop)`` of that message inside server ``s``'s shard (contiguous: layers are)."""
        memo = ("slice", tuple(layers), s)
        if memo not in self._memo:
            keys, off, first = self.message(layers, s), 0, 0
            for k in self.shard_keys(s):
                if keys and k == keys[0]:
                    first = off
                off += k.numel
            self._memo[memo] = (first, first + sum(k.numel for k in keys)) if keys else (0, 0)
        return self._memo[memo]


def lane(lanes: Any, src: int, dst: int) -> Any:
    """The process group of a message from ``src`` to ``dst``: ``lanes`` is ``(up, down[, asks])``
    (module docstring), or one group (or None, the default group) for both directions."""
    if isinstance(lanes, tuple):
        return lanes[0] if src < dst else lanes[1]
    return lanes


def ask_lane(lanes: Any, src: int, dst: int) -> Any:
    """The process group of a pull request: the third of ``lanes`` where given, so that a request never
    queues behind a batch going the same way on the same connection; else :func:`lane`."""
    return lanes[2] if isinstance(lanes, tuple) and len(lanes) > 2 else lane(lanes, src, dst)


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


class PsServer:
    """Server ``s``: its shard of parameters, the optimizer on it, the pushes it expects."""

    def __init__(
        self,
        layout: Layout,
        s: int,
        flat_params: Sequence[torch.Tensor],
        pushes: Sequence[tuple[int, int]],
        *,
        lr: float,
        momentum: float,
        weight_decay: float = 0.0,
        sparsify: float | None = None,
        group: Any = None,
    ) -> None:
        self.layout, self.s, self.pushes, self.sparsify, self.group = layout, s, list(pushes), sparsify, group
        self.rank = layout.server_rank(s)
        keys = layout.shard_keys(s)
        data = (
            torch.cat([flat_params[k.tensor].detach().reshape(-1)[k.start : k.stop] for k in keys])
            if keys
            else torch.zeros(0)
        )
        self.shard = torch.nn.Parameter(data.clone(), requires_grad=False)
        self.optimizer = torch.optim.SGD([self.shard], lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.slices = [layout.shard_slice(u, s) for u in pushes]
        self._recv: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}  # (worker, group) -> buffers
        self._works: list[tuple[Any, str]] = []
        self._sends: list[tuple[Any, str]] = []
        self._answers: list[_Job] = []  # request mode: one thread per remote worker
        self.local: dict[int, tuple[torch.Tensor, ...]] = {}  # group -> the co-located worker's own push
        self.sending_unix: float | None = None  # when :meth:`serve` last began sending (time.time())

    def _n(self, g: int) -> int:
        a, b = self.slices[g]
        return b - a

    def _k(self, g: int) -> int:
        return min(self._n(g), math.ceil(self.sparsify * self._n(g))) if self.sparsify else self._n(g)

    def post_pushes(self) -> None:
        """Post the receives of one iteration's pushes from every worker."""
        for w in range(self.layout.workers):
            if w == self.rank:
                continue
            for g in range(len(self.pushes)):
                if not self._n(g):
                    continue
                if self.sparsify:
                    idx, val = torch.empty(self._k(g), dtype=torch.int64), torch.empty(self._k(g))
                    bufs = (idx, val)
                    tags = (_PUSH_TAG + 2 * g, _PUSH_TAG + 2 * g + 1)
                else:
                    bufs, tags = (torch.empty(self._n(g)),), (_PUSH_TAG + 2 * g,)
                self._recv[w, g] = bufs
                for buf, tag in zip(bufs, tags, strict=True):
                    self._works.append(
                        (
                            dist.irecv(buf, w, group=lane(self.group, w, self.rank), tag=tag),
                            f"push {g} from rank {w}",
                        )
                    )

    def serve(
        self,
        pulls: Sequence[tuple[int, int]],
        *,
        post_next: bool = True,
        align: Callable[[], None] | None = None,
        request: bool = False,
    ) -> float:
        """Sum the pushes, update the shard, post the next pushes (unless this was the last iteration: a
        receive left posted would catch a later run's messages), call ``align`` (co-located runs: every
        server sends at once, :meth:`dpcomm.ps.rank.PsRank._align_sends`), send ``pulls`` (or, with
        ``request``, answer each worker's requests of them, and post the next pushes only once every answer
        is out: module docstring); returns the update time."""
        self.finish()  # last iteration's pulls must be out before the shard changes
        for work, what in self._works:
            _wait(work, what, self.rank)
        self._sends, self._works = [], []
        grad = torch.zeros_like(self.shard)
        for w in range(self.layout.workers):  # rank order: the same sum on every run
            for g, (a, b) in enumerate(self.slices):
                if a == b:
                    continue
                bufs = self.local.pop(g) if w == self.rank else self._recv.pop((w, g))
                if self.sparsify:
                    grad[a:b].index_add_(0, bufs[0], bufs[1])
                else:
                    grad[a:b] += bufs[0]
        grad /= self.layout.workers
        t0 = time.perf_counter()
        self.shard.grad = grad
        self.optimizer.step()
        self.shard.grad = None
        update_s = time.perf_counter() - t0
        if post_next and not request:
            self.post_pushes()
        if align is not None:
            align()
        self.sending_unix = time.time()  # the pulls start here; posting every send takes time of its own
        if request:
            self.answer(pulls, _PULL_TAG, then=self.post_pushes if post_next else None)
        else:
            self.send(pulls, _PULL_TAG)
        return update_s

    def send(self, units: Sequence[tuple[int, int]], tag: int) -> list[Any]:
        """Send every unit's slice of the shard to every other worker, unit by unit (plan order), the
        workers of each unit in :meth:`Layout.send_order`."""
        works = []
        order = self.layout.send_order(self.s)
        for k, u in enumerate(units):
            a, b = self.layout.shard_slice(u, self.s)
            if a == b:
                continue
            for w in order:
                if w != self.rank:
                    work = dist.isend(
                        self.shard.data[a:b], w, group=lane(self.group, self.rank, w), tag=tag + k
                    )
                    works.append(work)
                    self._sends.append((work, f"pull {k} to rank {w}"))
        return works

    def answer(
        self, units: Sequence[tuple[int, int]], tag: int, *, then: Callable[[], None] | None = None
    ) -> None:
        """Request mode: a thread per other worker sends it each unit's slice once it asks (module
        docstring), and ``then`` runs once every one has answered its last; returns at once,
        :meth:`finish` joins."""
        jobs = [_Job(self._answer, w, list(units), tag) for w in range(self.layout.workers) if w != self.rank]
        self._answers += jobs
        if then is not None:
            self._answers.append(_Job(_after, jobs, then))

    def _answer(self, w: int, units: list[tuple[int, int]], tag: int) -> None:
        ask = torch.zeros(1, dtype=torch.int64)
        for k, u in enumerate(units):
            a, b = self.layout.shard_slice(u, self.s)
            if a == b:
                continue
            _wait(
                dist.irecv(ask, w, group=ask_lane(self.group, w, self.rank), tag=tag + _REQUEST + k),
                f"request of pull {k} from rank {w}",
                self.rank,
            )
            work = dist.isend(self.shard.data[a:b], w, group=lane(self.group, self.rank, w), tag=tag + k)
            _wait(work, f"pull {k} to rank {w}", self.rank)

    def finish(self) -> None:
        for work, what in self._sends:
            _wait(work, what, self.rank)
        self._sends = []
        jobs, self._answers = self._answers, []
        for job in jobs:
            job.join()

    def state(self) -> dict[str, torch.Tensor]:
        """The shard and its momentum buffer (zeros before the first step)."""
        buf = self.optimizer.state.get(self.shard, {}).get("momentum_buffer")
        return {"param": self.shard.data.clone(), "momentum": buf.clone() if buf is not None else None}

    def load(self, param: torch.Tensor, momentum: torch.Tensor | None) -> None:
        self.shard.data.copy_(param)
        if momentum is not None:
            self.optimizer.state[self.shard]["momentum_buffer"] = momentum.clone()


class PsWorker:
    """A worker's view: ``push(unit) -> ticket``, ``pull(units) -> tickets``, ``wait(ticket)``."""

    def __init__(
        self,
        layout: Layout,
        rank: int,
        params: Sequence[torch.Tensor],
        *,
        sparsify: float | None = None,
        server: PsServer | None = None,
        group: Any = None,
    ) -> None:
        self.layout, self.rank, self.params, self.sparsify = layout, rank, list(params), sparsify
        self.server, self.group = server, group  # the co-located server of this rank, if any
        self.residual: dict[tuple[int, int], torch.Tensor] = {}  # (group, server) -> unsent gradient
        self._sends: list[tuple[Any, str, torch.Tensor]] = []
        self._units: list[tuple[int, int]] = []
        self._asker: _Job | None = None  # request mode: the thread asking for this iteration's batches
        self.wait_s = 0.0  # seconds blocked in wait() since last reset

    def _gather(self, keys: list[Key], grads: bool) -> torch.Tensor:
        parts = []
        for k in keys:
            p = self.params[k.tensor]
            src = p.grad if grads else p.detach()
            flat = torch.zeros(p.numel()) if src is None else src.reshape(-1)
            parts.append(flat[k.start : k.stop])
        return torch.cat(parts) if parts else torch.zeros(0)

    def push(self, g: int, unit: tuple[int, int]) -> Ticket:
        """Send push group ``g`` (layers ``unit``) to every server; returns at once."""
        parts = []
        for s in range(self.layout.servers):
            keys = self.layout.message(unit, s)
            if not keys:
                continue
            vals = self._gather(keys, grads=True)
            if self.sparsify:
                res = self.residual.get((g, s))
                vals = vals + res if res is not None else vals.clone()
                k = min(vals.numel(), math.ceil(self.sparsify * vals.numel()))
                idx = torch.topk(vals.abs(), k, sorted=False).indices.sort().values
                bufs = (idx, vals[idx].clone())
                vals[idx] = 0.0
                self.residual[g, s] = vals  # error feedback: what was not sent goes out next time
            else:
                bufs = (vals,)
            dst = self.layout.server_rank(s)
            if self.server is not None and dst == self.rank:
                self.server.local[g] = bufs
                parts.append((s, keys, bufs[0], None))
                continue
            for i, buf in enumerate(bufs):
                work = dist.isend(buf, dst, group=lane(self.group, self.rank, dst), tag=_PUSH_TAG + 2 * g + i)
                self._sends.append((work, f"push {g} to rank {dst}", buf))
            parts.append((s, keys, bufs[0], None))
        return Ticket(unit=g, parts=parts, done=True)

    def finish_pushes(self) -> None:
        for work, what, _buf in self._sends:
            _wait(work, what, self.rank)
        self._sends = []

    def pull(
        self, units: Sequence[tuple[int, int]], tag: int = _PULL_TAG, *, post: bool = True
    ) -> list[Ticket]:
        """Post the receives of every unit (a batch of layers) from every server; returns one ticket each
        (``post=False``: the buffers only, for :meth:`request`)."""
        tickets = []
        self._units = list(units)
        for k, u in enumerate(units):
            parts = []
            for s in range(self.layout.servers):
                keys = self.layout.message(u, s)
                if not keys:
                    continue
                src = self.layout.server_rank(s)
                if self.server is not None and src == self.rank:
                    parts.append((s, keys, None, None))  # local: read the shard when waited on
                    continue
                buf = torch.empty(sum(key.numel for key in keys))
                work = (
                    dist.irecv(buf, src, group=lane(self.group, src, self.rank), tag=tag + k)
                    if post
                    else None
                )
                parts.append((s, keys, buf, work))
            tickets.append(Ticket(unit=k, parts=parts))
        return tickets

    def request(self, units: Sequence[tuple[int, int]], tag: int = _PULL_TAG) -> list[Ticket]:
        """Request mode: like :meth:`pull`, but a thread asks the servers for unit ``k`` only once unit
        ``k-1`` is in (module docstring); joins the last call's thread (re-raising its error), starts this
        one's and returns."""
        if self._asker is not None:  # the last iteration's thread has set all its events, or failed
            self._asker.join()
        tickets = self.pull(units, tag, post=False)
        for t in tickets:
            t.arrived = threading.Event()
        self._asker = _Job(self._ask, tickets, tag)
        for t in tickets:
            t.job = self._asker
        return tickets

    def _ask(self, tickets: list[Ticket], tag: int) -> None:
        """Ask for each ticket's unit once the last one is in; the next request goes out before the
        event is set, so the waiting forward never delays it."""
        ask = torch.zeros(1, dtype=torch.int64)
        posted = self._post_request(tickets[0], tag, ask) if tickets else []
        for i, t in enumerate(tickets):
            for work, what in posted:
                _wait(work, what, self.rank)
            t.arrived_s = time.perf_counter()
            posted = self._post_request(tickets[i + 1], tag, ask) if i + 1 < len(tickets) else []
            t.arrived.set()

    def _post_request(self, t: Ticket, tag: int, ask: torch.Tensor) -> list[tuple[Any, str]]:
        t.asked_s = time.perf_counter()
        works = []
        for s, _keys, buf, _ in t.parts:
            if buf is None:  # co-located own shard: nothing to ask
                continue
            src = self.layout.server_rank(s)
            up, down = ask_lane(self.group, self.rank, src), lane(self.group, src, self.rank)
            works.append((dist.isend(ask, src, group=up, tag=tag + _REQUEST + t.unit), f"request {t.unit}"))
            works.append(
                (dist.irecv(buf, src, group=down, tag=tag + t.unit), f"pull {t.unit} from rank {src}")
            )
        return works

    def wait(self, ticket: Ticket, *, into_params: bool = True) -> None:
        """Complete a pull: wait for its messages and write them into the parameters."""
        if ticket.done:
            return
        t0 = time.perf_counter()
        if ticket.arrived is not None:
            while not ticket.arrived.wait(0.5):  # a failed request thread sets nothing: its error is ours
                ticket.job.check()
        for s, keys, buf, work in ticket.parts:
            if work is not None:
                _wait(work, f"pull {ticket.unit} from rank {self.layout.server_rank(s)}", self.rank)
            if not into_params:
                continue
            if buf is None:  # co-located own shard
                a, b = self.layout.shard_slice(self._units[ticket.unit], s)
                buf = self.server.shard.data[a:b]
            off = 0
            with torch.no_grad():
                for k in keys:
                    self.params[k.tensor].view(-1)[k.start : k.stop].copy_(buf[off : off + k.numel])
                    off += k.numel
        ticket.done = True
        self.wait_s += time.perf_counter() - t0
