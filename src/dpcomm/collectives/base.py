"""The one signature every collective algorithm has, and the one registry the CLI, runtime and benchmark use.

Every algorithm works *in place* on a contiguous tensor, sums (the runtime divides by P to average), and is
blocking for the calling thread (the runtime overlaps it with backward by calling it from a communication
thread, as MG-WFBP's Algorithm 2 does with its communication queue)::

    algo = get("lp", block_bytes=None)
    algo.allreduce(tensor, group=pg)
    algo.broadcast(tensor, root=0, group=pg)
    algo.reduce(tensor, root=0, group=pg)      # the sum lands on root; other ranks' tensors are scratch

``group`` is a torch.distributed process group (None: the default group); ``root`` is a rank *of that group*.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from dpcomm.errors import UserError

__all__ = ["Collective", "OPS", "register", "get", "names"]

OPS = ("allreduce", "broadcast", "reduce")


class Collective(Protocol):
    name: str

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None: ...

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None: ...

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None: ...


_REGISTRY: dict[str, Callable[..., Collective]] = {}


def register(name: str) -> Callable[[Callable[..., Collective]], Callable[..., Collective]]:
    """Class decorator: ``@register("ring")`` makes ``get("ring", **options)`` build it."""

    def deco(factory: Callable[..., Collective]) -> Callable[..., Collective]:
        _REGISTRY[name] = factory
        return factory

    return deco


def _load_all() -> None:
    # Importing the package imports every algorithm module, each of which registers itself.
    import dpcomm.collectives  # noqa: F401


def names() -> list[str]:
    _load_all()
    return list(_REGISTRY)


def get(name: str, **options: Any) -> Collective:
    """Build the algorithm registered as ``name``; an unknown name is a :class:`UserError`."""
    _load_all()
    if name not in _REGISTRY:
        raise UserError(f"unknown collective algorithm '{name}' (choose from {', '.join(_REGISTRY)})")
    return _REGISTRY[name](**options)
