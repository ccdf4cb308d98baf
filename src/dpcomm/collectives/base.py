"""The one signature every collective algorithm has; implementations register in :mod:`dpcomm.registry`.

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
from dpcomm.ops import OPS
from dpcomm.registry import add_implementation, describe, entry, implemented
from dpcomm.registry import resolve as _resolve

__all__ = ["Collective", "OPS", "register", "get", "names", "resolve"]


class Collective(Protocol):
    name: str

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None: ...

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None: ...

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None: ...


def register(name: str) -> Callable[[Callable[..., Collective]], Callable[..., Collective]]:
    """Class decorator: ``@register("ring")`` makes ``get("ring", **options)`` build it (in
    :mod:`dpcomm.registry`, next to the cost formulas of the same name)."""

    def deco(factory: Callable[..., Collective]) -> Callable[..., Collective]:
        add_implementation(name, factory)
        return factory

    return deco


def _load_all() -> None:
    # Importing the package imports every algorithm module, each of which registers itself.
    import dpcomm.collectives  # noqa: F401


def names() -> list[str]:
    """Every algorithm with an implementation, in registration order, by canonical name (an alias such as
    ``bml`` for ``bcube`` is accepted by :func:`resolve` and :func:`get` but not listed here; see
    :data:`dpcomm.registry.ALIASES`)."""
    _load_all()
    return implemented()


def resolve(name: str, *, what: str | None = None) -> str:
    """The canonical name of implemented algorithm ``name`` or of its alias (``"bml"`` -> ``"bcube"``); an
    unknown name is a one-line :class:`UserError` listing the choices, prefixed ``what: `` (a flag) if
    given."""
    _load_all()
    canonical = _resolve(str(name).strip())
    if canonical is None or entry(canonical).factory is None:
        head = f"{what}: unknown algorithm" if what else "unknown collective algorithm"
        raise UserError(f"{head} '{name}' (choose from {describe(names())})")
    return canonical


def get(name: str, **options: Any) -> Collective:
    """Build the algorithm registered as ``name`` (or an alias of it); an unknown name is a
    :class:`UserError`."""
    return entry(resolve(name)).factory(**options)
