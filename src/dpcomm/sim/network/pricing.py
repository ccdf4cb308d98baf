"""The flow model behind the cost interface planners and the iteration simulator already use.

:class:`dpcomm.costmodel.base.CommCost` is ``nbytes -> seconds``; the closed form (``LinearCost``, MG-WFBP
Eq. 9) is one implementation, :class:`FlowCost` the other: each call prices one allreduce of that many bytes
by its schedule of flows on the named topology (cached per size), so ``dpcomm simulate --topology`` times
every message of a plan on the links it really crosses. Planners only need a cost they can call many
times: :meth:`FlowCost.many` evaluates the flow model at two sizes and uses the straight line through them,
which is exact for every schedule whose messages all grow in proportion to ``S`` (ring, be, mst, ps, bml,
once the sizes are multiples of the chunk count) and LP's large-message asymptote otherwise; the
simulation itself always prices each message exactly.

Messages of one plan are all-reduced one after the other (MG-WFBP's communication queue,
:mod:`dpcomm.sim.simulator`), so two of them never share a link in time; what they share with the
topology (an oversubscribed core, a relay NIC, an incast port) is in each one's price.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpcomm.costmodel.base import CommCost, MeasuredCost
from dpcomm.errors import UserError
from dpcomm.sim.network.algorithms import ELEM, parse_algorithm, simulate_allreduce
from dpcomm.sim.network.engine import FlowModel
from dpcomm.sim.network.fabric import Fabric
from dpcomm.sim.network.nccl import NAMES as NCCL_NAMES
from dpcomm.topology import MultiGPU

__all__ = ["TCP_ALPHA_S", "FlowCost", "default_model", "flow_algorithm", "flow_cost_factory", "startup_text"]

TCP_ALPHA_S = 45.26e-6
"""The start-up of a message over TCP: the ``10gbe`` preset's, MG-WFBP's measured ring start-ups
(:data:`dpcomm.costmodel.PRESETS`); the default on star, fat-tree, BCube and leaf-spine fabrics."""


def flow_algorithm(algo: str) -> str:
    """``algo`` checked to have a flow schedule (a name or alias of :mod:`dpcomm.registry`: ``native`` is
    scheduled as ring, ``bcube``/``bml`` is BML); a one-line :class:`UserError` otherwise."""
    parse_algorithm(algo)
    return algo


@dataclass(slots=True, kw_only=True)
class FlowCost:
    """``T_ar(nbytes)`` of ``algo`` on ``ranks`` servers of ``model``'s fabric, by the flow model."""

    model: FlowModel
    algo: str
    ranks: int
    _cache: dict[int, float] = field(default_factory=dict, repr=False)
    _line: tuple[float, float] | None = field(default=None, repr=False)
    _grid: MeasuredCost | None = field(default=None, repr=False)

    def __call__(self, nbytes: float) -> float:
        m = int(nbytes)
        if m < ELEM or self.ranks < 2:
            return 0.0
        got = self._cache.get(m)
        if got is None:
            got = simulate_allreduce(self.model, self.algo, m, ranks=self.ranks)[0].time_s
            self._cache[m] = got
        return got

    def line(self) -> tuple[float, float]:
        """``(a, b)`` of the straight line through the flow model's prices of 64 MiB and 128 MiB."""
        if self._line is None:
            lo, hi = 64 << 20, 128 << 20
            t_lo, t_hi = self(lo), self(hi)
            b = (t_hi - t_lo) / (hi - lo)
            self._line = (max(t_lo - b * lo, 0.0), b)
        return self._line

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        """The planners' vectorised cost: :meth:`line` (see the module docstring); for ``nccl*``, whose
        price changes form where NCCL changes algorithm or protocol, the exact prices at four sizes per
        octave from 4 KiB to 16 GiB, interpolated (:class:`~dpcomm.costmodel.base.MeasuredCost`)."""
        if self.ranks < 2:
            return np.zeros_like(nbytes, dtype=float)
        if parse_algorithm(self.algo)[0] in NCCL_NAMES:
            if self._grid is None:
                sizes = sorted({int(2 ** (k / 4)) // ELEM * ELEM for k in range(48, 137)})  # 4 per octave
                self._grid = MeasuredCost(tuple((float(m), self(m)) for m in sizes))
            return np.where(nbytes >= ELEM, self._grid.many(np.asarray(nbytes, dtype=float)), 0.0)
        a, b = self.line()
        return np.where(nbytes >= ELEM, a + b * nbytes, 0.0)


def default_model(fabric: Fabric, alpha_s: float | None = None) -> FlowModel:
    """The flow model of ``fabric`` with a start-up: ``alpha_s`` per message where given (the user's
    ``--alpha-us`` or network); else the fabric's own. A multi-GPU fabric's own is NCCL's: the ``nccl*``
    schedules take NCCL's latency for what they run, the others NCCL's per-hop latency for each message,
    inside a server or between servers (:func:`.nccl_tuning.hop_latency_us`, with the transport's); any
    other fabric's is TCP's, :data:`TCP_ALPHA_S`."""
    from dpcomm.sim.network.nccl_tuning import hop_latency_us

    if alpha_s is not None:
        return FlowModel(fabric, alpha_s=alpha_s)
    if isinstance(fabric.topology, MultiGPU):
        intra, inter = hop_latency_us(fabric.topology)
        return FlowModel(fabric, alpha_s=intra * 1e-6, alpha_inter_s=inter * 1e-6, nccl=True)
    return FlowModel(fabric, alpha_s=TCP_ALPHA_S)


def startup_text(model: FlowModel) -> str:
    """How ``model`` prices start-ups, for a header: ``alpha 45.26 us`` or ``start-up NCCL's (...)``."""
    if not model.nccl:
        return f"alpha {model.alpha_s * 1e6:g} us"
    t = model.fabric.topology
    inter = f", {model.alpha_inter_s * 1e6:g} us between servers" if t.hosts > 1 else ""
    return (
        f"start-up NCCL's latency model ({t.link.name}); other schedules {model.alpha_s * 1e6:g} us per "
        f"message inside a server{inter}"
    )


def flow_cost_factory(
    fabric: Fabric, algo: str, alpha_s: float | None = None, model: FlowModel | None = None
) -> Callable[[int], CommCost]:
    """``nodes -> FlowCost`` for :func:`dpcomm.sim.sweep` (rank ``i`` on server ``i``); ``model`` (else one
    with :func:`default_model`'s start-up for ``alpha_s``)."""
    name = flow_algorithm(algo)
    model = model if model is not None else default_model(fabric, alpha_s)
    made: dict[int, FlowCost] = {}

    def cost(nodes: int) -> CommCost:
        if nodes > fabric.servers:
            raise UserError(
                f"{nodes} nodes do not fit on the {fabric.servers} servers of {fabric.topology.spec}"
            )
        if nodes not in made:
            made[nodes] = FlowCost(model=model, algo=name, ranks=nodes)
        return made[nodes]

    return cost
