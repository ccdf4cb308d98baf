"""Server ``s`` of a BSP parameter server: its shard, the SGD step on it, the pushes it expects, the pulls it
sends or answers (the protocol: :mod:`dpcomm.ps.node`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.ps import tags
from dpcomm.ps.layout import Layout, ask_lane, lane
from dpcomm.ps.node import _after, _Job, _wait

__all__ = ["PsServer"]


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
        # on the host (a GPU model's too): pushes and pulls are CPU messages (gloo's point-to-point sends)
        self.shard = torch.nn.Parameter(data.to("cpu", copy=True), requires_grad=False)
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
                    tgs = (tags.push(g, 0), tags.push(g, 1))
                else:
                    bufs, tgs = (torch.empty(self._n(g)),), (tags.push(g, 0),)
                self._recv[w, g] = bufs
                for buf, tag in zip(bufs, tgs, strict=True):
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
            self.answer(pulls, tags.PULL, then=self.post_pushes if post_next else None)
        else:
            self.send(pulls, tags.PULL)
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
                        self.shard.data[a:b], w, group=lane(self.group, self.rank, w), tag=tags.pull(tag, k)
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
                dist.irecv(ask, w, group=ask_lane(self.group, w, self.rank), tag=tags.request(tag, k)),
                f"request of pull {k} from rank {w}",
                self.rank,
            )
            work = dist.isend(
                self.shard.data[a:b], w, group=lane(self.group, self.rank, w), tag=tags.pull(tag, k)
            )
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
