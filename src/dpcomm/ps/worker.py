"""A worker's client of the BSP parameter server: ``push``, ``pull`` (or ``request``) and ``wait`` on
tickets (the protocol: :mod:`dpcomm.ps.node`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dpcomm.ps import tags
from dpcomm.ps.keys import Key
from dpcomm.ps.layout import Layout, ask_lane, lane
from dpcomm.ps.node import Ticket, _Job, _wait

if TYPE_CHECKING:
    from dpcomm.ps.server import PsServer

__all__ = ["PsWorker"]


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
        """The keys' values in one CPU message (gloo's point-to-point sends take CPU tensors only: a model
        on a GPU is copied to the host here, once per message)."""
        parts = []
        for k in keys:
            p = self.params[k.tensor]
            src = p.grad if grads else p.detach()
            flat = torch.zeros(p.numel(), device=p.device) if src is None else src.reshape(-1)
            parts.append(flat[k.start : k.stop])
        return torch.cat(parts).cpu() if parts else torch.zeros(0)

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
                work = dist.isend(buf, dst, group=lane(self.group, self.rank, dst), tag=tags.push(g, i))
                self._sends.append((work, f"push {g} to rank {dst}", buf))
            parts.append((s, keys, bufs[0], None))
        return Ticket(unit=g, parts=parts, done=True)

    def finish_pushes(self) -> None:
        for work, what, _buf in self._sends:
            _wait(work, what, self.rank)
        self._sends = []

    def pull(
        self, units: Sequence[tuple[int, int]], tag: int = tags.PULL, *, post: bool = True
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
                    dist.irecv(buf, src, group=lane(self.group, src, self.rank), tag=tags.pull(tag, k))
                    if post
                    else None
                )
                parts.append((s, keys, buf, work))
            tickets.append(Ticket(unit=k, parts=parts))
        return tickets

    def request(self, units: Sequence[tuple[int, int]], tag: int = tags.PULL) -> list[Ticket]:
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
            works.append((dist.isend(ask, src, group=up, tag=tags.request(tag, t.unit)), f"request {t.unit}"))
            works.append(
                (
                    dist.irecv(buf, src, group=down, tag=tags.pull(tag, t.unit)),
                    f"pull {t.unit} from rank {src}",
                )
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
