"""``noop``: does nothing -- measures the headroom of everything around communication.

Steps 0, bytes 0, time 0, extra memory 0. Results are *not* reduced, so it is excluded from correctness
tests; with it, a training run shows the time the rest of the iteration takes. One step::

    rank 0: [ tensor ]  -- nothing sent --  [ tensor ]   (unchanged)
    rank 1: [ tensor ]  -- nothing sent --  [ tensor ]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.collectives.base import register

__all__ = ["Noop"]


@register("noop")
@dataclass(slots=True, kw_only=True)
class Noop:
    """Leaves the tensor as it is."""

    name: str = "noop"

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        return None

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        return None

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        return None
