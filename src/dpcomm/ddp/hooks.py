"""dpcomm's collectives as DDP communication hooks, in the exact shape of PyTorch's ``ddp_comm_hooks``.

A hook is ``hook(state, bucket) -> Future[Tensor]``: DDP calls it once per bucket when the bucket's gradients
are ready (in bucket order, the same on every rank) and writes the future's tensor back into the gradients.
As PyTorch's ``default_hooks.allreduce_hook`` does, the hook divides the bucket by the group size first and
then sums it with the collective, so its result equals DDP's own average; with integer gradients and a
power-of-two group it is the same to the bit. The hook keeps no state of its own; ``state`` is

- ``None`` or a process group: the collective runs inside the hook, on the autograd thread (backward waits
  for each bucket's all-reduce, as in MG-WFBP's non-overlapped baseline), or
- a :class:`HookState`: the collective runs on the state's one communication thread, in call order, and
  backward goes on meanwhile (MG-WFBP Alg. 2's communication queue); DDP waits for the futures at the end
  of backward.

Because the shape is PyTorch's, dpcomm hooks compose with its wrappers, e.g.
``fp16_compress_wrapper(collective_hook("ring"))`` sends float16 through dpcomm's ring.
"""

# No ``from __future__ import annotations`` here: DDP checks a hook's annotations against the classes
# themselves (``dist.GradBucket``, ``Future[Tensor]``), and postponed annotations would be strings.
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.collectives import get

__all__ = ["HookState", "collective_hook"]

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


@dataclass(kw_only=True)
class HookState:
    """State for an overlapped hook: the process group and the thread its collectives run on."""

    process_group: Any = None
    """Group to all-reduce over (None: the default group)."""
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def submit(self, fn: Callable[[], None]) -> None:
        if self._pool is None:  # one thread: buckets leave in the order DDP hands them over, on every rank
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpcomm-ddp-hook")
        self._pool.submit(fn)

    def close(self) -> None:
        """Stop the communication thread (after the last backward)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __getstate__(self) -> dict:  # DDP pickles hook states on save; the thread stays behind
        return {"process_group": None}


def collective_hook(name: str, **options: Any) -> Hook:
    """A DDP comm hook that averages each bucket with dpcomm collective ``name`` (``ring``, ``lp``, ``be``,
    ``mst``, ``bcube``, ``auto``, ``native``...), built once with ``options`` (see
    :func:`dpcomm.collectives.get`). Register it with ``ddp.register_comm_hook(state, hook)``."""
    algo = get(name, **options)  # an unknown name fails here, before DDP runs

    def _reduce(group: Any, tensor: torch.Tensor) -> torch.Tensor:
        tensor.div_(dist.get_world_size(group))
        algo.allreduce(tensor, group=group)
        return tensor

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        tensor = bucket.buffer()
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        if not isinstance(state, HookState):
            fut.set_result(_reduce(state, tensor))  # an error raises here, in backward, naming the step
            return fut

        def run() -> None:
            try:
                fut.set_result(_reduce(state.process_group, tensor))
            except BaseException as exc:  # noqa: BLE001 - DDP's wait() re-raises it in the training thread
                fut.set_exception(exc)

        state.submit(run)
        return fut

    hook.__name__ = hook.__qualname__ = f"dpcomm_{name}_hook"
    return hook
