"""The collective operations dpcomm implements, costs and benchmarks, in one tuple.

``allreduce`` (every rank ends with the sum), ``broadcast`` (every rank ends with the root's tensor) and
``reduce`` (the root ends with the sum): the ops of MG-WFBP's and the LP paper's cost tables. Every
algorithm in :mod:`dpcomm.collectives` implements all three; every formula in :mod:`dpcomm.costmodel`
prices all three.
"""

from __future__ import annotations

__all__ = ["OPS"]

OPS: tuple[str, ...] = ("allreduce", "broadcast", "reduce")
