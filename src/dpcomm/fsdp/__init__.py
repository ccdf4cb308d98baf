"""dpcomm's FSDP plans in stock PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

- :func:`shard`: profile on the workers, fit all-gather and reduce-scatter, plan on rank 0
  (:mod:`dpcomm.planner.fsdp`), check the hash, optionally time the plan against ``per-block``, then
  ``fully_shard`` the planned units with their prefetch and reshard choice (:mod:`dpcomm.fsdp.shard`; the
  planning on the workers: :mod:`dpcomm.fsdp.planning`; the peak as FSDP2 runs it: :mod:`dpcomm.fsdp.bound`);
- :func:`shard_groups`: which modules each unit hands to ``fully_shard``; :func:`layer_atoms`: the runs of
  layers one call must take whole, which every planner plans over (:mod:`dpcomm.fsdp.groups`);
- :func:`compile_units`, :func:`shard_compiled`: ``torch.compile`` each unit after sharding, in place, the
  plan priced on the compiled units' times (:mod:`dpcomm.fsdp.compiled`);
- :func:`fsdp_costs`: the two collectives measured and fitted (:mod:`dpcomm.fsdp.costs`);
- FSDP2's own keywords (``mp_policy``, ``offload_policy``, ``ignored_params``) as ``shard`` takes them:
  :mod:`dpcomm.fsdp.keywords`.

``dpcomm train --schedule fsdp:PLANNER`` runs it in the training loop (:mod:`dpcomm.train.fsdp_replica`).
"""

from __future__ import annotations

from dpcomm.fsdp.compiled import compile_units, shard_compiled
from dpcomm.fsdp.costs import fsdp_costs, measure_fsdp_collectives
from dpcomm.fsdp.groups import ShardGroups, layer_atoms, merge_units, shard_groups
from dpcomm.fsdp.shard import Sharded, apply_plan, plan_on_workers, shard

__all__ = [
    "ShardGroups",
    "Sharded",
    "apply_plan",
    "compile_units",
    "fsdp_costs",
    "layer_atoms",
    "measure_fsdp_collectives",
    "merge_units",
    "plan_on_workers",
    "shard",
    "shard_compiled",
    "shard_groups",
]
