"""Shared checks and step counts for the cost formulas (private to :mod:`dpcomm.costmodel`)."""

from __future__ import annotations

import math
import numbers

__all__ = ["check", "trivial", "ceil_log2", "floor_log2", "is_pow2"]


def check(nbytes: float, nodes: int) -> None:
    """Reject a negative/NaN message size or a node count below 1 (a programming error, not user input)."""
    if isinstance(nbytes, bool) or not (
        isinstance(nbytes, numbers.Real) and math.isfinite(nbytes) and nbytes >= 0
    ):
        raise ValueError(f"message size must be a finite number of bytes >= 0, got {nbytes!r}")
    if isinstance(nodes, bool) or not isinstance(nodes, numbers.Integral) or nodes < 1:
        raise ValueError(f"node count must be an integer >= 1, got {nodes!r}")


def trivial(nbytes: float, nodes: int) -> bool:
    """Validate, then say whether the collective moves nothing (one node or zero bytes): it costs 0 s."""
    check(nbytes, nodes)
    return nodes == 1 or nbytes == 0


def ceil_log2(p: int) -> int:
    """``ceil(log2 p)``: rounds of a binomial tree over ``p`` nodes (0 for p = 1)."""
    return (int(p) - 1).bit_length()


def floor_log2(p: int) -> int:
    """``floor(log2 p)``: height of a complete binary tree on ``p`` nodes; log2 of the largest 2^k <= p."""
    return int(p).bit_length() - 1


def is_pow2(p: int) -> bool:
    return int(p) & (int(p) - 1) == 0
