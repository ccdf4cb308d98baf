"""dpcomm in Hugging Face Accelerate: one call in place of ``accelerator.prepare``
(docs/frameworks/accelerate.md)::

    from dpcomm.integrations import accelerate as dpa

    model, optimizer, loader = dpa.prepare(accelerator, model, optimizer, loader, plan="optimal")

The model becomes one DDP built by :func:`dpcomm.ddp.wrap` (the plan's buckets, the agreed analysis, the
timed trial, every DDP keyword Accelerate passes from its ``DistributedDataParallelKwargs``); everything
else is Accelerate's own ``prepare``: device placement, the mixed-precision forward (``mixed_precision=``
wraps the model's forward before DDP is built, so the trial times it as it will run), the handler's comm
hook, ``torch.compile``, the optimizer, data loaders and schedulers. The example batch is ``example=``, or
else the first batch of the first data loader among the objects (read without changing what it yields
after: :func:`dpcomm.integrations._common.first_batch`).

Handing ``accelerator.prepare`` a model already wrapped by ``dpcomm.ddp.wrap`` stops in one line (a second
DDP would all-reduce every gradient again: :data:`dpcomm.ddp.build.DOUBLE_WRAPPED`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from dpcomm.ddp import wrap
from dpcomm.errors import UserError
from dpcomm.integrations._common import first_batch, planned_ddp, step_loss, to_device

__all__ = ["planning", "prepare"]


def prepare(
    accelerator: Any,
    *objects: Any,
    plan: Any = "optimal",
    example: Any = None,
    loss_fn: Any = None,
    **wrap_options: Any,
) -> Any:
    """``accelerator.prepare(*objects)`` with the model's DDP built by ``dpcomm.ddp.wrap(model, plan, ...)``
    (module docstring); returns what ``prepare`` returns, in the same order. ``wrap_options``: ``wrap``'s
    own keywords (``verify_iters``, ``network``, ``collective``, ...); DDP's keywords come from the
    accelerator's ``DistributedDataParallelKwargs`` as Accelerate passes them."""
    loader = next((o for o in objects if _is_loader(o)), None)
    with planning(accelerator, plan, example=example, loader=loader, loss_fn=loss_fn, **wrap_options):
        return accelerator.prepare(*objects)


@contextlib.contextmanager
def planning(
    accelerator: Any,
    plan: Any = "optimal",
    *,
    example: Any = None,
    loader: Any = None,
    example_of: Callable[[], Any] | None = None,
    loss_fn: Any = None,
    **wrap_options: Any,
) -> Iterator[None]:
    """While open, every model ``accelerator`` prepares as DDP is built by ``dpcomm.ddp.wrap`` with ``plan``.
    The example: ``example``, else ``example_of()``, else ``loader``'s first batch; taken only when a DDP
    is built, moved to the model's device."""
    _check_kind(accelerator)
    stock = accelerator.prepare_model

    def build(module: nn.Module, *args: Any, **ddp_kwargs: Any) -> nn.Module:
        batch = example
        if batch is None and example_of is not None:
            batch = example_of()
        if batch is None and loader is not None:
            batch = first_batch(loader)
        if args:  # DDP's positional device_ids, output_device (Accelerate passes them by name)
            ddp_kwargs |= dict(zip(("device_ids", "output_device"), args, strict=False))
        if batch is None and isinstance(plan, str) and plan in ("optimal", "mgwfbp"):
            raise UserError(
                f"dpcomm: plan '{plan}' needs an example batch: pass example= or a data loader to prepare"
            )
        return wrap(
            module, plan, example=None if batch is None else to_device(batch, module),
            loss_fn=loss_fn or step_loss, **wrap_options, **ddp_kwargs,
        )  # fmt: skip

    def prepare_model(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with planned_ddp(build):
            return stock(model, *args, **kwargs)

    accelerator.prepare_model = prepare_model  # the instance's: Accelerator.prepare calls self.prepare_model
    try:
        yield
    finally:
        del accelerator.prepare_model


def _check_kind(accelerator: Any) -> None:
    """Refuse, in one line, what the DDP route cannot plan: Accelerate's FSDP and DeepSpeed."""
    kind = str(getattr(accelerator, "distributed_type", "")).rsplit(".", 1)[-1].upper()
    if kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        raise UserError(
            f"dpcomm.integrations.accelerate plans DDP's buckets; this Accelerator runs {kind}: for FSDP2 "
            "shard "
            "the model with dpcomm.fsdp.shard first, for DeepSpeed use `dpcomm plan --export deepspeed` "
            "(docs/frameworks/)"
        )


def _is_loader(obj: Any) -> bool:
    from torch.utils.data import DataLoader

    return isinstance(obj, DataLoader) or hasattr(obj, "base_dataloader")
