"""The flow model that prices one message size on a topology with a calibration's size ranges
(:mod:`dpcomm.topology.size_ranges`): the range's topology, on the model's own fabric where the range keeps
its achievable fractions, else on a fabric of the range's fractions (made once per model and range)."""

from __future__ import annotations

import weakref

from dpcomm.sim.network.engine import FlowModel
from dpcomm.sim.network.fabric import make_fabric
from dpcomm.topology.multigpu import MultiGPU
from dpcomm.topology.size_ranges import topology_at

__all__ = ["at_size"]

_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {range topology: its model}


def at_size(model: FlowModel, nbytes: int) -> tuple[FlowModel, MultiGPU]:
    """``(model, topology)`` that price an all-reduce of ``nbytes`` on ``model``'s multi-GPU fabric."""
    base: MultiGPU = model.fabric.topology
    t = topology_at(base, nbytes)
    if (t.nic_fraction, t.intra_eff) == (base.nic_fraction, base.intra_eff):
        return model, t  # the same links: only what NCCL runs differs
    made = _MADE.setdefault(model, {})
    if t not in made:
        fabric = make_fabric(t, model.fabric.rate_bps)
        made[t] = FlowModel(fabric, model.alpha_s, alpha_inter_s=model.alpha_inter_s, nccl=model.nccl)
    return made[t], t
