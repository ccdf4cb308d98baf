"""BML's all-reduce on BCube as a flow schedule: ``k`` aggregation then ``k`` broadcast steps, all threads
together (BML Algorithm 1).

Step ``w`` of the aggregation (broadcast) holds the messages of all ``k`` threads, thread ``t`` on level
``(w + t) mod k`` (``(k - 1 - w + t) mod k``), each message ``CalcGset``'s run of pieces: the vectorised
form of :func:`dpcomm.collectives.bcube.transfers`, which ``tests/test_netsim.py`` compares it with.
Source: the BML paper (NeurIPS 2018), sec. 3.2, Algorithm 1, as :mod:`dpcomm.collectives.bcube` cites it.
"""

from __future__ import annotations

import numpy as np

from dpcomm.messages import Step
from dpcomm.topology import BCube

__all__ = ["bml_steps"]


def bml_steps(cube: BCube, numel: int, elem_size: int = 4) -> list[Step]:
    """BML allreduce on ``cube``: ``k`` aggregation then ``k`` broadcast steps, all threads together."""
    n, k, big_n = cube.n, cube.k, cube.servers
    parts = k * big_n  # piece boundaries as collectives.bcube.piece_bounds: near-equal pieces of elements
    base, extra = divmod(numel, parts)
    j = np.arange(parts + 1, dtype=np.int64)
    bounds = (j * base + np.minimum(j, extra)) * elem_size
    a = np.repeat(np.arange(big_n, dtype=np.int64), n - 1)
    hop = np.tile(np.arange(1, n, dtype=np.int64), big_n)

    def digit(r: np.ndarray, level: int) -> np.ndarray:
        return (r // n**level) % n

    def position(t: int, r: np.ndarray) -> np.ndarray:
        pos = np.zeros_like(r)
        for i in range(k):
            pos = pos * n + digit(r, (t + i) % k)
        return pos

    def gset_bytes(t: int, r: np.ndarray, w: int) -> np.ndarray:
        span = n ** (k - 1 - w)
        lo = (position(t, r) // span) * span
        return bounds[t * big_n + lo + span] - bounds[t * big_n + lo]

    out = []
    for phase in ("aggregate", "broadcast"):
        for w in range(k):
            src, dst, size, lane = [], [], [], []
            for t in range(k):
                level = (w + t) % k if phase == "aggregate" else (k - 1 - w + t) % k
                d = digit(a, level)
                s = a + (((d + hop) % n) - d) * n**level
                src.append(a)
                dst.append(s)
                size.append(gset_bytes(t, s, w) if phase == "aggregate" else gset_bytes(t, a, k - 1 - w))
                lane.append(np.full(len(a), t, dtype=np.int64))
            out.append(
                Step(
                    label=f"{phase} {w}",
                    src=np.concatenate(src),
                    dst=np.concatenate(dst),
                    nbytes=np.concatenate(size),
                    lane=np.concatenate(lane),
                )
            )
    return out
