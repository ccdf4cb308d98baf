"""dpcomm in torchtitan: a ``parallelize_fn`` that applies a dpcomm FSDP plan where torchtitan shards each
transformer block (docs/frameworks/torchtitan.md)::

    from dpcomm.integrations.torchtitan import planned
    from torchtitan.models.llama3.parallelize import parallelize_llama

    parallelize_fn = planned(parallelize_llama, "optimal")     # in the model's spec, or called directly

The function returned is ``parallelize_fn`` itself (tensor and context parallelism, activation
checkpointing, compile: torchtitan's own), except for its data-parallel step: where it would call
``apply_fsdp_to_decoder`` (torchtitan 0.3's one FSDP2 step for every decoder model, its name looked up in
``parallelize_fn``'s module when called), :func:`dpcomm.fsdp.shard` runs instead on the same data-parallel
mesh, with torchtitan's ``MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=False)`` and
CPU offload, so the units, prefetch depth and reshard choice are the plan's (FSDP2's root included); then
what torchtitan's step does after its ``fully_shard`` calls: symmetric memory where asked, and FSDP2's
gradient division off (torchtitan's loop scales gradients by the global token count).
torchtitan builds its model on ``meta``: ``shard`` plans it there, its units from a forward and backward
on ``meta`` and their times from FLOPs, and the model is materialised after, as torchtitan does.

The example batch is ``example=``, or tokens of torchtitan's ``training.local_batch_size`` x
``training.seq_len`` on the model's device (ids drawn from no random state). Refused in one line:
pipeline parallelism, expert parallelism, and torchtitan 0.3's default ``spmd_backend="spmd_types"`` and
``"full_dtensor"`` (FSDP2 over the whole SPMD mesh with every parameter a DTensor, ``dp_mesh_dims``):
planned runs set ``parallelism.spmd_backend = "partial_dtensor"``, where the data-parallel mesh is a plain
group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError

__all__ = ["planned"]

FSDP_STEP = "apply_fsdp_to_decoder"
"""The function every torchtitan 0.3 decoder's ``parallelize_fn`` calls for FSDP2."""


def planned(
    parallelize_fn: Callable[..., nn.Module],
    plan: Any = "optimal",
    *,
    example: Any = None,
    **shard_options: Any,
) -> Callable[..., nn.Module]:
    """``parallelize_fn`` with its FSDP2 step run by ``dpcomm.fsdp.shard(model, plan, ...)`` (module
    docstring). ``shard_options``: ``shard``'s keywords (``memory``, ``verify_iters``, ``unit_s``, ...)."""
    names = getattr(parallelize_fn, "__globals__", None)
    if names is None or FSDP_STEP not in names:
        raise UserError(
            f"dpcomm.integrations.torchtitan: {getattr(parallelize_fn, '__name__', parallelize_fn)} does not "
            f"call torchtitan's {FSDP_STEP}; only decoder models' parallelize_fn can be planned"
        )

    @functools.wraps(parallelize_fn)
    def parallelize(model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        training = kwargs.get("training")
        stock = names[FSDP_STEP]

        def fsdp_step(model: nn.Module, dp_mesh: Any, **kw: Any) -> None:
            _check(kw)
            _apply(model, dp_mesh, plan, _example(model, example, training), kw, shard_options)

        names[FSDP_STEP] = fsdp_step
        try:
            return parallelize_fn(model, *args, **kwargs)
        finally:
            names[FSDP_STEP] = stock

    return parallelize


def _check(kw: dict[str, Any]) -> None:
    if kw.get("pp_enabled"):
        raise UserError(
            "dpcomm.integrations.torchtitan plans data parallelism: pipeline parallelism is not planned"
        )
    if kw.get("ep_degree", 1) > 1 or kw.get("edp_mesh") is not None:
        raise UserError("dpcomm.integrations.torchtitan: expert parallelism (ep_degree > 1) is not planned")
    if kw.get("dp_mesh_dims") is not None:
        raise UserError(
            "dpcomm.integrations.torchtitan plans plain data-parallel meshes: set parallelism.spmd_backend = "
            '"partial_dtensor" (its full_dtensor and spmd_types backends shard over the whole SPMD mesh)'
        )


def _apply(model: nn.Module, dp_mesh: Any, plan: Any, batch: Any, kw: dict[str, Any], options: dict) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from dpcomm.fsdp import shard

    fsdp_kw: dict[str, Any] = {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=kw["param_dtype"], reduce_dtype=kw["reduce_dtype"], cast_forward_inputs=False
        )
    }
    if kw.get("cpu_offload"):
        fsdp_kw["offload_policy"] = CPUOffloadPolicy()
    where = {"mesh": dp_mesh} if dp_mesh.ndim == 2 else {"process_group": dp_mesh.get_group()}  # HSDP: 2-D
    shard(model, plan, example=batch, **where, **fsdp_kw, **options)
    from torchtitan.distributed import (
        fsdp as titan,
    )  # what torchtitan's step does after its fully_shard calls

    if kw.get("enable_symm_mem"):
        titan.enable_fsdp_symm_mem(model)
    titan.disable_fsdp_gradient_division(model)  # its loop scales gradients by the global token count


def _example(model: nn.Module, example: Any, training: Any) -> Any:
    """``example``, or token ids as torchtitan's training config shapes a batch, on the model's device."""
    if example is not None:
        return example
    embed = getattr(model, "tok_embeddings", None)
    batch, seq = getattr(training, "local_batch_size", None), getattr(training, "seq_len", None)
    if embed is None or not batch or not seq:
        raise UserError(
            "dpcomm.integrations.torchtitan: pass example= (no token embedding or training shape)"
        )
    device = next(model.parameters()).device  # ids drawn from no random state: the user's stays as it was
    return (torch.arange(batch * seq, device=device) % embed.num_embeddings).view(batch, seq)
