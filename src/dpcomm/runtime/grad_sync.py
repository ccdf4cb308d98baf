"""The communication side of one :class:`~dpcomm.runtime.data_parallel.DataParallel`: the plan's flat gradient
buffers, the communication thread, and each mode's jobs (MG-WFBP Alg. 2 lines 21-30; the LP paper's modes,
:mod:`dpcomm.runtime.bsp`).

A group whose gradients are all ready is launched at once in ``overlap`` and ``lp-alg1`` (while backward
goes on), after backward in the fork-join modes. With a collective whose backend makes its own progress
(``native``), all-reduces start right in the backward hook, without the communication thread.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.runtime import bsp
from dpcomm.runtime.buckets import GradBuckets, Group
from dpcomm.runtime.comm_thread import CommFailure, CommJob, CommThread
from dpcomm.runtime.dear import Gathers, Shards

__all__ = ["GradSync"]


class GradSync:
    """Buckets, communication thread and mode of one wrapper on one rank."""

    def __init__(
        self,
        collective: Any,
        group: Any,
        rank: int,
        world: int,
        root: int,
        mode: str,
        timeout_s: float | None,
        device: torch.device | None = None,
    ):
        self._coll, self._pg = collective, group
        self.rank, self.world, self.root, self.mode, self.timeout_s = rank, world, root, mode, timeout_s
        self._async = callable(getattr(collective, "allreduce_async", None))
        self.comm = CommThread(name=f"dpcomm-comm-r{rank}", device=device)  # jobs end when its work ran
        self.buckets: GradBuckets | None = None
        """The flat buffers of the plan in use (None before the first forward)."""
        self.shards: Shards | None = None
        """A ``dear`` plan's shards (:mod:`dpcomm.runtime.dear`); None for all-reduce plans."""

    def use(
        self,
        plan: Plan,
        params_per_layer: list[list[nn.Parameter]],
        names: dict[int, str],
        reduce_dtype: torch.dtype | None,
    ) -> None:
        """Buckets for ``plan`` (new ones only where its groups differ from the current ones); a ``dear``
        plan's shards (the caller consolidated the old shards' optimizer state first)."""
        if plan.sharded:
            if self.mode != "overlap":
                raise UserError(f"the dear schedule runs in mode 'overlap', not '{self.mode}'")
            if not callable(getattr(self._coll, "reduce_scatter", None)):
                name = getattr(self._coll, "name", type(self._coll).__name__)
                raise UserError(f"the dear schedule needs a reduce-scatter: collective '{name}' has none "
                                "(use ring or native)")  # fmt: skip
        fresh = self.buckets is None or self.buckets.plan.groups != plan.groups
        if fresh:
            self.buckets = self.shards = None  # free the old buffers first: never two copies
            self.buckets = GradBuckets(plan, params_per_layer, names, reduce_dtype)
        if not plan.sharded:
            self.shards = None
        elif fresh or self.shards is None:
            self.shards = Shards(self.buckets, self._coll, self._pg, self.rank, self.world)

    def ready(self, p: nn.Parameter) -> int:
        """``p``'s gradient is final for this backward; launch the groups it completes (overlapping modes).
        Returns its layer."""
        slot = self.buckets.mark_ready(p)
        if self.mode in ("overlap", "lp-alg1"):
            for g in self.buckets.pop_launchable():
                self._launch(g)
        return slot.layer

    def _launch(self, g: Group) -> None:
        """Queue group ``g``'s gradient communication for this mode."""
        b, coll, pg, world = self.buckets, self._coll, self._pg, self.world
        if self.shards is not None:
            label, run = self.shards.job(g)
        elif self.mode in ("lp-alg1", "lp-alg2"):
            label, run = bsp.reduce_job(coll, b, g, pg, world, self.rank, self.root)
        elif self._async:
            bsp.start_allreduce(self.comm, coll, b, g, pg, world)
            return
        else:
            label, run = bsp.allreduce_job(coll, b, g, pg, world)
        self.comm.submit(label, run, g.nbytes)

    def wait(self, job: CommJob | None) -> float:
        """Wait for ``job`` (None: everything queued); returns the seconds waited."""
        t0 = time.perf_counter()
        try:
            if job is None:
                self.comm.wait_all(self.timeout_s)
            else:
                job.wait(self.timeout_s)
        except CommFailure as exc:
            raise CommFailure(f"DataParallel rank {self.rank} of {self.world}: {exc}") from exc
        return time.perf_counter() - t0

    def finish_gradients(self, allow_unused: bool) -> None:
        """After backward: launch what is left and wait for every group; ``.grad`` then holds the averages.
        Parameters without a gradient are an error naming them, or zero with ``allow_unused``."""
        b = self.buckets
        missing = b.missing()
        if missing and not allow_unused:
            self.wait(None)  # groups already sent must finish on every rank before we raise
            b.reset()
            names = ", ".join(s.name for s in missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise UserError(
                f"DataParallel: {len(missing)} parameter(s) got no gradient this iteration: {names} "
                "(pass allow_unused=True to treat them as zero)"
            )
        b.fill_missing_with_zeros()
        for g in b.pop_launchable():
            self._launch(g)
        self.wait(None)
        b.reset()

    def broadcast_params(self) -> float:
        """The root's parameters to every rank, group by group (``lp-alg2``/``lp-alg3``); seconds waited."""
        t0 = time.perf_counter()
        for g in self.buckets.groups:
            self.comm.submit(
                *bsp.broadcast_params_job(self._coll, self.buckets, g, self._pg, self.rank, self.root)
            )
        self.wait(None)
        return time.perf_counter() - t0

    def start_gathers(self) -> Gathers:
        """``dear``: queue the all-gathers of the last step's parameters (the forward waits for them)."""
        return self.shards.start_gathers(self.comm)

    def prefetch(self) -> bsp.LayerwiseBroadcast:
        """``lp-alg1``: fetch the root's new parameters layer by layer during the next forward."""
        return bsp.LayerwiseBroadcast(self.comm, self._coll, self.buckets, self._pg, self.rank, self.root)

    @property
    def nbytes(self) -> int:
        """Bytes of the flat gradient buffers."""
        return self.buckets.nbytes if self.buckets is not None else 0

    def scratch(self) -> torch.Tensor:
        """The largest flat buffer in use (see :meth:`DataParallel.scratch`)."""
        return max((t for g in self.buckets.groups for t in g.flats.values()), key=torch.Tensor.numel)

    def close(self) -> None:
        self.comm.close()
