"""FSDP's and HSDP's collectives priced for a cluster: ``G -> (T_ag, T_rs, T_ar)`` per shard group size.

One signature for every source, :data:`dpcomm.planner.hsdp.MeshCosts`: all-gather and reduce-scatter of a
unit's full bytes ``B`` within a group of ``G`` ranks, and the all-reduce of the group's shard, ``B/G``
bytes, across the ``N = P/G`` groups (FSDP: ``G = P``, no all-reduce). Two sources, as DDP's all-reduce is
priced (:func:`dpcomm.sim.sweep.cost_factory`, :mod:`dpcomm.sim.network.pricing`):

* a flat network (:func:`network_mesh_costs`: a preset or a network file): ring all-gather and
  reduce-scatter (:func:`dpcomm.planner.hsdp.mesh_costs`); the all-reduce is DDP's
  (:func:`dpcomm.costmodel.allreduce_cost` of ``--algo``). A file's measured all-reduce table for ``G``
  ranks replaces the ring (each of the two takes half of it), for ``N`` ranks the all-reduce's formula;
* a cluster's flow model (:func:`flow_mesh_costs`: ``--topology``, a calibration file's fitted fabric):
  all-gather and reduce-scatter each half of the flow model's ring all-reduce on the group (``nccl-ring``,
  NCCL picking the protocol, on servers of several GPUs; ``ring`` elsewhere), the all-reduce ``--algo``'s
  (default ``nccl``: NCCL's choice). On servers of ``g`` GPUs every group runs at once: a group of
  ``G <= g`` ranks lies in one server (NVLink links are the GPUs' own; a PCIe bus is shared by the
  ``g/G`` groups of a server), one of ``G = k g`` ranks on ``k`` whole servers; a replica group has
  ``max(1, g/G)`` GPUs on each of its servers, and the ``G`` replica groups share each server's NICs, so
  each prices on a cluster of its own whose NICs carry one GPU's share (``nics x rate / g``). A group
  that straddles servers (``G`` neither divides ``g`` nor is a multiple of it) is refused.

Why half: NCCL's ring all-reduce is a ring reduce-scatter then a ring all-gather of the same chunks,
``P-1`` steps each (nccl-tests ``doc/PERFORMANCE.md``: bus bandwidth is algbw x ``2(n-1)/n`` for
all-reduce and x ``(n-1)/n`` for all-gather and reduce-scatter, the same hardware limit), so each takes
half of its time on the same ranks, start-ups included. NCCL's NVLS and PAT all-gathers are not priced.

The planner's search bounds what is left of a plan by the byte rate of a :class:`LinearCost` (0 for any
other cost), so on a flow model's prices (NCCL's protocols make them bend) the exact search ran past
200 s on TinyLlama at 16 ranks; :func:`linear_costs` gives it the least-squares line (relative weights,
:func:`dpcomm.costmodel.fit.fit_line`) through :data:`FIT_POINTS` prices from the smallest module to the
whole model, as :class:`dpcomm.sim.network.pricing.FlowCost` gives DDP's planners a line for non-NCCL
schedules; the plan is then timed with the prices themselves, and the line's worst error is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dpcomm.costmodel import Network, allreduce_cost
from dpcomm.costmodel.base import CommCost, LinearCost, MeasuredCost
from dpcomm.errors import UserError
from dpcomm.planner.hsdp import MeshCosts, mesh_costs, shard_sizes
from dpcomm.topology import MultiGPU

__all__ = ["FIT_POINTS", "Scaled", "flow_mesh_costs", "linear_costs", "network_mesh_costs", "shard_choices"]

FIT_POINTS = 40
"""Sizes, log-spaced over a model's unit sizes, a cost is priced at to fit the planner's line."""


@dataclass(frozen=True, slots=True)
class Scaled:
    """``T(B) = time x cost(size x B)``: half of an all-reduce (``time=0.5``), or the all-reduce of a
    ``G``-th of a unit's bytes (``size=1/G``)."""

    cost: CommCost
    time: float = 1.0
    size: float = 1.0

    def __call__(self, nbytes: float) -> float:
        return self.time * float(self.cost(self.size * nbytes)) if nbytes > 0 else 0.0

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`__call__` on every element (the planners' vectorised path)."""
        x = np.asarray(nbytes, dtype=float)
        many = getattr(self.cost, "many", None)
        if callable(many):
            got = np.asarray(many(self.size * x), dtype=float)
        else:
            got = np.array([float(self.cost(self.size * v)) for v in x.ravel()]).reshape(x.shape)
        return np.where(x > 0, self.time * got, 0.0)


def _scaled(cost: CommCost, time: float = 1.0, size: float = 1.0) -> CommCost:
    """A :class:`LinearCost` stays one (the planners' bounds use its slope); anything else is wrapped."""
    if isinstance(cost, LinearCost):
        return LinearCost(time * cost.a, time * cost.b * size)
    return Scaled(cost, time, size)


def linear_costs(costs: MeshCosts, lo: float, hi: float) -> tuple[MeshCosts, dict[int, float]]:
    """``(G -> lines, {G: worst relative error})``: each cost of ``costs(G)`` that is not a
    :class:`LinearCost` replaced by its least-squares line over ``lo..hi`` bytes (module docstring); a
    line's error is ``max |line / price - 1|`` over the points (0 where every cost was a line)."""
    from dpcomm.costmodel.fit import fit_line

    xs = np.geomspace(max(lo, 1.0), max(hi, lo * 2, 2.0), FIT_POINTS)
    made: dict[int, tuple[CommCost, CommCost, CommCost | None]] = {}
    errors: dict[int, float] = {}

    def line(cost: CommCost | None, G: int) -> CommCost | None:
        if cost is None or isinstance(cost, LinearCost):
            return cost
        ys = Scaled(cost).many(xs)
        coef = fit_line(list(zip(xs, ys, strict=True)), nonneg=True).coef
        fit = LinearCost(*(max(0.0, float(c)) for c in coef))
        ok = ys > 0
        errors[G] = max(errors.get(G, 0.0), float(np.max(np.abs(fit.many(xs[ok]) / ys[ok] - 1), initial=0.0)))
        return fit

    def lines(G: int) -> tuple[CommCost, CommCost, CommCost | None]:
        if G not in made:
            errors.setdefault(G, 0.0)
            made[G] = tuple(line(c, G) for c in costs(G))  # type: ignore[assignment]
        return made[G]

    return lines, errors


def network_mesh_costs(net: Network, world: int, algo: str = "ring") -> MeshCosts:
    """``G -> (T_ag, T_rs, T_ar)`` on one flat network (module docstring); ``T_ar`` is ``None`` for one
    group (FSDP)."""

    def costs(G: int) -> tuple[CommCost, CommCost, CommCost | None]:
        ag, rs, _ = mesh_costs(net, world, G)  # checks that G divides the world
        N = world // G
        if G > 1 and G in net.allreduce_tables:  # measured: half of the cluster's own all-reduce
            ag = rs = Scaled(MeasuredCost(net.allreduce_tables[G]), 0.5)
        ar = _scaled(allreduce_cost(net, N, algo), 1.0, 1 / G) if N > 1 else None
        return ag, rs, ar

    return costs


def shard_choices(model: Any | None, world: int) -> list[int]:
    """The shard group sizes ``--hsdp auto`` chooses among: every divisor of ``world`` (a flow model on
    servers of several GPUs: those that do not straddle servers)."""
    sizes = shard_sizes(world)
    topo = None if model is None else model.fabric.topology
    if not isinstance(topo, MultiGPU):
        return sizes
    g = min(topo.gpus, world)
    return [G for G in sizes if g % G == 0 or G % g == 0]


def flow_mesh_costs(model: Any, world: int, algo: str = "nccl") -> MeshCosts:
    """``G -> (T_ag, T_rs, T_ar)`` by the flow model ``model`` (a :class:`~dpcomm.sim.network.engine.
    FlowModel`) on ``world`` ranks of its fabric (module docstring); ``algo`` prices the all-reduce."""
    from dpcomm.sim.network.pricing import FlowCost

    fabric = model.fabric
    topo = fabric.topology
    multi = isinstance(topo, MultiGPU)
    if world > fabric.servers:
        raise UserError(f"{world} ranks do not fit on the {fabric.servers} ranks of {topo.spec}")
    if multi and world > topo.gpus and world % topo.gpus:
        raise UserError(f"{world} ranks do not fill whole servers of {topo.gpus} GPUs ({topo.spec})")
    ring = "nccl-ring" if multi else "ring"
    made: dict[int, tuple[CommCost, CommCost, CommCost | None]] = {}

    def costs(G: int) -> tuple[CommCost, CommCost, CommCost | None]:
        if G not in shard_sizes(world):
            raise UserError(f"HSDP shard group of {G!r} ranks does not divide {world} ranks")
        if G not in made:
            inner, outer = (_group_model(model, world, G), _replica_model(model, world, G)) if multi else (
                model, model)  # fmt: skip
            N = world // G
            half = Scaled(FlowCost(model=inner, algo=ring, ranks=G), 0.5)
            ar = Scaled(FlowCost(model=outer, algo=algo, ranks=N), 1.0, 1 / G) if N > 1 else None
            made[G] = (half, half, ar)
        return made[G]

    return costs


def _per_gpu_nic_bps(model: Any) -> float:
    """One GPU's share of its server's NICs, bits/s each way (line rate; the fabric applies ``nic_eff``)."""
    t = model.fabric.topology
    rate = t.nic_bps if t.nic_bps is not None else model.fabric.rate_bps
    return rate * t.nic_count / t.gpus


def _sub_model(model: Any, topo: MultiGPU) -> Any:
    """A flow model of ``topo`` with ``model``'s start-ups (its own or NCCL's, as the user's cluster)."""
    from dpcomm.sim.network import make_fabric
    from dpcomm.sim.network.engine import FlowModel

    fabric = make_fabric(topo, model.fabric.rate_bps)
    return FlowModel(fabric, model.alpha_s, alpha_inter_s=model.alpha_inter_s, nccl=model.nccl)


def _aligned(topo: MultiGPU, world: int, G: int) -> int:
    """GPUs per server the ranks use, after checking that a group of ``G`` does not straddle servers."""
    g = min(topo.gpus, world)
    if g % G and G % g:
        raise UserError(
            f"HSDP shard group of {G} ranks straddles servers of {g} GPUs: "
            f"give a divisor or a multiple of {g}"
        )
    return g


def _group_model(model: Any, world: int, G: int) -> Any:
    """The cluster one shard group of ``G`` ranks runs its all-gathers and reduce-scatters on."""
    t = model.fabric.topology
    g = _aligned(t, world, G)
    if G >= g:  # k = G / g whole servers; the other groups are on other servers
        return _sub_model(model, replace(t, hosts=max(1, G // t.gpus)))
    share = t.intra_bps * G / g if t.intra == "pcie" else t.intra_bps  # a bus shared by the g/G groups
    return _sub_model(
        model, replace(t, hosts=1, gpus=G, intra_bps=share, nics=G, nic_bps=_per_gpu_nic_bps(model))
    )


def _replica_model(model: Any, world: int, G: int) -> Any:
    """The cluster one replica group (one rank of each shard group) runs its all-reduce on: ``max(1, g/G)``
    GPUs on each server it spans, each with one GPU's share of the NICs (the ``G`` replica groups of a
    server run at once)."""
    t = model.fabric.topology
    g = _aligned(t, world, G)
    N = world // G
    j = max(1, g // G)  # this group's GPUs per server
    share = t.intra_bps / G if t.intra == "pcie" and G < g else t.intra_bps
    hosts = max(1, math.ceil(N / j))
    return _sub_model(
        model, replace(t, hosts=hosts, gpus=j, intra_bps=share, nics=j, nic_bps=_per_gpu_nic_bps(model))
    )
