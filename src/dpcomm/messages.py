"""A collective's send schedule as plain data: steps of ``(src, dst, bytes)`` messages.

Each algorithm module of :mod:`dpcomm.collectives` (``ring``, ``be``, ``mst``, ``lp``, ``ps``) has a
``steps(p, numel, elem_size)`` function that returns the messages its allreduce sends, grouped into the
steps its docstring numbers: the messages of one step are posted together, and a step starts when the one
before it has ended. The steps are built, without torch, in :mod:`dpcomm.schedules` from the same helpers
the executing code calls (``chunk_bounds``, ``fold_rank``, ``tree_children``, ``block_bounds``), and
``tests/test_netsim_schedules.py`` runs the real algorithm on spawned gloo processes, records every
point-to-point send, and compares the two.

The network simulator (:mod:`dpcomm.sim.network`) prices these steps as concurrent flows. This module is
plain data without torch, so the simulator's own schedules (``nccl_ring``, ``nvls``, ...) and ``dpcomm
netsim`` on them need no torch; ``dpcomm.collectives.schedule`` re-exports it. Arrays, not Python tuples,
so a 1,024-rank parameter server's million messages per step stay cheap; :meth:`Step.transfers` gives the
tuples for reading.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["Step", "message_counts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """The messages posted together in one step of a schedule (ranks are group ranks)."""

    label: str
    """Phase and step, e.g. ``"reduce-scatter 3"``."""
    src: np.ndarray
    """Sender of each message (int64)."""
    dst: np.ndarray
    """Receiver of each message (int64)."""
    nbytes: np.ndarray
    """Payload bytes of each message (int64; zero-length messages are kept, as the algorithm sends them)."""
    lane: np.ndarray | None = None
    """The sending thread of each message where a rank runs several (BML's ``k`` threads); None: one."""

    def __post_init__(self) -> None:
        n = len(self.src)
        if len(self.dst) != n or len(self.nbytes) != n or (self.lane is not None and len(self.lane) != n):
            raise ValueError(f"step {self.label!r}: src, dst, nbytes (and lane) need one entry per message")

    def transfers(self) -> list[tuple[int, int, int]]:
        """The step's messages as ``(src, dst, bytes)`` tuples."""
        return list(zip(self.src.tolist(), self.dst.tolist(), self.nbytes.tolist(), strict=True))

    @staticmethod
    def of(label: str, messages: Iterable[tuple[int, int, int]]) -> Step:
        """A step from ``(src, dst, bytes)`` tuples."""
        rows = list(messages)
        arr = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
        return Step(label=label, src=arr[:, 0].copy(), dst=arr[:, 1].copy(), nbytes=arr[:, 2].copy())


def message_counts(steps: Iterable[Step]) -> Counter[tuple[int, int, int]]:
    """Every message of a schedule as a multiset of ``(src, dst, bytes)``."""
    out: Counter[tuple[int, int, int]] = Counter()
    for st in steps:
        out.update(st.transfers())
    return out
