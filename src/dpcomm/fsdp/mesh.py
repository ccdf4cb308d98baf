"""HSDP in :func:`dpcomm.fsdp.shard`: its ``mesh=`` argument as device meshes, one per shard-group size the
planner may choose, and each mesh's collectives measured and fitted (:mod:`dpcomm.fsdp.costs`).

``mesh=`` is one of:

- ``None``: FSDP over ``process_group`` (default: every rank), a 1-D mesh;
- a ``DeviceMesh`` over every rank: 1-D is FSDP on it; 2-D is HSDP as FSDP2 reads it (torch 2.13
  ``fully_shard``: dim 0 replicates, dim 1 shards), ``G = mesh.size(1)``;
- an int ``G``: HSDP with shard groups of ``G`` ranks, ``P / G`` replicas
  (``init_device_mesh(kind, (P // G, G), mesh_dim_names=("replicate", "shard"))``; ``G = P`` is FSDP);
- ``"auto"``: every ``G`` dividing ``P``, each mesh's collectives measured, and the planner chooses
  (:func:`dpcomm.planner.hsdp.plan_hsdp`: the least modelled time within the budget).

A mesh's costs, functions of a unit's full bytes ``B`` (:mod:`dpcomm.planner.fsdp_model`): all-gather and
reduce-scatter within the shard group, and the all-reduce of the group's ``B/G`` bytes across the replicas
(``None`` where there is one replica).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch.distributed as dist
from torch import nn

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.fsdp.costs import fsdp_costs, measure_replica_all_reduce
from dpcomm.fsdp.planning import target_device
from dpcomm.planner.autoplan import fit_linear
from dpcomm.planner.fsdp_model import FsdpPlan

__all__ = ["MESH_DIMS", "given_on", "mesh_costs", "meshes", "shard_size"]

MESH_DIMS = ("replicate", "shard")
"""The dims of the 2-D meshes built here, in FSDP2's order."""

Costs = tuple[CommCost, CommCost, CommCost | None]


def shard_size(mesh: Any) -> int:
    """Ranks per shard group: the mesh's last dim."""
    return int(mesh.size(mesh.ndim - 1))


def meshes(model: nn.Module, mesh: Any, group: Any) -> dict[int, Any]:
    """``{G: DeviceMesh}`` for ``mesh=`` (module docstring), one entry unless ``"auto"``; bad input is one
    line."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    kind = target_device(model).type
    if mesh is None:
        one = init_device_mesh(kind, (dist.get_world_size(),)) if group is None else DeviceMesh.from_group(
            group, kind)  # fmt: skip
        return {int(one.size()): one}
    if group is not None:
        raise UserError("dpcomm.fsdp.shard: pass mesh= or process_group=, not both")
    P = dist.get_world_size()
    if isinstance(mesh, DeviceMesh):
        if mesh.ndim not in (1, 2) or mesh.size() != P:
            raise UserError(f"dpcomm.fsdp.shard: mesh must be 1-D or 2-D (replicate, shard) over all {P} "
                            f"ranks, got shape {tuple(mesh.shape)}")  # fmt: skip
        return {shard_size(mesh): mesh}
    if isinstance(mesh, str) and mesh.strip().lower() == "auto":
        sizes = [g for g in range(1, P + 1) if P % g == 0]
    elif isinstance(mesh, int) and not isinstance(mesh, bool) and mesh >= 1 and P % mesh == 0:
        sizes = [mesh]
    else:
        raise UserError(f"dpcomm.fsdp.shard: mesh={mesh!r} is not a shard group size dividing the {P} ranks "
                        f"(one of {', '.join(str(g) for g in range(1, P + 1) if P % g == 0)}), 'auto' or a "
                        "DeviceMesh")  # fmt: skip
    return {g: init_device_mesh(kind, (P,)) if g == P else init_device_mesh(kind, (P // g, g),
            mesh_dim_names=MESH_DIMS) for g in sizes}  # fmt: skip


def mesh_costs(total_bytes: int, mesh: Any) -> Costs:
    """``(T_ag, T_rs, T_ar)`` measured on ``mesh`` (every rank calls it alike)."""
    if mesh.ndim == 1:
        ag, rs, _, _ = fsdp_costs(total_bytes, mesh.get_group())
        return ag, rs, None
    ag, rs, _, _ = fsdp_costs(total_bytes, mesh.get_group(1))
    if mesh.size(0) == 1:
        return ag, rs, None
    return ag, rs, fit_linear(measure_replica_all_reduce(total_bytes, shard_size(mesh), mesh.get_group(0)))


def given_on(plan: FsdpPlan, candidates: dict[int, Any], P: int) -> FsdpPlan:
    """A given plan on the ``mesh=`` asked for (``P`` ranks): its ``shard_group`` must be the mesh's, or
    chooses it among ``"auto"``'s."""
    want = plan.shard_group or P
    if len(candidates) == 1 and want != next(iter(candidates)):
        raise UserError(f"dpcomm.fsdp.shard: the plan shards over groups of {want} ranks, the mesh over "
                        f"{next(iter(candidates))}")  # fmt: skip
    if want not in candidates:
        raise UserError(f"dpcomm.fsdp.shard: the plan's shard group of {want} ranks does not divide {P} "
                        "ranks")  # fmt: skip
    return replace(plan, shard_group=None if want == P else want)
