"""Everything dpcomm does differently across the torch versions it supports, in one place.

dpcomm supports torch :data:`MIN_TORCH` (2.11, the oldest version CI tests, ``make test-compat``;
pyproject's ``torch>=`` says the same) through the newest release. Code elsewhere calls these functions
instead of asking torch what it has; each one says which versions differ and how:

- :func:`launch_config`: ``LaunchConfig(shutdown_timeout=)`` (the agent's SIGTERM-to-SIGKILL wait) is newer
  than torch 2.11 (whose ``LaunchConfig`` refuses the keyword: every launch failed on it); where it is
  missing the keyword is dropped and ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is not read either, so the agent
  keeps its 30 s (:func:`dpcomm.lifecycle.prompt_shutdown` still bounds a failed run's workers).
- :func:`all_gather_single`, :func:`reduce_scatter_single`: the flat-buffer collectives FSDP2 runs are
  ``all_gather_single``/``reduce_scatter_single`` in newer torch (which deprecates
  ``all_gather_into_tensor``/``reduce_scatter_tensor``, the only names torch 2.11 and older have).
- :func:`fsdp_reduces_unused`: FSDP2's ``set_reduce_scatter_unused_params`` (zeros reduce-scattered for
  parameters a rank's data left without a gradient) is newer than torch 2.11; without it
  :func:`dpcomm.fsdp.shard` refuses such a model in one line rather than let the ranks' collectives differ.
- :func:`process_group_kwargs`: ``init_process_group(device_id=)`` binds the group to one GPU (NCCL's
  communicators are made eagerly, and barriers know their device); a torch without the keyword gets none.

Each difference is found by feature (the name or the keyword is there or not), not by version number: a
nightly or a backport has a feature or not whatever its number says. ``tests/test_compat.py`` checks both
branches of each (with stand-ins for the missing one), and ``make test-compat`` runs the suite on 2.11.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "MIN_TORCH",
    "all_gather_single",
    "fsdp_reduces_unused",
    "launch_config",
    "process_group_kwargs",
    "reduce_scatter_single",
    "torch_version",
]

MIN_TORCH = (2, 11)
"""The oldest torch dpcomm supports and CI tests. 2.11 is the first with DDP's ``bucket_cap_mb_list`` (one
cap per bucket: how :func:`dpcomm.ddp.wrap` makes DDP form a plan's buckets; 2.9.1 and 2.10.0 lack it),
and what the stock GPU images ship; torch 2.6 (FSDP2's ``fully_shard`` public) also lacks FSDP2 on the CPU
(its CPU streams have no ``record_event``) and inductor's ``bucket_all_reduces_fx``."""


def torch_version(text: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``text`` (default: the running torch): ``"2.11.0+cu130"`` -> ``(2, 11)``."""
    parts = (text or torch.__version__).split("+")[0].split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def _params(fn: Any) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return frozenset()


def launch_config(**kwargs: Any) -> Any:
    """``torch.distributed.launcher.api.LaunchConfig(**kwargs)``, less the keywords this torch's
    ``LaunchConfig`` does not take and dpcomm can do without (``shutdown_timeout``)."""
    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" not in _params(LaunchConfig):
        kwargs.pop("shutdown_timeout", None)
    return LaunchConfig(**kwargs)


_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_single(output: torch.Tensor, input: torch.Tensor, group: Any = None, async_op=False) -> Any:
    """Every rank's ``input`` into one flat ``output`` (``P`` times its size), in rank order."""
    return _ALL_GATHER(output, input, group=group, async_op=async_op)


def reduce_scatter_single(
    output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None, async_op=False
) -> Any:
    """``input`` reduced over the ranks (``op``, default SUM), this rank's ``1/P`` slice into ``output``."""
    return _REDUCE_SCATTER(output, input, op=dist.ReduceOp.SUM if op is None else op, group=group,
                           async_op=async_op)  # fmt: skip


def fsdp_reduces_unused() -> bool:
    """Whether this torch's FSDP2 can reduce-scatter zeros for parameters without a gradient on a rank
    (``FSDPModule.set_reduce_scatter_unused_params``)."""
    from torch.distributed.fsdp import FSDPModule

    return callable(getattr(FSDPModule, "set_reduce_scatter_unused_params", None))


def process_group_kwargs(device: torch.device | None) -> dict[str, Any]:
    """Keywords for ``init_process_group`` that bind the group to ``device`` (a CUDA device; None or the
    CPU: none), where this torch takes ``device_id``."""
    if device is None or device.type != "cuda" or "device_id" not in _params(dist.init_process_group):
        return {}
    return {"device_id": device}
