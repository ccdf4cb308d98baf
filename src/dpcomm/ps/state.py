"""A parameter-server run's checkpoint state: the current parameters and momentum live on the servers.

At an iteration a checkpoint is due (the same test on every rank), every server sends its shard's momentum
to rank 0 and rank 0 completes its pulls early, so that its ``model`` and ``optimizer`` hold the whole
current state in the usual ``state_dict`` form; with top-k pushes every worker's unsent residual goes to
rank 0 too. A resumed run hands each server its slice of the momentum back and each worker its residual
(bitwise continuation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dpcomm.ps import tags
from dpcomm.ps.node import Ticket

if TYPE_CHECKING:
    from dpcomm.ps.rank import PsRank

__all__ = ["PsState"]


class PsState:
    """This rank's part of gathering and restoring the checkpoint state (module docstring)."""

    def __init__(self, ps: PsRank) -> None:
        self.optimizer, self.params, self.spec, self.rank, self.group = (
            ps.optimizer, ps.params, ps.spec, ps.rank, ps.group)  # fmt: skip
        self.layout, self.server, self.worker, self.pushes = ps.layout, ps.server, ps.worker, ps.pushes
        self.residuals: dict[int, torch.Tensor] = {}  # rank 0, at a checkpoint: every worker's residual

    def load_server_momentum(self) -> None:
        """Resuming: the worker optimizer holds the checkpoint's momentum; hand the server its slice."""
        bufs = [self.optimizer.state.get(p, {}).get("momentum_buffer") for p in self.params]
        if self.server is None or all(b is None for b in bufs):
            return
        keys = self.layout.shard_keys(self.server.s)
        mom = torch.cat([bufs[k.tensor].reshape(-1)[k.start : k.stop] for k in keys]).cpu() if keys else None
        self.server.load(self.server.shard.data, mom)

    def collect(self, tickets: list[Ticket]) -> None:
        """A checkpoint is due: rank 0 gets every shard's momentum and completes its pulls (docstring)."""
        works = []
        if self.server is not None:
            st = self.server.state()
            mom = st["momentum"] if st["momentum"] is not None else torch.zeros_like(st["param"])
            if self.rank != 0 and mom.numel():
                works.append(dist.isend(mom, 0, group=self.group, tag=tags.MOMENTUM))
            self._own_mom = mom
        if self.rank == 0:
            shards = {}
            for s in range(self.layout.servers):
                n = sum(k.numel for k in self.layout.shard_keys(s))
                src = self.layout.server_rank(s)
                if src == 0:
                    shards[s] = self._own_mom
                elif n:
                    shards[s] = torch.empty(n)
                    works.append(dist.irecv(shards[s], src, group=self.group, tag=tags.MOMENTUM))
            for w in works:
                w.wait()
            works = []
            for t in tickets:
                self.worker.wait(t)
            for i, p in enumerate(self.params):
                buf = torch.zeros_like(p).reshape(-1)
                for s in range(self.layout.servers):
                    off = 0
                    for k in self.layout.shard_keys(s):
                        if k.tensor == i:
                            buf[k.start : k.stop] = shards[s][off : off + k.numel]
                        off += k.numel
                self.optimizer.state[p]["momentum_buffer"] = buf.view_as(p)
        for w in works:
            w.wait()
        if self.spec.sparsify:  # error feedback: each worker's residual is state too
            works = []
            if self.worker is not None and self.rank != 0:
                works.append(dist.isend(self._residual_flat(), 0, group=self.group, tag=tags.RESIDUAL))
            if self.rank == 0:
                n = sum(n for _, n in self._residual_parts())
                self.residuals = {0: self._residual_flat()}
                for w in range(1, self.layout.workers):
                    self.residuals[w] = torch.empty(n)
                    works.append(dist.irecv(self.residuals[w], w, group=self.group, tag=tags.RESIDUAL))
            for w in works:
                w.wait()

    def _residual_parts(self) -> list[tuple[tuple[int, int], int]]:
        """``((group, server), elements)`` of every push message, in a fixed order."""
        return [
            ((g, s), sum(k.numel for k in self.layout.message(u, s)))
            for g, u in enumerate(self.pushes)
            for s in range(self.layout.servers)
        ]

    def _residual_flat(self) -> torch.Tensor:
        parts = [self.worker.residual.get(key, torch.zeros(n)) for key, n in self._residual_parts()]
        return torch.cat(parts) if parts else torch.zeros(0)

    def load_residual(self, flat: torch.Tensor) -> None:
        off = 0
        for key, n in self._residual_parts():
            if n:
                self.worker.residual[key] = flat[off : off + n].clone()
            off += n

    def checkpoint_state(self, pull_plan: Any) -> dict[str, Any]:
        """What a checkpoint needs beyond ``model`` and ``optimizer``: the pull plan, and with top-k pushes
        every worker's unsent residual (rank 0 holds them after a checkpoint iteration)."""
        return {"pull_plan": pull_plan.to_dict(), "residuals": dict(self.residuals) or None}
