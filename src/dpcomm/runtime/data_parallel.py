"""``dpcomm.DataParallel``: run a communication plan on real workers, overlapped with backward.

MG-WFBP Algorithm 2 (S-SGD with merged-gradient layers and a communication queue) in the shape of PyTorch's
DistributedDataParallel::

    dp = dpcomm.DataParallel(model, plan="mgwfbp", collective="ring")
    loss_fn(dp(x), y).backward()
    dp.step(optimizer)          # wait for communication, averaged grads in .grad, optimizer.step()

1. At start, the root's parameters and buffers are broadcast (Alg. 2 line 5, "initialize W in all workers").
2. Every trainable parameter has a post-accumulate-grad hook; when its gradient is final for this backward it
   counts towards its plan group (:mod:`dpcomm.runtime.buckets`); a complete group is pushed to the
   communication thread's queue (line 21 ``Q.push``), strictly in plan order, and there packed into the
   group's flat buffer, all-reduced and unpacked while backward computes the earlier layers (lines 22-30,
   :mod:`dpcomm.runtime.comm_thread`).
3. ``step()`` waits for the last group (line 12), the averaged gradients are already back in ``.grad``,
   and the optimizer steps (line 13). The LP paper's BSP modes are in :mod:`dpcomm.runtime.bsp`.

This class runs a :class:`~dpcomm.plan.Plan` it is given, or the plans a *driver* hands it while it trains
(:mod:`dpcomm.runtime.driver`): ``dpcomm.DataParallel(model, plan="mgwfbp")`` is
:class:`dpcomm.train.online.DataParallel`, which plans a planner name on the workers themselves (profile,
trace, plan on the root, timed trial). Timing spans are :mod:`dpcomm.runtime.spans`, the state broadcast
and the plan check :mod:`dpcomm.runtime.broadcast`, the buckets, communication thread and mode jobs
:mod:`dpcomm.runtime.grad_sync`, the layer order :mod:`dpcomm.runtime.layer_order`, and the hooks and the
per-iteration bookkeeping (taking up a plan, closing an iteration into its record) the base class,
:mod:`dpcomm.runtime.dp_hooks`; this module is the public surface (the user's and a driver's).

Edge cases: a parameter without a gradient in an iteration is an error naming it (``allow_unused=True``:
a zero gradient); a shared (tied) parameter is one slot, in the first layer that uses it; ``no_sync()``
accumulates locally; float16/bfloat16 gradients travel in their own dtype (one buffer per dtype and group),
or in ``reduce_dtype`` (e.g. float32: upcast buffers, twice the bytes). The flat buffers are the only extra
copy of the gradients and are reused every iteration. In ``lp-alg1`` non-root replicas get the root's
update during the next forward; :meth:`DataParallel.sync_params` makes them current (e.g. before saving).

Layers are the papers' learnable layers (:func:`dpcomm.models.learnable_layers`) in the order the first
forward calls them, the same order a profiled trace uses, so plan layer ``l`` is trace layer ``l``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.runtime import bsp
from dpcomm.runtime.broadcast import StateBroadcast
from dpcomm.runtime.dear import Gathers
from dpcomm.runtime.dp_grads import GradientMethods
from dpcomm.runtime.dp_hooks import DataParallelHooks, output_tensors
from dpcomm.runtime.driver import PlanDriver
from dpcomm.runtime.grad_sync import GradSync
from dpcomm.runtime.layer_order import LayerOrder
from dpcomm.runtime.records import IterRecord, Phase, Span
from dpcomm.runtime.spans import IterTimes, Timeline

__all__ = ["DataParallel"]

_log = logging.getLogger("dpcomm.runtime")
_KEEP_RECORDS = 10_000
"""Iteration records kept by a wrapper (about 200 bytes each)."""
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[DataParallel]] = weakref.WeakKeyDictionary()
"""Module -> the open wrapper whose hooks are on it (two open wrappers would both communicate)."""


class DataParallel(DataParallelHooks, GradientMethods):
    """Data-parallel wrapper running a :class:`Plan` (or a driver's plans) with a registered collective.

    Args:
        module: the model replica on this rank.
        plan: a :class:`Plan` whose layers are ``module``'s learnable layers, or a
            :class:`~dpcomm.runtime.driver.PlanDriver` that decides the plans while training.
        collective: a name from :func:`dpcomm.collectives.names` or an object with the collective signature.
        process_group: torch.distributed group of the replicas (None: the default group).
        mode: ``overlap`` (MG-WFBP Alg. 2) or the LP paper's ``lp-alg1``, ``lp-alg2``, ``lp-alg3``.
        broadcast_every: ``lp-alg3`` re-broadcasts the root's parameters every this many steps.
        allow_unused: treat parameters that got no gradient as zero gradients instead of raising.
        log: called with each one-line message (plan, measurements); also logged to ``dpcomm.runtime``.
        root: group rank that owns the authoritative parameters (initial broadcast, LP modes).
        reduce_dtype: communicate gradients in this dtype (e.g. ``torch.float32`` for bfloat16 models);
            None keeps each gradient's own dtype.
        broadcast_buffers: broadcast the root's buffers (e.g. BatchNorm statistics) at every training forward.
        keep_spans: iterations whose timeline is kept for :meth:`write_chrome_trace`.
        timeout_s: give up waiting for one communication job after this long (None: rely on the group's
            own timeout, which :func:`dpcomm.launch.init_worker` sets).
    """

    def __init__(
        self,
        module: nn.Module,
        plan: Plan | PlanDriver,
        collective: str | Any = "native",
        process_group: Any = None,
        *,
        mode: str = "overlap",
        broadcast_every: int = 5,
        allow_unused: bool = False,
        log: Callable[[str], None] | None = None,
        root: int = 0,
        reduce_dtype: torch.dtype | None = None,
        broadcast_buffers: bool = True,
        keep_spans: int = 50,
        timeout_s: float | None = None,
    ):
        super().__init__()
        if mode not in bsp.MODES:
            raise UserError(f"unknown DataParallel mode '{mode}' (choose from {', '.join(bsp.MODES)})")
        if not isinstance(plan, Plan | PlanDriver):
            raise UserError(f"plan must be a Plan or a planner name, got {plan!r}")
        if broadcast_every < 1:
            raise UserError("broadcast_every and profile_iters must be >= 1")
        if not dist.is_available() or not dist.is_initialized():
            raise UserError("DataParallel needs torch.distributed initialised (dpcomm.launch.init_worker())")
        old = _ACTIVE.get(module)
        if old is not None and old() is not None:
            raise UserError(
                "this module is already wrapped by an open DataParallel (its hooks would communicate too): "
                "call .close() on the old wrapper first"
            )
        self.module = module
        self.mode = mode
        self.broadcast_every = broadcast_every
        self.allow_unused = allow_unused
        self.reduce_dtype = reduce_dtype
        self.broadcast_buffers = broadcast_buffers
        self.timeout_s = timeout_s
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        if self.rank < 0:
            raise UserError(f"rank {dist.get_rank()} is not a member of the process group it was given")
        self.world_size = dist.get_world_size(process_group)
        if not 0 <= root < self.world_size:
            raise UserError(f"root must be a rank of the group (0..{self.world_size - 1}), got {root}")
        self.root = root
        if isinstance(collective, str):
            from dpcomm.collectives import get

            self.collective_name, self._coll = collective, get(collective)
        else:
            self.collective_name, self._coll = (
                getattr(collective, "name", type(collective).__name__),
                collective,
            )
        self._user_log = log

        self._driver = plan if isinstance(plan, PlanDriver) else None
        self.plan: Plan | None = plan if isinstance(plan, Plan) else None
        """The plan kept; None until a driver's first plan is kept (while it re-plans: the last one kept)."""
        self.phase = Phase.STEADY if self._driver is None else Phase.PROFILE
        """What the iterations are for now (:class:`Phase`)."""
        self._running: Plan | None = self.plan
        """The plan the buckets run (in every phase)."""
        self.records: deque[IterRecord] = deque(maxlen=_KEEP_RECORDS)
        """One :class:`IterRecord` per ``step()``: the last ``_KEEP_RECORDS`` (a long run stays small)."""

        device = next((p.device for p in module.parameters()), None)  # timing waits for it (spans.py)
        self._sync_grads = GradSync(
            self._coll, process_group, self.rank, self.world_size, root, mode, timeout_s, device
        )
        self._timeline = Timeline(keep_spans, device)
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._batch = 0
        self._sync = True
        self._pending = False  # a synchronous backward happened and step() has not consumed it
        self._synced = False  # synchronize() ran for this iteration, step() has not yet
        self._stale = False  # lp-alg1: non-root parameters lag the root's until the next forward
        self._prefetch: bsp.LayerwiseBroadcast | Gathers | None = None
        self._gather_due = False  # dear: the last step's parameters are to be all-gathered (next forward)
        self._steps = 0
        self._it = IterTimes()
        self._broadcast = StateBroadcast(module, self._coll, process_group, self.rank, self.world_size, root)

        self._it.exposed_s += self._broadcast(params=True)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad)
            for p in dict.fromkeys(p for p in module.parameters() if p.requires_grad)
        ]
        self._layers = LayerOrder(module, self._on_layer_call)  # forward order found on the first call
        _ACTIVE[module] = weakref.ref(self)

    # ----------------------------------------------------------------- public API

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._pending and torch.is_grad_enabled():
            raise UserError(
                "DataParallel: backward ran but step()/synchronize() was not called before forward"
            )
        it = self._it
        now = self._timeline.now(sync=it.t0 is None or self._profiling)  # the iteration's start: device time
        self._synced = False  # a synchronize() not followed by step() is dropped (e.g. a skipped step)
        if it.t0 is None:
            it.t0 = now
        self._close_backward()
        it.fwd_start, it.pre = now, {}
        first = not self._layers.known
        if first and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            self._batch = int(args[0].shape[0])
        if not first and self.world_size > 1:
            if self.broadcast_buffers and torch.is_grad_enabled() and self._sync:
                it.exposed_s += self._broadcast(params=False)
            if self._stale:  # lp-alg1: fetch the root's new parameters layer by layer during this forward
                self._prefetch = self._sync_grads.prefetch()
        if self._gather_due:  # dear: the gathers start now, each layer waits for its group's
            self._prefetch, self._gather_due = self._sync_grads.start_gathers(), False
        try:
            out = self.module(*args, **kwargs)
        finally:
            if self._prefetch is not None:
                self._prefetch.finish(self._sync_grads.wait)
                it.exposed_s += self._prefetch.waited_s
                self._prefetch, self._stale = None, False
        if first:
            self._adopt_layer_order()
            self._drop_pre_hooks_if_unused()
        if torch.is_grad_enabled():
            for t in output_tensors(out):
                if t.requires_grad:
                    t.register_hook(self._on_backward_start)
        it.fwd_end = self._timeline.now(sync=self._profiling)
        it.forward_s += it.fwd_end - now
        self._timeline.span(it, "forward", "compute", now, it.fwd_end)
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) for the backward passes inside the block."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def synchronize(self) -> None:
        """Wait for this iteration's communication; afterwards ``.grad`` holds the averaged gradients
        (on the root only in ``lp-alg1``/``lp-alg2``). Call it before :meth:`step` to inspect or clip
        the averaged gradients; ``step()`` then does not synchronize again."""
        if self._synced:
            return
        if not self._sync:
            raise UserError("DataParallel: step()/synchronize() called inside no_sync()")
        self._close_backward()
        t0 = time.perf_counter()
        if self._sync_grads.buckets is None or not self._pending:
            raise UserError("DataParallel: step() called without a backward pass since the last step")
        try:
            self._sync_grads.finish_gradients(self.allow_unused)
        finally:
            self._pending = False
        self._synced = True
        self._it.exposed_s += time.perf_counter() - t0

    def step(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        """Synchronize, ``optimizer.step()`` (root only in ``lp-alg1``/``lp-alg2``; ``scaler.step(optimizer)``
        with a ``GradScaler``), then the mode's parameter broadcast (every step in ``lp-alg2``, every
        ``broadcast_every`` steps in ``lp-alg3``). A ``dear`` plan steps this rank's shards and starts the
        all-gathers the next forward waits for (:mod:`dpcomm.runtime.dear`)."""
        t0 = time.perf_counter()
        self.synchronize()
        shards = self._sync_grads.shards
        root_only = self.mode in ("lp-alg1", "lp-alg2")
        if shards is not None:
            shards.step(optimizer, scaler)
            self._gather_due = True  # started by the next forward (or a flush), which waits for them
        elif not root_only or self.rank == self.root:
            scaler.step(optimizer) if scaler is not None else optimizer.step()
        if self.world_size > 1:
            if self.mode == "lp-alg2" or (
                self.mode == "lp-alg3" and (self._steps + 1) % self.broadcast_every == 0
            ):
                self._it.exposed_s += self._sync_grads.broadcast_params()
            self._stale = self.mode == "lp-alg1"
        self._finish_iteration(t0)
        if self._driver is not None:  # every rank asks at the same step (a driver may communicate)
            nxt = self._driver.after_step(self, self.records[-1])
            if nxt is not None:
                self._use(*nxt)
        self._drop_pre_hooks_if_unused()

    def train(self, mode: bool = True) -> DataParallel:
        self.flush()
        return super().train(mode)

    def sync_params(self) -> None:
        """Broadcast the root's parameters and buffers now (e.g. at the end of ``lp-alg1`` training, whose
        non-root replicas otherwise receive the last update only in the next forward)."""
        if self._pending:
            raise UserError("DataParallel: sync_params() between backward and step()")
        self.flush()
        self._it.exposed_s += self._broadcast(params=True)
        self._stale = False

    def write_chrome_trace(self, path: str | Path, gather: bool = True) -> Path | None:
        """Write the kept iterations' compute and communication rows as a Chrome trace.

        ``gather=True``: a collective call (every rank must call it); rank 0 writes one file with a process
        per rank and returns its path, other ranks return None. ``gather=False``: each rank writes
        ``path`` with ``.rank<r>`` before the suffix (no communication).
        """
        return self._timeline.write_chrome_trace(path, self.rank, self.world_size, self.process_group, gather)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The wrapped module's state dict (no ``module.`` prefix), after :meth:`flush`."""
        self.flush()
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped module (call on every rank, or on the root and then :meth:`sync_params`)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def spans(self) -> list[list[Span]]:
        """This rank's timeline of the kept iterations: per iteration, its compute and comm spans."""
        return self._timeline.iterations

    @property
    def grad_buffer_bytes(self) -> int:
        """Bytes of the flat gradient buffers (the one extra copy of the gradients)."""
        return self._sync_grads.nbytes

    def close(self) -> None:
        """Remove the hooks and stop the communication thread (the module stays usable on its own)."""
        with contextlib.suppress(Exception):  # a failed gather was reported where it was waited for
            self.flush()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._layers.drop_hooks()
        self._sync_grads.close()
        ref = _ACTIVE.get(self.module)
        if ref is not None and ref() is self:
            del _ACTIVE[self.module]

    # ----------------------------------------------------------------- what a driver may use

    @property
    def layer_names(self) -> list[str]:
        """Learnable layers' names in forward order (known after the first forward)."""
        return [name for name, _ in self._layers.layers or []]

    @property
    def layer_numels(self) -> list[int]:
        """Parameters per learnable layer, forward order (a shared parameter counts in its first layer)."""
        return [sum(p.numel() for p in ps) for ps in self._layers.params_per_layer]

    @property
    def batch_size(self) -> int:
        """Samples in the first forward's batch (its first argument's first dimension; 0 if unknown)."""
        return self._batch

    def scratch(self) -> torch.Tensor:
        """The largest flat gradient buffer in use, to time messages with (its contents are overwritten;
        drop the reference before the next plan is used: its buffers replace these)."""
        return self._sync_grads.scratch()

    def allreduce(self, t: torch.Tensor, op: str = "allreduce") -> None:
        """Sum ``t`` over the group with this wrapper's collective (no-op on one rank); ``op``
        ``reduce_scatter`` or ``allgather``: that half instead (the ``dear`` schedule's)."""
        if (fn := getattr(self._coll, op, None)) is None:
            raise UserError(f"collective '{self.collective_name}' has no {op} (the dear schedule's halves)")
        if self.world_size > 1:
            fn(t, group=self.process_group)

    def emit(self, msg: str) -> None:
        """One message for the user: ``[rank R] msg`` to ``log`` and the ``dpcomm.runtime`` logger."""
        line = f"[rank {self.rank}] {msg}"
        _log.info(line)
        if self._user_log is not None:
            self._user_log(line)
