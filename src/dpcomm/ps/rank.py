"""One rank of a BSP parameter-server run: a worker (and, co-located, a server) or a dedicated server; it
runs a given pull plan and nothing else.

:class:`PsRank` drives :mod:`dpcomm.ps.server` and :mod:`dpcomm.ps.worker` for one training iteration at a
time and is what the training loop holds (:mod:`dpcomm.train.ps_replica`). Set-up, on every rank:

1. every rank builds the model from one seed (or the checkpoint), so workers and servers start equal;
2. layers are the learnable layers (:func:`dpcomm.models.learnable_layers`) in the order rank 0's forward
   first runs them (:func:`dpcomm.ps.probe.forward_layers`), and the parameters (so keys and shards) follow
   that order; push groups come from the spec (``wfbp``: one per layer, last first; ``single``: one);
3. the pull plan, decided with the other ranks (:mod:`dpcomm.ps.planning`: measured by
   :mod:`dpcomm.ps.probe`, planned by :mod:`dpcomm.planner.pull`), or handed in (``pull_plan``);
4. forward pre-hooks wait for each pull batch, post-accumulate-grad hooks push each group once its
   gradients exist.

Checkpoint state (the servers' momentum, the workers' residuals) is :mod:`dpcomm.ps.state`'s.

A model on a GPU trains through CPU messages (gloo's point-to-point sends take CPU tensors only): pushes
are copied to the host, shards live there, pulls are copied into the parameters. The iteration's marks
are read once the device ran the work queued before them (:func:`dpcomm.timing.now`), so ``forward_s``,
``backward_s`` and ``total_s`` are device times.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError
from dpcomm.models.layers import layer_params
from dpcomm.models.loss import classification_loss
from dpcomm.planner.pull import PullPlan
from dpcomm.ps import tags
from dpcomm.ps.layout import Layout
from dpcomm.ps.node import Ticket, _wait
from dpcomm.ps.planning import PullPlanning
from dpcomm.ps.probe import forward_layers, forward_layout, unit_of
from dpcomm.ps.server import PsServer
from dpcomm.ps.spec import PsSpec
from dpcomm.ps.state import PsState
from dpcomm.ps.worker import PsWorker
from dpcomm.runtime.records import Phase
from dpcomm.timing import now
from dpcomm.utils.groups import group_timeout

__all__ = ["MAX_LAYERS", "PsRank", "forward_layers"]

MAX_LAYERS = tags.MAX_UNITS
"""Layers a parameter-server model may have: message tags are a base plus a layer's or batch's index."""


class PsRank:
    """This rank's part of a parameter-server run (module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.SGD,
        spec: PsSpec,
        *,
        rank: int,
        workers: int,
        start: int = 0,
        ckpt_at: Callable[[int], bool] = lambda _t: False,
        sample: torch.Tensor | None = None,
        group: Any = None,
        log: Callable[[str], None] = lambda _m: None,
        stop: int | None = None,
        resumed: dict[str, Any] | None = None,
        lanes: tuple[Any, ...] | None = None,
        align_sends: bool = True,
        pull_plan: PullPlan | None = None,
    ) -> None:
        """``lanes``: the process groups of pushes and pulls, lower to higher rank and back, and of pull
        requests (:mod:`dpcomm.ps.node`), over ``group``'s ranks; None: made here, which every rank of the
        default group must then do at the same point (``torch.distributed.new_group``). ``align_sends``:
        co-located servers start their pull sends together (:meth:`_align_sends`); False only to measure
        without. ``pull_plan``: run this plan (every rank the same) instead of deciding one."""
        self.model, self.optimizer, self.spec, self.rank, self.group = model, optimizer, spec, rank, group
        self.ckpt_at, self.it, self.log, self.stop = ckpt_at, start, log, stop
        self.align_sends = align_sends
        self.device = next((p.device for p in model.parameters()), None)
        """Where the model computes (the iteration's marks wait for it; messages stay on the CPU)."""
        self._request = spec.pulls == "request"
        self.layers, self.wait_at = forward_layout(model, sample, group)  # wait_at: where each pull waits
        mods = self.layers
        owned = layer_params(model, [("", m) for m in mods])  # a shared parameter goes with its first layer
        # parameters (and so keys, shards and pull messages) in forward order: a batch is a contiguous run
        self.params = [p for ps in owned for p in ps]
        first = [sum(len(ps) for ps in owned[:l]) for l in range(len(owned))]
        layer_params_ = tuple(tuple(range(f, f + len(ps))) for f, ps in zip(first, owned, strict=True))
        servers = spec.servers or workers
        self.layout = Layout(
            workers=workers,
            servers=servers,
            colocated=not spec.servers,
            numels=tuple(p.numel() for p in self.params),
            layer_params=layer_params_,
        )
        L = len(mods)
        if L > MAX_LAYERS:  # message tags are a base plus the layer's or batch's index (dpcomm.ps.tags)
            raise UserError(
                f"the parameter server takes up to {MAX_LAYERS} learnable layers, this model has {L}"
            )
        self.pushes = [(l, l) for l in range(L - 1, -1, -1)] if spec.push == "wfbp" else [(0, L - 1)]
        if lanes is None:  # pushes and pulls one group per direction, requests a third (dpcomm.ps.node),
            # with the run's timeout (new_group's own default is 30 minutes)
            members = dist.get_process_group_ranks(group) if group is not None else None
            lanes = tuple(dist.new_group(members, timeout=group_timeout(group)) for _ in range(3))
        g_cfg = optimizer.param_groups[0]
        s = self.layout.server_of(rank)
        self.server = None
        if s is not None:
            self.server = PsServer(
                self.layout,
                s,
                self.params,
                self.pushes,
                lr=g_cfg["lr"],
                momentum=g_cfg["momentum"],
                weight_decay=g_cfg["weight_decay"],
                sparsify=spec.sparsify,
                group=lanes,
            )
        self.worker = None
        if self.layout.is_worker(rank):
            self.worker = PsWorker(
                self.layout, rank, self.params, sparsify=spec.sparsify, server=self.server, group=lanes
            )
        self.state = PsState(self)
        self.state.load_server_momentum()
        if pull_plan is None:
            pull_plan = PullPlanning(self, log).plan(mods, sample)
        self.pull_plan = pull_plan
        self.units = list(self.pull_plan.batches)
        self.tickets: list[Ticket] = []
        self._hooks: list[Any] = []
        if self.worker is not None:
            self._install_hooks(mods)
            if resumed and resumed.get("residuals") is not None and rank in resumed["residuals"]:
                self.state.load_residual(resumed["residuals"][rank])
        if self.server is not None:
            self.server.post_pushes()
        self.records: list[dict[str, Any]] = []
        self.loss = float("nan")

    # --- set-up --------------------------------------------------------------------------------------------
    def _install_hooks(self, mods: list[nn.Module]) -> None:
        batch_of = unit_of(self.units)
        for l, m in enumerate(self.wait_at):  # the layer, or the ancestor that uses its weights inline
            self._hooks.append(m.register_forward_pre_hook(lambda _m, _a, k=batch_of[l]: self._wait_batch(k)))
        group_of = unit_of(self.pushes)
        self._need = [sum(len(self.layout.layer_params[l]) for l in range(a, b + 1)) for a, b in self.pushes]
        self._have = [0] * len(self.pushes)
        for l in range(len(mods)):
            for i in self.layout.layer_params[l]:
                g = group_of[l]
                self._hooks.append(
                    self.params[i].register_post_accumulate_grad_hook(lambda _p, g=g: self._ready(g))
                )

    def _align_sends(self) -> None:
        """Co-located: every server starts sending the next pulls at once (a barrier of the run's group,
        after its update). Unaligned, a server that finished its update early sent every batch while the
        others still waited for pushes; its bytes sat in the workers' switch-port queues (FIFO), and the
        late servers' first batches arrived behind them, so the forward waited for its first layers about
        as long as for everything. Measured on ``star:5``/``star:9`` at 100 Mbit/s (16 cores, ResNet-20,
        ``docs/ps.md``): layer-by-layer ``F_N`` 112.7/111.1 ms unaligned, 92.7/96.6 ms aligned against a
        model of 82.5/94.9 ms; ``t_iter`` 298/349 ms to 248/291 ms."""
        _wait(dist.barrier(group=self.group, async_op=True), "the servers' barrier before pulls", self.rank)

    def _pull(self, units: list[tuple[int, int]], tag: int = tags.PULL) -> list[Ticket]:
        """This worker's pulls of ``units``: posted at once (send mode) or asked for one by one."""
        return (self.worker.request if self._request else self.worker.pull)(units, tag)

    def _wait_batch(self, k: int) -> None:
        if k < len(self.tickets):
            self.worker.wait(self.tickets[k])

    def _ready(self, g: int) -> None:
        self._have[g] += 1
        if self._have[g] == self._need[g]:
            self.worker.push(g, self.pushes[g])

    # --- one iteration -------------------------------------------------------------------------------------
    def iteration(self, x: torch.Tensor | None, y: torch.Tensor | None) -> float:
        """One BSP iteration of this rank (a dedicated server ignores ``x``, ``y`` and returns nan)."""
        t0, start_unix = now(self.device), time.time()
        fwd = bwd = 0.0
        update_s = 0.0
        sent_unix = sending_unix = pulls_in_unix = posted_unix = None
        if self.worker is not None:
            self.worker.wait_s = 0.0
            self.optimizer.zero_grad(set_to_none=True)
            out = self.model(x)
            t1 = now(self.device)
            arrived = [t.arrived_s for t in self.tickets if t.arrived_s is not None]
            if arrived:  # request mode: when the last batch of this forward's pulls came in
                pulls_in_unix = start_unix + (max(arrived) - t0)
            loss = classification_loss(out, y)
            self._have = [0] * len(self.pushes)
            loss.backward()
            t2 = now(self.device)
            for g in range(len(self.pushes)):  # layers whose parameters got no gradient
                if self._have[g] < self._need[g]:
                    self._have[g] = self._need[g]
                    self.worker.push(g, self.pushes[g])
            self.worker.finish_pushes()
            fwd, bwd = t1 - t0, t2 - t1
            self.loss = float(loss.detach())
        t2 = now(self.device)
        # co-located, send mode: this worker's receives go out before its server sends. gloo sends a message
        # once the receiver has said "ready" (it answers every receive posted): posted after the sends, the
        # other servers' first batches waited for "ready"s that queued behind data on the shaped links, and
        # whichever worker posted first was served first (three workers on star:3 at 50 Mbit/s, compute
        # emulated: layer-by-layer F_N 105-243 ms per worker against 116-121 modelled; receives first, in
        # the rotated send order: 107-130 ms; docs/ps.md, "Receives first")
        early = self.worker is not None and self.server is not None and not self._request
        if early:
            self.tickets = self._pull(self.units)
            posted_unix = time.time()
        if self.server is not None:
            update_s = self.server.serve(
                self.units,
                post_next=self.stop is None or self.it + 1 < self.stop,
                align=self._align_sends
                if self.layout.colocated and self.align_sends and not self._request
                else None,
                request=self._request,
            )
            sent_unix = time.time()  # the next pulls are on their way (send), or answered from now (request)
            sending_unix = self.server.sending_unix
        if self.worker is not None and not early:
            self.tickets = self._pull(self.units)
            posted_unix = time.time()
        if self.ckpt_at(self.it):
            self.state.collect(self.tickets)
        t3 = now(self.device)
        pull_wait = self.worker.wait_s if self.worker is not None else 0.0
        self.records.append(
            {
                "iteration": self.it,
                "forward_s": fwd,
                "backward_s": bwd,
                "exposed_comm_s": (t3 - t2) + pull_wait,
                "pull_wait_s": pull_wait,
                "step_s": t3 - t2,
                "total_s": t3 - t0,
                "comm_s": None,
                "phase": Phase.STEADY,
                "plan": self.spec.label(),
                "update_s": update_s,
                "start_unix": start_unix,
                "pulls_sending_unix": sending_unix,  # its server began sending (or answering) them
                "pulls_sent_unix": sent_unix,  # ... and had posted every send
                "pulls_posted_unix": posted_unix,  # this worker's receives (send) or requests (request mode)
                "pulls_in_unix": pulls_in_unix,
            }
        )
        self.it += 1
        return self.loss

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint needs beyond ``model`` and ``optimizer`` (:meth:`PsState.checkpoint_state`)."""
        return self.state.checkpoint_state(self.pull_plan)

    def finish(self) -> None:
        """Make every worker current (wait for the pulls posted after the last update)."""
        if self.worker is not None:
            for t in self.tickets:
                self.worker.wait(t)
        if self.server is not None:
            self.server.finish()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
