"""What a :class:`~dpcomm.runtime.data_parallel.DataParallel` does inside an iteration, unseen by its user.

:class:`DataParallelHooks` is DataParallel's base class: the autograd and layer hooks (MG-WFBP Algorithm 2:
each final gradient is handed to its plan group, whose complete groups go to the queue, line 21), taking
up a plan (the given one after the first forward, or a :class:`~dpcomm.runtime.driver.PlanDriver`'s,
:mod:`dpcomm.runtime.driver`), and folding a backward and a whole iteration into the timeline and the
records (:mod:`dpcomm.runtime.spans`). It owns no state: ``DataParallel.__init__`` sets every attribute
these methods read (listed on the class), and the public methods (``forward``, ``step``, ...) call them;
the two halves are one ``nn.Module`` and share the state of the iteration in progress.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.runtime.broadcast import check_same_plan, groups_text
from dpcomm.runtime.records import Phase
from dpcomm.runtime.spans import IterTimes, layer_times

__all__ = ["DataParallelHooks", "output_tensors"]


def output_tensors(out: Any) -> Iterator[torch.Tensor]:
    """The tensors in a forward's output (nested lists, tuples and dicts)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, list | tuple):
        for o in out:
            yield from output_tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from output_tensors(o)


class DataParallelHooks(nn.Module):
    """DataParallel's hooks and per-iteration bookkeeping (module docstring).

    Reads and updates what ``DataParallel.__init__`` sets: ``plan``, ``phase``, ``records``, ``mode``,
    ``reduce_dtype``, ``process_group``, ``_driver``, ``_running``, ``_sync_grads``
    (:class:`~dpcomm.runtime.grad_sync.GradSync`), ``_timeline`` (:class:`~dpcomm.runtime.spans.Timeline`),
    ``_layers`` (:class:`~dpcomm.runtime.layer_order.LayerOrder`), ``_names``, ``_it``, ``_prefetch``,
    ``_sync``, ``_pending``, ``_synced``, ``_steps``; and calls ``emit``.
    """

    # ----------------------------------------------------------------- hooks

    @property
    def _profiling(self) -> bool:
        """Layer times are being measured: marks wait for the device (:mod:`dpcomm.runtime.spans`)."""
        return self.phase is Phase.PROFILE

    def _on_layer_call(self, owner: int) -> None:
        if owner not in self._it.pre:
            self._it.pre[owner] = self._timeline.now(sync=self._profiling)
        if self._prefetch is not None:
            self._prefetch.before_layer(self._layers.layer_of_owner[owner], self._sync_grads.wait)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        if self._it.bwd_start is None:
            self._it.bwd_start = self._timeline.now(sync=self._profiling)

    def _on_grad(self, p: nn.Parameter) -> None:
        now = self._timeline.now(sync=self._profiling)
        it = self._it
        it.bwd_last = now
        if it.bwd_start is None:
            it.bwd_start = it.fwd_end
        if not self._sync or self._sync_grads.buckets is None:
            return
        it.ready[self._sync_grads.ready(p)] = now
        self._pending = True

    # ----------------------------------------------------------------- internals

    def _adopt_layer_order(self) -> None:
        """After the first forward: learnable layers in call order, their parameters, the first plan."""
        self._layers.adopt(self._it.pre)
        L = len(self._layers.layers)
        if self._driver is not None:  # e.g. one all-reduce after backward while profiling (MG-WFBP Alg. 1)
            self._use(*self._driver.begin(self))
            return
        if self.plan.num_layers != L:
            raise UserError(
                f"plan '{self.plan.schedule}' has {self.plan.num_layers} layers but the module has {L} "
                "learnable layers"
            )
        check_same_plan(self.plan, self.process_group)
        self.emit(f"plan {self.plan.schedule}: {len(self.plan.groups)} group(s) {groups_text(self.plan)}")
        self._use(self.plan, Phase.STEADY)

    def _use(self, plan: Plan, phase: Phase) -> None:
        """Run ``plan`` from the next iteration on (new buckets only where its groups differ). Leaving a
        ``dear`` plan's shards: their gathers land and their optimizer state goes back to the user's."""
        old = self._sync_grads.shards
        if old is not None and (not plan.sharded or plan.groups != old.b.plan.groups):
            self.flush()
            old.consolidate()
        self.phase, self._running = phase, plan
        if phase is Phase.STEADY:  # while a driver re-plans, the plan kept last stays the one to save
            self.plan = plan
        if phase is Phase.PROFILE and self._layers.known:  # profiling again (re-planning): time each layer
            self._layers.add_hooks()
        self._sync_grads.use(plan, self._layers.params_per_layer, self._names, self.reduce_dtype)
        if plan.sharded and self._layers.known:  # each layer's forward waits for its gather
            self._layers.add_hooks()

    def _drop_pre_hooks_if_unused(self) -> None:
        """Pre-hooks serve layer ordering, profiling and lp-alg1; once done, modules run hook-free."""
        sharded = self._running is not None and self._running.sharded
        if self.phase is Phase.STEADY and self._layers.known and self.mode != "lp-alg1" and not sharded:
            self._layers.drop_hooks()

    def _close_backward(self) -> None:
        """Fold the last backward's span into the iteration (called at the next forward or at step)."""
        it = self._it
        closed = self._timeline.close_backward(it)
        if closed and self.phase is Phase.PROFILE and it.ready and self._layers.known:
            pre = self._layers.by_layer(it.pre)
            ready = [it.ready.get(layer) for layer in range(len(pre))]
            self._driver.layer_times(*layer_times(pre, it.fwd_end, ready, it.bwd_start))
        it.bwd_start = it.bwd_last = None
        it.ready = {}

    def _finish_iteration(self, t_step: float) -> None:
        self._synced = False
        jobs = self._sync_grads.comm.take_finished()
        self.records.append(
            self._timeline.finish(self._it, self._steps, t_step, jobs, self.phase, self._running.schedule)
        )
        self._steps += 1
        self._it = IterTimes()
