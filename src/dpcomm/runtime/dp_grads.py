"""What a user calls on a :class:`~dpcomm.runtime.data_parallel.DataParallel` between backward and the next
forward besides ``step``: clip, unscale, flush, consolidate -- the same call for every plan, all-reduce or
``dear`` (:mod:`dpcomm.runtime.dear`, whose gradients are averaged only on this rank's shard and whose
parameters arrive during the next forward).

A mixin of DataParallel: it reads ``module``, ``_sync_grads``, ``_gather_due`` and ``_it`` and calls
``synchronize``, which ``DataParallel`` sets and defines.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GradientMethods"]


class GradientMethods:
    """DataParallel's clip, unscale, flush and optimizer consolidation (module docstring)."""

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` on the averaged gradients (synchronizes first); under ``dear``
        the global norm is taken from every rank's shard. Returns the total norm."""
        self.synchronize()
        shards = self._sync_grads.shards
        if shards is None:
            params = [p for p in self.module.parameters() if p.grad is not None]
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        return shards.clip_grad_norm_(max_norm, norm_type)

    def unscale_(self, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        """``scaler.unscale_(optimizer)`` on the averaged gradients (e.g. before :meth:`clip_grad_norm_`)."""
        self.synchronize()
        shards = self._sync_grads.shards
        scaler.unscale_(optimizer) if shards is None else shards.unscale_(optimizer, scaler)

    def flush(self) -> None:
        """Wait for communication still in flight after a step (``dear``: the parameters' all-gathers), so
        the module's parameters are current; :meth:`state_dict`, ``train()``/``eval()`` and a plan change call
        it. Every rank runs the same gathers, so calling it on some ranks only is safe."""
        if self._gather_due:
            self._gather_due = False
            gathers = self._sync_grads.start_gathers()
            gathers.finish(self._sync_grads.wait)
            self._it.exposed_s += gathers.waited_s

    def consolidate_optimizer(self) -> None:
        """``dear``: write the sharded optimizer state into the optimizer given to :meth:`step`, in full
        shape, so its ``state_dict()`` is what an all-reduce plan's would be (every rank must call it)."""
        shards = self._sync_grads.shards
        if shards is not None:
            self.flush()
            shards.consolidate()
