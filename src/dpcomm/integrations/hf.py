"""dpcomm in the Hugging Face Trainer: a ``Trainer`` whose DDP runs a dpcomm plan
(docs/frameworks/trainer.md)::

    from dpcomm.integrations.hf import Trainer

    trainer = Trainer(model=model, args=args, train_dataset=data, dpcomm_plan="optimal")
    trainer.train()

It is ``transformers.Trainer`` with one change: when the Trainer prepares the model for DDP (Accelerate's
``prepare``, inside ``train()``), DDP is built by :func:`dpcomm.ddp.wrap` with ``dpcomm_plan``
(:func:`dpcomm.integrations.accelerate.planning`), on the first batch of the Trainer's own training data
loader unless ``dpcomm_example`` is given (read without changing the batches it then yields). The DDP
keywords are the Trainer's (``ddp_find_unused_parameters``, ``ddp_broadcast_buffers``;
``ddp_bucket_cap_mb`` is refused: the plan sets the buckets). ``trainer.model_wrapped.dpcomm`` says what
was decided. Mixed precision, gradient accumulation, checkpoints and evaluation are the Trainer's.

Handing the plain Trainer a model already wrapped by ``dpcomm.ddp.wrap`` stops in one line, before the
first step (a second DDP would all-reduce every gradient again: :data:`dpcomm.ddp.build.DOUBLE_WRAPPED`).
The Trainer's FSDP and DeepSpeed modes are refused here in one line: for them, ``dpcomm plan --fsdp ...
--export trainer|deepspeed`` gives their settings.
"""

from __future__ import annotations

from typing import Any

import transformers

from dpcomm.errors import UserError
from dpcomm.integrations._common import first_batch
from dpcomm.integrations.accelerate import planning

__all__ = ["Trainer"]


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` with DDP built by ``dpcomm.ddp.wrap`` (module docstring). ``dpcomm_plan``: a
    planner name or a :class:`~dpcomm.plan.Plan`; ``dpcomm_example``: one batch as the model takes it
    (default: the training data loader's first); ``dpcomm_options``: ``wrap``'s own keywords
    (``verify_iters``, ``network``, ``collective``, ...)."""

    def __init__(
        self,
        *args: Any,
        dpcomm_plan: Any = "optimal",
        dpcomm_example: Any = None,
        dpcomm_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            mode = "FSDP" if self.is_fsdp_enabled else "DeepSpeed"
            raise UserError(
                f"dpcomm.integrations.hf.Trainer plans DDP's buckets; this Trainer runs {mode}: use "
                f"`dpcomm plan ... --export {'trainer' if self.is_fsdp_enabled else 'deepspeed'}` for its "
                "settings (docs/frameworks/trainer.md)"
            )
        self.dpcomm_plan = dpcomm_plan
        self.dpcomm_example = dpcomm_example
        self.dpcomm_options = dict(dpcomm_options or {})
        self._dpcomm_loader: Any = None

    def get_train_dataloader(self) -> Any:
        self._dpcomm_loader = super().get_train_dataloader()  # the one train() runs: its batches to plan on
        return self._dpcomm_loader

    def _inner_training_loop(self, *args: Any, **kwargs: Any) -> Any:
        with planning(
            self.accelerator, self.dpcomm_plan, example=self.dpcomm_example,
            example_of=self._first_batch, **self.dpcomm_options,
        ):  # fmt: skip
            return super()._inner_training_loop(*args, **kwargs)

    def _first_batch(self) -> Any:
        if self._dpcomm_loader is None:
            return None
        return first_batch(self._dpcomm_loader)
