"""A dpcomm plan in each framework's own configuration form: ``dpcomm plan ... --export FRAMEWORK``, or
:func:`export_ddp` / :func:`export_fsdp` (docs/frameworks/export.md).

Most frameworks take one bucket size, so a DDP plan is exported from ``bucket:auto``
(:mod:`dpcomm.planner.bucket_auto`: the best single size, exact over the sizes that give distinct layouts):

- ``trainer``: ``TrainingArguments(ddp_bucket_cap_mb=...)``; ``accelerate``:
  ``DistributedDataParallelKwargs(bucket_cap_mb=...)``; ``lightning``: ``DDPStrategy(bucket_cap_mb=...)``.
  All three hand the number to DDP, which closes a bucket at the first parameter that brings it to the cap:
  the layout priced. (Their per-bucket plans run through :mod:`dpcomm.integrations` instead.)
- ``megatron``: ``DistributedDataParallelConfig(bucket_size=..., overlap_grad_reduce=True)``, in parameters
  (elements), not bytes; Megatron-Core closes its buckets at the same point (``param_and_grad_buffer``), but
  pads them, which the model does not price.
- ``deepspeed``: ZeRO stage 1 or 2 (``--zero-stage``, default 2), ``reduce_bucket_size`` and
  ``allgather_bucket_size`` in elements, ``overlap_comm``. DeepSpeed fills a bucket up to the size and
  never past it, where DDP closes one at the parameter that reaches it: it runs a layout near the priced
  one, not always it (said with the fragment). Stage 0 is refused: its all-reduce bucket is fixed in the
  engine (``allreduce_gradients(bucket_size=MEMORY_OPT_ALLREDUCE_SIZE)``), no config key sets it.

An FSDP plan (``--fsdp METHOD``) is exported as:

- ``deepspeed``: ZeRO stage 3: ``stage3_prefetch_bucket_size`` the most elements the plan's prefetch
  depth holds ahead, ``stage3_max_live_parameters`` its peak of unsharded elements,
  ``stage3_max_reuse_distance`` 0 when units reshard after forward (else all the elements, so nothing is
  released between forward and backward), ``stage3_param_persistence_threshold`` 0 (FSDP2 shards every
  parameter), ``reduce_bucket_size`` the largest unit. ZeRO-3 fetches by module with no key grouping
  modules: the plan's units themselves cannot be expressed (said with the fragment).
- ``torchtitan``: ``[parallelism]`` shard and replicate degrees (HSDP's group) and
  ``fsdp_reshard_after_forward``; torchtitan shards each transformer block, so the units and prefetch
  depth cannot be expressed (said).

What no framework's form can take is refused in one line: a ZeRO stage with a DDP plan, ZeRO stage 0,
an FSDP plan for the DDP-only forms, a DDP plan for torchtitan, ``--zero-stage`` for another framework.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.trace.format import Trace

__all__ = ["FRAMEWORKS", "Export", "check_export", "export_ddp", "export_fsdp"]

FRAMEWORKS = ("deepspeed", "megatron", "trainer", "accelerate", "lightning", "torchtitan")
DDP_FORMS = ("deepspeed", "megatron", "trainer", "accelerate", "lightning")
FSDP_FORMS = ("deepspeed", "torchtitan")


@dataclass(frozen=True, slots=True)
class Export:
    """A configuration fragment in ``framework``'s form, and what the form cannot say about the plan."""

    framework: str
    fragment: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The fragment as the framework reads it: TOML for torchtitan, JSON for the others."""
        if self.framework != "torchtitan":
            return json.dumps(self.fragment, indent=2)
        lines = []
        for table, values in self.fragment.items():
            lines.append(f"[{table}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        return "\n".join(lines)


def check_export(framework: str, *, fsdp: bool, zero_stage: int | None) -> None:
    """One line for what ``framework``'s form cannot take (module docstring)."""
    if framework not in FRAMEWORKS:
        raise UserError(f"unknown --export {framework!r}: use one of {', '.join(FRAMEWORKS)}")
    if zero_stage is not None and framework != "deepspeed":
        raise UserError("--zero-stage is DeepSpeed's: give it with --export deepspeed")
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise UserError(f"--zero-stage takes 0, 1, 2 or 3, got {zero_stage}")
    if fsdp and framework not in FSDP_FORMS:
        raise UserError(
            f"--export {framework} takes a DDP plan (one bucket size); an FSDP plan exports to "
            f"{' or '.join(FSDP_FORMS)} (for Lightning's FSDP2: dpcomm.integrations.lightning.shard)"
        )
    if not fsdp and framework == "torchtitan":
        raise UserError("--export torchtitan takes an FSDP plan: give --fsdp METHOD (torchtitan runs FSDP2)")
    if framework == "deepspeed" and zero_stage is not None:
        if fsdp and zero_stage != 3:
            raise UserError(f"an FSDP plan shards parameters, which is ZeRO stage 3, not {zero_stage}")
        if not fsdp and zero_stage == 3:
            raise UserError("ZeRO stage 3 shards parameters: plan it with --fsdp METHOD, not a DDP plan")
        if zero_stage == 0:
            raise UserError(
                "DeepSpeed's ZeRO stage 0 all-reduces in a bucket fixed in its engine (no config key sets "
                "it): export for --zero-stage 1 or 2"
            )


def export_ddp(framework: str, plan: Plan, trace: Trace, *, zero_stage: int | None = None) -> Export:
    """``plan`` (``bucket:auto``'s, whose ``meta`` holds its one size) in ``framework``'s form."""
    check_export(framework, fsdp=False, zero_stage=zero_stage)
    if "bucket_bytes" not in plan.meta:
        raise UserError(f"--export {framework} takes one bucket size: plan it with --schedule bucket:auto")
    size = int(plan.meta["bucket_bytes"])
    mb = plan.meta["bucket_cap_mb"]
    elements = max(1, size // trace.dtype_bytes)
    groups = f"{len(plan.groups)} buckets"
    if framework == "trainer":
        return Export(framework, {"ddp_bucket_cap_mb": mb}, [
            f"TrainingArguments(ddp_bucket_cap_mb={mb:.9g}): {groups} (the command-line flag takes whole "
            f"MiB; pass the number in Python to keep the layout)"
        ])  # fmt: skip
    if framework in ("accelerate", "lightning"):
        where = "DistributedDataParallelKwargs" if framework == "accelerate" else "DDPStrategy"
        return Export(
            framework, {where: {"bucket_cap_mb": mb}}, [f"{where}(bucket_cap_mb={mb:.9g}): {groups}"]
        )
    if framework == "megatron":
        return Export(framework, {"bucket_size": elements, "overlap_grad_reduce": True}, [
            f"DistributedDataParallelConfig: {groups} of {trace.dtype_bytes}-byte gradients; Megatron-Core "
            "pads its buckets, which the model does not price"
        ])  # fmt: skip
    stage = 2 if zero_stage is None else zero_stage
    zero = {"stage": stage, "reduce_bucket_size": elements, "allgather_bucket_size": elements,
            "overlap_comm": True, "contiguous_gradients": True}  # fmt: skip
    return Export(framework, {"zero_optimization": zero}, [
        f"ZeRO stage {stage}: {groups} as DDP would cut them; DeepSpeed fills a bucket up to the size and "
        "never past it, so the layout it runs may differ from the one priced"
    ])  # fmt: skip


def export_fsdp(
    framework: str, plan: FsdpPlan, trace: Trace, world: int, *, zero_stage: int | None = None
) -> Export:
    """The FSDP ``plan`` over ``trace``'s layers in ``framework``'s form (DeepSpeed ZeRO-3, torchtitan)."""
    check_export(framework, fsdp=True, zero_stage=zero_stage)
    units = [sum(trace.layers[i].params for i in range(a, b + 1)) for a, b in plan.units]
    total = sum(units)
    lost = (
        f"the plan's {len(units)} units (modules {', '.join(f'{a}-{b}' for a, b in plan.units)}) and "
        "prefetch "
        f"depth {plan.depth}"
    )
    if framework == "torchtitan":
        G = plan.shard_group if plan.shard_group is not None else world
        par = {
            "data_parallel_shard_degree": G,
            "data_parallel_replicate_degree": world // G,
            "fsdp_reshard_after_forward": "always" if plan.reshard_after_forward else "never",
        }
        return Export(framework, {"parallelism": par}, [
            f"torchtitan shards each transformer block and prefetches one ahead: {lost} cannot be "
            "expressed in its config"
        ])  # fmt: skip
    ahead = max((sum(units[k + 1 : k + 1 + plan.depth]) for k in range(len(units))), default=0)
    live = plan.peak_bytes // trace.dtype_bytes if plan.peak_bytes >= 0 else total
    zero = {
        "stage": 3,
        "stage3_prefetch_bucket_size": ahead,
        "stage3_max_live_parameters": live,
        "stage3_max_reuse_distance": 0 if plan.reshard_after_forward else total,
        "stage3_param_persistence_threshold": 0,
        "reduce_bucket_size": max(units, default=1),
        "overlap_comm": True,
        "contiguous_gradients": True,
    }
    notes = [f"ZeRO-3 gathers by module, with no key to group modules: {lost} cannot be expressed"]
    if plan.shard_group is not None and plan.shard_group < world:
        notes.append(
            f"HSDP's shard group of {plan.shard_group} is ZeRO++'s zero_hpz_partition_size, not set here"
        )
    return Export(framework, {"zero_optimization": zero}, notes)
