"""Shared pieces of the multi-GPU schedules: near-equal parts, the server shape, NCCL's channel order."""

from __future__ import annotations

import numpy as np

__all__ = ["entry_gpu", "parts", "shape"]


def parts(numel: int, count: int) -> np.ndarray:
    """Element counts of ``count`` near-equal parts of ``numel`` (the first ``numel mod count`` one longer,
    as :func:`dpcomm.collectives._p2p.chunk_bounds` cuts them)."""
    base, extra = divmod(int(numel), int(count))
    out = np.full(count, base, dtype=np.int64)
    out[:extra] += 1
    return out


def shape(p: int, g: int) -> tuple[int, int]:
    """``(GPUs per server, servers)`` of ``p`` ranks on servers of ``g`` GPUs: fewer ranks than ``g`` sit on
    one server; otherwise ``p`` must fill whole servers."""
    if p < 1 or g < 1:
        raise ValueError(f"needs p >= 1 ranks and g >= 1 GPUs per server, got {p}, {g}")
    if p <= g:
        return p, 1
    if p % g:
        raise ValueError(
            f"{p} ranks do not fill servers of {g} GPUs (give a multiple of {g}, or at most {g})"
        )
    return g, p // g


def entry_gpu(channel: int, channels: int, g: int) -> int:
    """The GPU where channel ``channel`` enters (and, through the NIC beside it, leaves) each server: the
    channels spread evenly over the GPUs, so over the NICs (one NIC per channel when channels = NICs)."""
    return (channel * g // max(1, channels)) % g if channels <= g else channel % g
