"""dpcomm in PyTorch Lightning (docs/frameworks/lightning.md). DDP::

    from dpcomm.integrations.lightning import DDPStrategy

    trainer = pl.Trainer(strategy=DDPStrategy(plan="optimal"), ...)

FSDP2, with Lightning's ``ModelParallelStrategy``, in the module's ``configure_model``::

    def configure_model(self):
        dpcomm.integrations.lightning.shard(self, plan="optimal")   # shards self.model, its one child

``DDPStrategy`` is Lightning's, its DDP built by :func:`dpcomm.ddp.wrap` (the strategy's DDP keywords;
``bucket_cap_mb`` is refused, the plan sets the buckets). ``shard`` runs :func:`dpcomm.fsdp.shard` on the
submodule ``training_step`` calls over the strategy's data-parallel mesh. Both plan on the first batch of
the module's own training data (``train_dataloader()`` of the module or its datamodule, read with every
random state put back) unless ``example=`` is given. ``DDPStrategy`` runs the module as Lightning's DDP
does: its ``training_step(batch, 0)`` as the forward, its loss as the loss (``self.log`` says nothing while
the plan is made); ``shard`` the submodule on the batch (a dict as keywords), its output's ``loss``. Manual
optimisation is refused in one line (its step calls the optimizers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy as _DDPStrategy
from torch import nn

from dpcomm.errors import UserError
from dpcomm.integrations._common import first_batch, kept_random, step_loss, to_device
from dpcomm.utils.user_run import Inputs

__all__ = ["DDPStrategy", "shard"]


class DDPStrategy(_DDPStrategy):
    """Lightning's ``DDPStrategy`` with DDP built by ``dpcomm.ddp.wrap(module, plan, ...)`` (module
    docstring). ``plan``: a planner name or a :class:`~dpcomm.plan.Plan`; ``example``: one batch as
    ``training_step`` takes it; ``wrap_options``: ``wrap``'s own keywords. Other arguments are Lightning's
    (its DDP keywords among them)."""

    def __init__(
        self,
        *args: Any,
        plan: Any = "optimal",
        example: Any = None,
        wrap_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.dpcomm_plan = plan
        self.dpcomm_example = example
        self.dpcomm_options = dict(wrap_options or {})

    def _setup_model(self, model: nn.Module) -> nn.Module:
        from dpcomm.ddp import wrap

        device_ids = self.determine_ddp_device_ids()
        example = _example(model, self.dpcomm_example)
        ctx = torch.cuda.stream(torch.cuda.Stream()) if device_ids is not None else contextlib.nullcontext()
        with ctx, _training_step_as_forward(model):
            return wrap(
                model, self.dpcomm_plan, example=example, loss_fn=step_loss, device_ids=device_ids,
                **self.dpcomm_options, **self._ddp_kwargs,
            )  # fmt: skip


def shard(
    module: pl.LightningModule,
    plan: Any = "optimal",
    *,
    model: nn.Module | None = None,
    example: Any = None,
    **shard_options: Any,
) -> nn.Module:
    """In ``configure_model``: ``dpcomm.fsdp.shard`` on ``model``, the submodule ``training_step`` calls
    (default: the module's one child holding every trainable parameter, as ``self.model``), over the
    strategy's data-parallel mesh (``ModelParallelStrategy``'s ``device_mesh["data_parallel"]``), planned on
    ``example`` (default: the first training batch, a dict as keywords). Lightning calls
    ``training_step`` itself, not the module's forward, so FSDP2's root must be a module whose forward runs:
    the submodule is the root. Returns it, sharded (the same object)."""
    from dpcomm.fsdp import shard as fsdp_shard

    target = _trained_child(module) if model is None else model
    mesh = getattr(module, "_device_mesh", None)
    if mesh is not None and "process_group" not in shard_options and "mesh" not in shard_options:
        dims = mesh.mesh_dim_names or ()
        if "tensor_parallel" in dims and mesh["tensor_parallel"].size() > 1:
            raise UserError(
                "dpcomm.integrations.lightning.shard plans data parallelism: tensor_parallel_size 1"
            )
        dp = mesh["data_parallel"] if "data_parallel" in dims else mesh
        shard_options["process_group"] = dp.get_group()
    batch = _example(module, example, wrapped=False)
    return fsdp_shard(target, plan, example=batch, loss_fn=step_loss, **shard_options)


def _trained_child(module: nn.Module) -> nn.Module:
    """The one direct child of ``module`` holding all its trainable parameters, or a one-line error."""
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    for child in module.children():
        if trainable and trainable <= {id(p) for p in child.parameters()}:
            return child
    raise UserError(
        "dpcomm.integrations.lightning.shard: pass model=, the submodule training_step calls (no one "
        "child of "
        "the LightningModule holds every trainable parameter)"
    )


def _example(module: nn.Module, example: Any, wrapped: bool = True) -> Any:
    """The batch to plan on: ``example``, else the first batch of the module's training data; as
    ``training_step(batch, 0)`` takes it when ``wrapped``."""
    if example is None:
        example = _first_training_batch(module)
    example = to_device(example, module)
    return Inputs(args=(example, 0)) if wrapped and not isinstance(example, Inputs) else example


def _first_training_batch(module: nn.Module) -> Any:
    trainer = getattr(module, "_trainer", None)
    if trainer is None:
        raise UserError("dpcomm.integrations.lightning: no Trainer is attached to the module; pass example=")
    if not getattr(module, "automatic_optimization", True):
        raise UserError(
            "dpcomm.integrations.lightning: manual optimisation steps the optimizers inside training_step, "
            "which cannot be timed alone; use automatic optimisation or dpcomm.ddp.wrap in your own loop"
        )
    with kept_random():
        loaders = trainer.fit_loop._data_source.dataloader()  # the module's or datamodule's hook
    loader = _first_loader(loaders)
    if loader is None:
        raise UserError(
            "dpcomm.integrations.lightning: the module has no training data loader; pass example="
        )
    return first_batch(loader)


def _first_loader(loaders: Any) -> Any:
    from torch.utils.data import DataLoader

    if isinstance(loaders, DataLoader):
        return loaders
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, list | tuple):
        return next((x for x in map(_first_loader, loaders) if x is not None), None)
    flat = getattr(loaders, "flattened", None)  # Lightning's CombinedLoader
    return _first_loader(list(flat)) if flat is not None else None


@contextlib.contextmanager
def _training_step_as_forward(module: nn.Module) -> Iterator[None]:
    """While open, ``module(batch, i)`` runs ``module.training_step(batch, i)`` (as Lightning's forward
    redirection does inside DDP) and ``self.log`` says nothing (no loop collects it yet)."""
    if not isinstance(module, pl.LightningModule):
        yield
        return
    quiet = lambda *args, **kwargs: None  # noqa: E731
    module.forward = module.training_step  # instance attributes, over the class's methods
    module.log, module.log_dict = quiet, quiet
    try:
        yield
    finally:
        for name in ("forward", "log", "log_dict"):
            module.__dict__.pop(name, None)
