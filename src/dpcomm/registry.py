"""The one registry of collective algorithms: a name, its implementation and its cost formulas.

An algorithm module in :mod:`dpcomm.collectives` registers its implementation
(``@dpcomm.collectives.register("ring")``); :mod:`dpcomm.costmodel.collective` registers the cost formulas
of the same name. Both land in one :class:`Entry` per name, so the CLI, the planners, ``auto`` and the
benchmark all read the same table: ``entry("ring").factory`` builds it, ``entry("ring").cost`` prices it.
A name may have only formulas (``binary_tree``, ``recursive_doubling``: cost-only) or only an
implementation (``auto``, ``noop``: nothing to price). This module imports neither torch nor the packages
that fill it, so the cost model stays importable without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CostTable", "Entry", "add_cost", "add_implementation", "entry", "implemented"]


@dataclass(slots=True, kw_only=True)
class Entry:
    """One algorithm name and what dpcomm has for it."""

    name: str
    factory: Callable[..., Any] | None = None
    """Builds the implementation (``factory(**options)``); None: cost formulas only."""
    cost: Any = None
    """Its :class:`dpcomm.costmodel.Algorithm` (the formulas); None: nothing to price."""
    impl_order: int = -1
    """Registration order of the implementation (the order ``names()`` lists them in)."""
    cost_order: int = -1
    """Registration order of the formulas (the order the cost table lists them in)."""


_ENTRIES: dict[str, Entry] = {}


def _get(name: str) -> Entry:
    if name not in _ENTRIES:
        _ENTRIES[name] = Entry(name=name)
    return _ENTRIES[name]


def add_implementation(name: str, factory: Callable[..., Any]) -> None:
    """Record ``factory`` as the implementation of ``name`` (a re-registration replaces it)."""
    e = _get(name)
    if e.impl_order < 0:
        e.impl_order = sum(x.impl_order >= 0 for x in _ENTRIES.values())
    e.factory = factory


def add_cost(name: str, cost: Any) -> None:
    """Record ``cost`` (a :class:`dpcomm.costmodel.Algorithm`) as the formulas of ``name``."""
    e = _get(name)
    if e.cost_order < 0:
        e.cost_order = sum(x.cost_order >= 0 for x in _ENTRIES.values())
    e.cost = cost


def entry(name: str) -> Entry | None:
    """What dpcomm has under ``name``, or None."""
    return _ENTRIES.get(name)


def implemented() -> list[str]:
    """Names with an implementation, in registration order."""
    return [e.name for e in sorted(_ENTRIES.values(), key=lambda e: e.impl_order) if e.factory is not None]


class CostTable(Mapping[str, Any]):
    """The registry seen as ``{name: cost formulas}`` (live: names with formulas, in registration order)."""

    def _names(self) -> list[str]:
        return [e.name for e in sorted(_ENTRIES.values(), key=lambda e: e.cost_order) if e.cost is not None]

    def __getitem__(self, name: str) -> Any:
        e = _ENTRIES.get(name)
        if e is None or e.cost is None:
            raise KeyError(name)
        return e.cost

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"CostTable({self._names()})"
