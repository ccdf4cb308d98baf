"""One rank of a BSP parameter-server run: a worker (and, co-located, a server) or a dedicated server.

:class:`PsRank` drives :mod:`dpcomm.ps.node` for one training iteration at a time and is what a training
loop holds (:mod:`dpcomm.train.ps_replica` fits it to the train layer's replica protocol; :mod:`dpcomm.ps.runner`
is a loop of its own). Set-up, on every rank of the run:

1. every rank builds the model from one seed (or the checkpoint), so workers and servers start equal;
2. layers are the learnable layers (:func:`dpcomm.models.learnable_layers`) in the order rank 0's forward
   first runs them (:func:`forward_layers`), and the parameters (so keys and shards) follow that order;
   push groups come from the spec (``wfbp``: one per layer, last first; ``single``: one);
3. the pull plan: ``all`` and ``layer`` need nothing measured; for ``ibatch``/``optimal`` the ranks time
   ``probe_rounds`` rounds of pulling everything in one batch and layer by layer (``T_all = Ts + beta B``,
   ``T_layer = L Ts + beta B``, so ``Ts`` and the per-byte ``beta`` follow, each the median over the
   workers; ``Tt_i = beta * bytes_i``),
   and every worker given a ``sample`` times each layer's forward on it (``C_i``), all of them at once, as
   they compute during training (on a shared machine a forward run alone is faster than one run beside
   the other workers'); rank 0 takes each layer's median over those workers, plans
   (:func:`dpcomm.planner.pull.plan_pulls`), broadcasts the plan, and every rank checks its sha256;
4. the probe (``PsSpec.probe``), where that plan is neither ``all`` nor ``layer``: the workers time
   ``probe_rounds`` rounds of its pulls beside a forward that waits for each batch (:meth:`_probe_overlap`);
   ``confirm`` keeps the plan unless the median ran more than 10% slower than the model, else the better
   of ``all`` and ``layer`` (:func:`dpcomm.planner.pull.confirm_plan`); ``slowdown`` fits ``d`` to it
   (:func:`dpcomm.planner.pull.fit_slowdown`) and rank 0 plans again with it. That plan is broadcast and
   checked as in 3, its ``meta`` holding every input.

Checkpoints: the current parameters and momentum live on the servers. At an iteration a checkpoint is due
(``ckpt_at(t)``, the same test on every rank), every server sends its shard's momentum to rank 0, and rank
0 completes its pulls early, so that its ``model`` and ``optimizer`` hold the whole current state in the
usual ``state_dict`` form; a resumed run hands each server its slice back (bitwise continuation).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError
from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.models.loss import classification_loss
from dpcomm.planner.pull import PullPlan, confirm_plan, fit_slowdown, ibatch_margin, plan_pulls
from dpcomm.ps.node import _PROBE_TAG, _PULL_TAG, _REQUEST, Layout, PsError, PsServer, PsWorker, Ticket, _wait
from dpcomm.ps.spec import PsSpec
from dpcomm.trace.profiler import default_loss, layer_medians
from dpcomm.utils.groups import group_timeout

__all__ = ["PsRank", "forward_layers"]

_MOMENTUM_TAG = 950000
MAX_LAYERS = _REQUEST
"""Layers a parameter-server model may have: pull batch ``k``'s request is tagged ``tag + _REQUEST + k``."""


@contextlib.contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    """Forwards run inside leave ``model``'s buffers (batch-norm statistics) and the CPU random-number
    generator (dropout) as they were."""
    saved = [b.clone() for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        for b, v in zip(model.buffers(), saved, strict=True):
            b.copy_(v)


def _unit_of(units: list[tuple[int, int]]) -> dict[int, int]:
    """Layer -> index of the unit (a ``(first, last)`` run of layers) holding it."""
    return {l: k for k, (a, b) in enumerate(units) for l in range(a, b + 1)}


def forward_layers(model: nn.Module, sample: torch.Tensor | None, group: Any = None) -> list[nn.Module]:
    """The pulled and pushed layers (:func:`dpcomm.models.learnable_layers`), in the order rank 0's forward
    of ``sample`` first runs them (GoogLeNet runs its aux heads mid-forward but registers them last: a pull
    plan in registration order would stall its forward there), the same on every rank (rank 0's order is
    broadcast; a dedicated server has no sample). The ordering forward leaves the batch-norm statistics and
    the random-number generator as they were."""
    names: list[Any] = [None]
    if dist.get_rank(group) == 0:
        with _buffers_kept(model):
            names = [[n for n, _ in learnable_layers(model, sample)]]
    dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    mods = dict(model.named_modules())
    mods[type(model).__name__] = model  # learnable_layers names the root module by its class
    return [mods[n] for n in names[0]]


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
    ) -> None:
        """``lanes``: the process groups of pushes and pulls, lower to higher rank and back, and of pull
        requests (:mod:`dpcomm.ps.node`), over ``group``'s ranks; None: made here, which every rank of the
        default group must then do at the same point (``torch.distributed.new_group``). ``align_sends``:
        co-located servers start their pull sends together (:meth:`_align_sends`); False only to measure
        without."""
        self.model, self.optimizer, self.spec, self.rank, self.group = model, optimizer, spec, rank, group
        self.ckpt_at, self.it, self.log, self.stop = ckpt_at, start, log, stop
        self.align_sends = align_sends
        self._request = spec.pulls == "request"
        self.layers = mods = forward_layers(model, sample, group)
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
        if L > MAX_LAYERS:  # message tags are a base plus the layer's or batch's index (dpcomm.ps.node)
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
            self._load_server_momentum()
        self.worker = None
        if self.layout.is_worker(rank):
            self.worker = PsWorker(
                self.layout, rank, self.params, sparsify=spec.sparsify, server=self.server, group=lanes
            )
        self.pull_plan = self._plan_pulls(mods, sample)
        self.units = list(self.pull_plan.batches)
        self.tickets: list[Ticket] = []
        self._hooks: list[Any] = []
        self.residuals: dict[int, torch.Tensor] = {}  # rank 0, at a checkpoint: every worker's residual
        if self.worker is not None:
            self._install_hooks(mods)
            if resumed and resumed.get("residuals") is not None and rank in resumed["residuals"]:
                self._load_residual(resumed["residuals"][rank])
        if self.server is not None:
            self.server.post_pushes()
        self.records: list[dict[str, Any]] = []
        self.loss = float("nan")

    # --- set-up --------------------------------------------------------------------------------------------
    def _load_server_momentum(self) -> None:
        """Resuming: the worker optimizer holds the checkpoint's momentum; hand the server its slice."""
        bufs = [self.optimizer.state.get(p, {}).get("momentum_buffer") for p in self.params]
        if self.server is None or all(b is None for b in bufs):
            return
        keys = self.layout.shard_keys(self.server.s)
        mom = torch.cat([bufs[k.tensor].reshape(-1)[k.start : k.stop] for k in keys]) if keys else None
        self.server.load(self.server.shard.data, mom)

    def _plan_pulls(self, mods: list[nn.Module], sample: torch.Tensor | None) -> PullPlan:
        L = len(mods)
        if self.spec.pull in ("all", "layer"):
            return plan_pulls([0.0] * L, [0.0] * L, 0.0, self.spec.pull)
        sample = sample if self.worker is not None else None
        Ts, beta, rounds = self._probe(mods, sample)
        remote = [0] * L  # bytes of each layer this rank pulls over the network (not from its own shard)
        layer_of = {i: l for l, ps in enumerate(self.layout.layer_params) for i in ps}
        for k in self.layout.keys:
            if self.layout.server_rank(k.server) != self.rank:
                remote[layer_of[k.tensor]] += k.numel * self.params[k.tensor].element_size()
        mine = self._time_forward(mods, sample)
        every: list[Any] = [None] * self.layout.world
        dist.all_gather_object(every, mine, group=self.group)
        C = layer_medians([c for c in every if c is not None] or [[0.0] * L])
        Tt = [beta * b for b in remote]
        meta = {"Ts_s": Ts, "beta_s_per_byte": beta, "C_s": C, "Tt_s": Tt, "probe_rounds_s": rounds}
        plan = self._agree(self._planned(C, Tt, Ts, 0.0, meta))
        # confirm: all and layer are what a refuted plan falls back to, so there is nothing to probe
        probed = {"none": False, "slowdown": True, "confirm": plan.messages not in (1, L)}[self.spec.probe]
        if probed and any(c is not None for c in every):
            # time that plan beside a forward, then keep it or not (confirm), or fit d and plan again
            overlap_s = self._probe_overlap(mods, sample, list(plan.batches))
            meta = {
                **meta,
                "overlap_batches": [list(b) for b in plan.batches],
                "overlap_forward_s": overlap_s,
                "time_d0_s": plan.time_s,
            }
            if self.spec.probe == "confirm":
                kept = confirm_plan(plan, C, Tt, Ts, overlap_s) if self.rank == 0 else None
                plan = self._agree(replace(kept, meta={**kept.meta, **meta}) if kept else None)
            else:
                # rank 0 plans with its own Tt (the bytes it pulls); the others get its d in the plan's meta
                d = fit_slowdown(plan.batches, C, Tt, Ts, overlap_s) if self.rank == 0 else 0.0
                plan = self._agree(self._planned(C, Tt, Ts, d, {**meta, "slowdown": d}))
        self.log(
            f"[rank {self.rank}] {self.spec.pull} pulls: {plan.messages} batch(es) {list(plan.batches)}, "
            f"Ts {Ts * 1e6:.0f} us, beta {beta * 1e9:.2f} ns/B, "
            f"slowdown {plan.meta.get('slowdown', 0.0):.2f}, model {plan.time_s * 1e3:.2f} ms"
            + (
                ""
                if plan.meta.get("confirmed", True)
                else f" (refuted by its probe: {plan.meta['refuted_batches']})"
            )
        )
        return plan

    def _planned(self, C: list[float], Tt: list[float], Ts: float, d: float, meta: dict) -> PullPlan | None:
        """Rank 0's plan of the spec's method with these inputs (its ``meta`` added); None elsewhere."""
        if self.rank != 0:
            return None
        margin = ibatch_margin(self.layout.workers, 0 if self.layout.colocated else self.layout.servers)
        plan = plan_pulls(C, Tt, Ts, self.spec.pull, slowdown=d, margin=margin)
        plan.meta.update(meta)
        return plan

    def _agree(self, plan: PullPlan | None) -> PullPlan:
        """Rank 0's ``plan`` on every rank, each checking its sha256."""
        box: list[Any] = [plan]
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group
        )
        shas: list[Any] = [None] * self.layout.world
        dist.all_gather_object(shas, box[0].sha256(), group=self.group)
        if len(set(shas)) != 1:
            raise PsError(f"parameter server: ranks disagree on the pull plan: {shas}")
        return box[0]

    def _probe(
        self, mods: list[nn.Module], sample: torch.Tensor | None = None
    ) -> tuple[float, float, list[dict[str, list[float]]]]:
        """``(Ts, beta, rounds)`` from timed pulls (module docstring), known to every rank: each worker's
        own from its median round, then the median over the workers; ``rounds``: every worker's timed
        rounds (s), ``{"all": [...], "layer": [...]}`` each. Every worker's view counts: in a co-located run
        with three or more workers the pulls of one round reach some workers later than others, and rank 0
        alone may be a fast one. Request mode: a worker given a ``sample`` runs one forward of it per round
        that waits for each layer's pull as training's does (:meth:`_forward_pulling`), and the round's time
        ends when the last batch arrived; a request's round trip waits for the threads that make and answer
        it, and those share the CPU with that forward (2 cores, ResNet-20, 2 workers: ``Ts`` 0.21 ms with
        the forward idle, 0.97 ms beside back-to-back forwards, ``docs/ps.md``)."""
        L = len(mods)
        plans = {"all": [(0, L - 1)], "layer": [(l, l) for l in range(L)]}
        times: dict[str, list[float]] = {"all": [], "layer": []}
        busy = self._request and sample is not None
        for _ in range(self.spec.probe_rounds):
            for name, units in plans.items():
                t0, end, tickets = self._probe_round(mods, sample if busy else None, units)
                end = max(t.arrived_s for t in tickets) if busy and tickets else end
                times[name].append(end - t0)
        mine = None
        if self.worker is not None:
            t_all, t_layer = statistics.median(times["all"]), statistics.median(times["layer"])
            remote = sum(
                k.numel * 4 for k in self.layout.keys if self.layout.server_rank(k.server) != self.rank
            )
            Ts = max(0.0, (t_layer - t_all) / max(1, L - 1))
            mine = (Ts, max(0.0, (t_all - Ts) / max(1, remote)), times)
        every: list[Any] = [None] * self.layout.world
        dist.all_gather_object(every, mine, group=self.group)
        seen = [e for e in every if e is not None]
        Ts, beta = statistics.median(e[0] for e in seen), statistics.median(e[1] for e in seen)
        return Ts, beta, [e[2] for e in seen]

    def _probe_round(
        self, mods: list[nn.Module], sample: torch.Tensor | None, units: list[tuple[int, int]]
    ) -> tuple[float, float, list[Ticket]]:
        """One timed round on every rank: pulls of ``units`` from a barrier, beside a forward of ``sample``
        that waits for them (none without one); ``(start, end, tickets)``, ``end`` once the forward is done
        and every batch is in (``time.perf_counter()``)."""
        early = self.worker is not None and not self._request  # receives before any send (``iteration``)
        tickets = self._pull(units, _PROBE_TAG) if early else []
        dist.barrier(group=self.group)
        t0 = time.perf_counter()
        if self.worker is not None and not early:
            tickets = self._pull(units, _PROBE_TAG)
        if self.server is not None:
            (self.server.answer if self._request else self.server.send)(units, _PROBE_TAG)
        with _buffers_kept(self.model):
            out = self._forward_pulling(mods, sample, units, tickets) if sample is not None else None
            # the last batch first: a pair's messages arrive in order, so the rest are in by then and this
            # thread blocks once, not once per message (in order, 5 co-located workers on 2 cores timed
            # layer-by-layer rounds 10-15 ms longer than training's own layer-by-layer pulls, docs/ps.md)
            for t in reversed(tickets):
                self.worker.wait(t, into_params=False)
            end = time.perf_counter()
            if out is not None:  # untimed: a backward after each forward, as in training and _time_forward
                default_loss(out).backward()  # (forwards back to back ran 15-20% slower)
                for p in self.model.parameters():
                    p.grad = None
        if self.server is not None:
            self.server.finish()
        return t0, end, tickets

    def _probe_overlap(
        self, mods: list[nn.Module], sample: torch.Tensor | None, units: list[tuple[int, int]]
    ) -> float:
        """When a forward of ``sample`` that waits for each batch of ``units`` (the plan made without a
        slowdown) ends, from the start of the pulls: the median over ``probe_rounds`` rounds and then over
        the workers (s; nan without a sample), known to every rank. The planner fits its slowdown ``d`` to
        it (:func:`dpcomm.planner.pull.fit_slowdown`): the very batches it would run, so that the fit is
        not steered by a plan where pulls, not the forward, set the time (fitted to layer-by-layer
        request-mode pulls, ``d`` came out 1.8-2.0 from a 1 ms gap, and then overpriced ``ibatch`` by 20%:
        ``docs/ps.md``)."""
        ends = []
        for _ in range(self.spec.probe_rounds):
            t0, end, _tickets = self._probe_round(mods, sample, units)
            ends.append(end - t0)
        mine = statistics.median(ends) if sample is not None else None
        every: list[Any] = [None] * self.layout.world
        dist.all_gather_object(every, mine, group=self.group)
        seen = [e for e in every if e is not None]
        return statistics.median(seen) if seen else float("nan")

    def _forward_pulling(
        self, mods: list[nn.Module], sample: torch.Tensor, units: list[tuple[int, int]], tickets: list[Ticket]
    ) -> torch.Tensor:
        """One forward of ``sample`` whose layers wait for their batch's ticket first, as in training; its
        output (with autograd's graph). The caller keeps the model's buffers (:func:`_buffers_kept`)."""
        batch_of = _unit_of(units)
        hooks = [
            m.register_forward_pre_hook(
                lambda _m, _a, k=batch_of[l]: self.worker.wait(tickets[k], into_params=False)
            )
            for l, m in enumerate(mods)
        ]
        try:
            return self.model(sample)  # with autograd's graph, as in training
        finally:
            for h in hooks:
                h.remove()

    def _time_forward(
        self, mods: list[nn.Module], sample: torch.Tensor | None, rounds: int = 5, warmup: int = 3
    ) -> list[float] | None:
        """``C_i``: each layer's forward time (s), median of ``rounds`` forwards of ``sample`` (None without
        one), after ``warmup`` untimed ones (a new model's first forwards run 1.5x slower while the
        allocator settles: ResNet-20 55, 63, 48, then 34-39 ms), each followed by a backward as in
        training; every rank of the group calls it, and the rounds start together (a barrier each). Layer
        ``i`` owns the time from its start to layer ``i+1``'s, the first from the forward's start, the last
        to its end, so the ``C_i`` add up to the whole forward (pooling, concatenation and activations
        between learnable layers are compute that a pulled batch must wait for too)."""
        if sample is None:
            for _ in range(warmup + rounds):
                dist.barrier(group=self.group)
            return None
        runs: list[list[float]] = []
        marks: dict[int, float] = {}

        def _mark(i: int) -> None:  # a pre-hook must return None: a value would replace the inputs
            marks.setdefault(i, time.perf_counter())

        hooks = [m.register_forward_pre_hook(lambda _m, _a, i=i: _mark(i)) for i, m in enumerate(mods)]
        L = len(mods)
        try:
            with _buffers_kept(self.model):
                for r in range(warmup + rounds):
                    dist.barrier(group=self.group)
                    marks.clear()
                    marks[-1] = time.perf_counter()
                    out = self.model(sample)
                    marks[L] = time.perf_counter()
                    # a backward after each forward, as in training: forwards back to back ran 15-20% slower
                    # (ResNet-20: 47 ms against 40 ms in the training iterations that followed)
                    default_loss(out).backward()
                    del out
                    if r < warmup:
                        continue
                    # layer i owns the forward from its first call to layer i+1's (the operators between
                    # learnable layers, pooling and concatenation, included): the C_i add up to the forward
                    at = [marks.get(i) for i in range(L)]
                    for i in range(L - 1, -1, -1):  # a layer that never ran starts where the next one does
                        at[i] = at[i] if at[i] is not None else (at[i + 1] if i + 1 < L else marks[L])
                    at[0] = marks[-1]
                    runs.append([(at[i + 1] if i + 1 < L else marks[L]) - at[i] for i in range(L)])
        finally:
            for p in self.model.parameters():
                p.grad = None
            for h in hooks:
                h.remove()
        return layer_medians(runs)

    def _install_hooks(self, mods: list[nn.Module]) -> None:
        batch_of = _unit_of(self.units)
        for l, m in enumerate(mods):
            self._hooks.append(m.register_forward_pre_hook(lambda _m, _a, k=batch_of[l]: self._wait_batch(k)))
        group_of = _unit_of(self.pushes)
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

    def _pull(self, units: list[tuple[int, int]], tag: int = _PULL_TAG) -> list[Ticket]:
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
        t0, start_unix = time.perf_counter(), time.time()
        fwd = bwd = 0.0
        update_s = 0.0
        sent_unix = sending_unix = pulls_in_unix = posted_unix = None
        if self.worker is not None:
            self.worker.wait_s = 0.0
            self.optimizer.zero_grad(set_to_none=True)
            out = self.model(x)
            t1 = time.perf_counter()
            arrived = [t.arrived_s for t in self.tickets if t.arrived_s is not None]
            if arrived:  # request mode: when the last batch of this forward's pulls came in
                pulls_in_unix = start_unix + (max(arrived) - t0)
            loss = classification_loss(out, y)
            self._have = [0] * len(self.pushes)
            loss.backward()
            t2 = time.perf_counter()
            for g in range(len(self.pushes)):  # layers whose parameters got no gradient
                if self._have[g] < self._need[g]:
                    self._have[g] = self._need[g]
                    self.worker.push(g, self.pushes[g])
            self.worker.finish_pushes()
            fwd, bwd = t1 - t0, t2 - t1
            self.loss = float(loss.detach())
        t2 = time.perf_counter()
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
            self._collect_state()
        t3 = time.perf_counter()
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
                "phase": "steady",
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

    def _collect_state(self) -> None:
        """A checkpoint is due: rank 0 gets every shard's momentum and completes its pulls (docstring)."""
        works = []
        if self.server is not None:
            st = self.server.state()
            mom = st["momentum"] if st["momentum"] is not None else torch.zeros_like(st["param"])
            if self.rank != 0 and mom.numel():
                works.append(dist.isend(mom, 0, group=self.group, tag=_MOMENTUM_TAG))
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
                    works.append(dist.irecv(shards[s], src, group=self.group, tag=_MOMENTUM_TAG))
            for w in works:
                w.wait()
            works = []
            for t in self.tickets:
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
                works.append(dist.isend(self._residual_flat(), 0, group=self.group, tag=_MOMENTUM_TAG + 1))
            if self.rank == 0:
                n = sum(n for _, n in self._residual_parts())
                self.residuals = {0: self._residual_flat()}
                for w in range(1, self.layout.workers):
                    self.residuals[w] = torch.empty(n)
                    works.append(dist.irecv(self.residuals[w], w, group=self.group, tag=_MOMENTUM_TAG + 1))
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

    def _load_residual(self, flat: torch.Tensor) -> None:
        off = 0
        for key, n in self._residual_parts():
            if n:
                self.worker.residual[key] = flat[off : off + n].clone()
            off += n

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint needs beyond ``model`` and ``optimizer``: the pull plan, and with top-k pushes
        every worker's unsent residual (rank 0 holds them after a checkpoint iteration)."""
        return {"pull_plan": self.pull_plan.to_dict(), "residuals": dict(self.residuals) or None}

    def finish(self) -> None:
        """Make every worker current (wait for the pulls posted after the last update)."""
        if self.worker is not None:
            for t in self.tickets:
                self.worker.wait(t)
        if self.server is not None:
            self.server.finish()

    def params_sha256(self) -> str:
        from dpcomm.train.setup import params_sha256  # the one hash every replica kind reports

        return params_sha256(self.model)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
