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

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.sim.network.algorithms import ELEM, parse_algorithm, simulate_allreduce
from dpcomm.sim.network.engine import FlowModel
from dpcomm.sim.network.fabric import Fabric

__all__ = ["FlowCost", "flow_cost_factory", "flow_algorithm"]


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
        """The planners' vectorised cost: :meth:`line` (see the module docstring)."""
        a, b = self.line()
        return np.where(nbytes >= ELEM, a + b * nbytes, 0.0) if self.ranks > 1 else np.zeros_like(nbytes)


def flow_cost_factory(fabric: Fabric, algo: str, alpha_s: float) -> Callable[[int], CommCost]:
    """``nodes -> FlowCost`` for :func:`dpcomm.sim.sweep` (rank ``i`` on server ``i``)."""
    name = flow_algorithm(algo)
    model = FlowModel(fabric, alpha_s=alpha_s)
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
