"""The measurements a pull plan is made from, taken on every rank of a parameter-server run (iBatch Sec. 3:
``Ts``, ``Tt_i``, ``C_i``), and the probe that times a plan beside a forward.

:meth:`Prober.measure` returns a :class:`PullMeasurements`: ``Ts`` and the per-byte ``beta`` from timed
rounds of pulling everything in one batch and layer by layer (``T_all = Ts + beta B``, ``T_layer = L Ts +
beta B``; each worker's median round, then the median over the workers), ``Tt_i = beta * bytes_i`` of the
bytes this rank pulls over the network, and ``C_i``, each layer's forward time, timed by every worker at
once as during training (on a shared machine a forward run alone is faster than one beside the other
workers'). :meth:`Prober.overlap` times a given plan's pulls beside a forward that waits for each batch,
for :mod:`dpcomm.ps.planning`'s confirm or slowdown step. Every forward here leaves the model's buffers
and the random-number generator as they were (:func:`buffers_kept`). On a GPU the marks are read once the
device ran the work queued before them (:func:`dpcomm.timing.now`): a forward returns once its kernels
are queued, and ``C_i`` and a round's end are device times.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.models.layers import call_order, called_ancestor, layers_in_call_order, learnable_layers
from dpcomm.ps import tags
from dpcomm.ps.node import Ticket
from dpcomm.timing import now
from dpcomm.trace.profiler import default_loss, layer_medians

if TYPE_CHECKING:
    from dpcomm.ps.rank import PsRank

__all__ = ["Prober", "PullMeasurements", "buffers_kept", "forward_layers", "forward_layout", "unit_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PullMeasurements:
    """What the pull planner needs, measured (seconds; the same on every rank)."""

    Ts_s: float
    """Start-up of one pull message (iBatch ``Ts``)."""
    beta_s_per_byte: float
    """Transfer time per byte."""
    C_s: list[float]
    """Forward time of each layer (``C_i``), the median over the workers."""
    Tt_s: list[float]
    """Transfer time of each layer's parameters to this rank (``Tt_i = beta * bytes_i``)."""
    rounds_s: list[dict[str, list[float]]]
    """Every worker's timed rounds, ``{"all": [...], "layer": [...]}``."""
    timed: bool
    """Whether any rank timed a forward (a worker with a sample): the probe needs one."""

    def meta(self) -> dict[str, Any]:
        """The plan's ``meta`` entries for these inputs."""
        return {"Ts_s": self.Ts_s, "beta_s_per_byte": self.beta_s_per_byte, "C_s": self.C_s,
                "Tt_s": self.Tt_s, "probe_rounds_s": self.rounds_s}  # fmt: skip


@contextlib.contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Forwards run inside leave ``model``'s buffers (batch-norm statistics) and the CPU random-number
    generator (dropout) as they were."""
    saved = [b.clone() for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        for b, v in zip(model.buffers(), saved, strict=True):
            b.copy_(v)


def unit_of(units: list[tuple[int, int]]) -> dict[int, int]:
    """Layer -> index of the unit (a ``(first, last)`` run of layers) holding it."""
    return {l: k for k, (a, b) in enumerate(units) for l in range(a, b + 1)}


def forward_layers(model: nn.Module, sample: torch.Tensor | None, group: Any = None) -> list[nn.Module]:
    """The pulled and pushed layers in forward order (:func:`forward_layout`'s first list)."""
    return forward_layout(model, sample, group)[0]


def forward_layout(
    model: nn.Module, sample: torch.Tensor | None, group: Any = None
) -> tuple[list[nn.Module], list[nn.Module]]:
    """``(layers, wait_at)``: the pulled and pushed layers (:func:`dpcomm.models.learnable_layers`), in the
    order rank 0's forward of ``sample`` first runs them (GoogLeNet runs its aux heads mid-forward but
    registers them last: a pull plan in registration order would stall its forward there), and for each
    the module whose forward pre-hook must wait for its pull batch: the layer itself, or, where its own
    forward never runs, the nearest ancestor that runs and uses its parameters inline
    (``nn.MultiheadAttention`` and its ``out_proj``: a wait on ``out_proj`` would never fire, and the
    attention would compute with last iteration's weights). The same on every rank (rank 0's answer is
    broadcast; a dedicated server has no sample). The ordering forward leaves the batch-norm statistics and
    the random-number generator as they were."""
    names: list[Any] = [None]
    if dist.get_rank(group) == 0:
        with buffers_kept(model):  # one forward orders the layers and says which modules run
            order = call_order(model, sample) if sample is not None else None
        layers = learnable_layers(model) if order is None else layers_in_call_order(model, order)
        by_id = {id(m): n for n, m in model.named_modules()}
        waits = []
        for name, m in layers:
            anc = None if order is None or id(m) in order else called_ancestor(model, by_id[id(m)], order)
            waits.append(name if anc is None else (by_id[id(anc)] or type(model).__name__))
        names = [[[n for n, _ in layers], waits]]
    dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    mods = dict(model.named_modules())
    mods[type(model).__name__] = model  # learnable_layers names the root module by its class
    return [mods[n] for n in names[0][0]], [mods[n] for n in names[0][1]]


class Prober:
    """Times pulls and forwards on this rank of a run (every rank calls the same methods in order)."""

    def __init__(self, ps: PsRank) -> None:
        self.model, self.spec, self.rank, self.group = ps.model, ps.spec, ps.rank, ps.group
        self.layout, self.worker, self.server, self.params = ps.layout, ps.worker, ps.server, ps.params
        self.wait_at = ps.wait_at
        self._request = ps.spec.pulls == "request"
        self.device = ps.device
        """Where the model computes: the marks wait for it (module docstring)."""

    def _pull(self, units: list[tuple[int, int]], tag: int) -> list[Ticket]:
        return (self.worker.request if self._request else self.worker.pull)(units, tag)

    def measure(self, mods: list[nn.Module], sample: torch.Tensor | None) -> PullMeasurements:
        """``Ts``, ``beta``, ``Tt_i`` and ``C_i`` (module docstring); ``sample``: None on a server."""
        L = len(mods)
        Ts, beta, rounds = self.pull_costs(mods, sample)
        remote = [0] * L  # bytes of each layer this rank pulls over the network (not from its own shard)
        layer_of = {i: l for l, ps in enumerate(self.layout.layer_params) for i in ps}
        for k in self.layout.keys:
            if self.layout.server_rank(k.server) != self.rank:
                remote[layer_of[k.tensor]] += k.numel * self.params[k.tensor].element_size()
        mine = self.forward_times(mods, sample)
        every: list[Any] = [None] * self.layout.world
        dist.all_gather_object(every, mine, group=self.group)
        C = layer_medians([c for c in every if c is not None] or [[0.0] * L])
        return PullMeasurements(Ts_s=Ts, beta_s_per_byte=beta, C_s=C, Tt_s=[beta * b for b in remote],
                                rounds_s=rounds, timed=any(c is not None for c in every))  # fmt: skip

    def pull_costs(
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
                t0, end, tickets = self._round(mods, sample if busy else None, units)
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

    def _round(
        self, mods: list[nn.Module], sample: torch.Tensor | None, units: list[tuple[int, int]]
    ) -> tuple[float, float, list[Ticket]]:
        """One timed round on every rank: pulls of ``units`` from a barrier, beside a forward of ``sample``
        that waits for them (none without one); ``(start, end, tickets)``, ``end`` once the forward is done
        and every batch is in (``time.perf_counter()``)."""
        early = self.worker is not None and not self._request  # receives before any send (``iteration``)
        tickets = self._pull(units, tags.PROBE) if early else []
        dist.barrier(group=self.group)
        t0 = now(self.device)
        if self.worker is not None and not early:
            tickets = self._pull(units, tags.PROBE)
        if self.server is not None:
            (self.server.answer if self._request else self.server.send)(units, tags.PROBE)
        with buffers_kept(self.model):
            out = self._forward_pulling(mods, sample, units, tickets) if sample is not None else None
            # the last batch first: a pair's messages arrive in order, so the rest are in by then and this
            # thread blocks once, not once per message (in order, 5 co-located workers on 2 cores timed
            # layer-by-layer rounds 10-15 ms longer than training's own layer-by-layer pulls, docs/ps.md)
            for t in reversed(tickets):
                self.worker.wait(t, into_params=False)
            end = now(self.device)
            if out is not None:  # untimed: a backward after each forward, as in training and _time_forward
                default_loss(out).backward()  # (forwards back to back ran 15-20% slower)
                for p in self.model.parameters():
                    p.grad = None
        if self.server is not None:
            self.server.finish()
        return t0, end, tickets

    def overlap(
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
            t0, end, _tickets = self._round(mods, sample, units)
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
        batch_of = unit_of(units)
        hooks = [
            m.register_forward_pre_hook(
                lambda _m, _a, k=batch_of[l]: self.worker.wait(tickets[k], into_params=False)
            )
            for l, m in enumerate(self.wait_at)
        ]
        try:
            return self.model(sample)  # with autograd's graph, as in training
        finally:
            for h in hooks:
                h.remove()

    def forward_times(
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
            if i not in marks:
                marks[i] = now(self.device)

        hooks = [m.register_forward_pre_hook(lambda _m, _a, i=i: _mark(i)) for i, m in enumerate(mods)]
        L = len(mods)
        try:
            with buffers_kept(self.model):
                for r in range(warmup + rounds):
                    dist.barrier(group=self.group)
                    marks.clear()
                    marks[-1] = now(self.device)
                    out = self.model(sample)
                    marks[L] = now(self.device)
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
