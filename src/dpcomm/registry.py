"""The one registry of collective algorithms: a name, its implementation and its cost formulas.

An algorithm module in :mod:`dpcomm.collectives` registers its implementation
(``@dpcomm.collectives.register("ring")``); :mod:`dpcomm.costmodel.collective` registers the cost formulas
of the same name. Both land in one :class:`Entry` per name, so the CLI, the planners, ``auto`` and the
benchmark all read the same table: ``entry("ring").factory`` builds it, ``entry("ring").cost`` prices it.
A name may have only formulas (``binary_tree``, ``recursive_doubling``: cost-only) or only an
implementation (``auto``, ``noop``: nothing to price). This module imports neither torch nor the packages
that fill it, so the cost model stays importable without torch.

One name per thing: where two names are established for one algorithm, the second is an *alias*
(:data:`ALIASES`): ``bml`` (the BML paper's name, ``dpcomm netsim``'s) is ``bcube`` (gloo's name, the
implementation's). :func:`entry` and :func:`resolve` accept either; listings show the canonical name and
:func:`describe` mentions its aliases. ``dpcomm bench``, ``netsim``, ``train --collective``,
``plan``/``simulate --algo``, :func:`dpcomm.ddp.collective_hook` and the cost model all resolve names here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALIASES",
    "CostTable",
    "Entry",
    "add_cost",
    "add_implementation",
    "aliases_of",
    "describe",
    "entry",
    "implemented",
    "resolve",
]


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

ALIASES: dict[str, str] = {"bml": "bcube"}
"""Second names of one algorithm -> its canonical name (``bml``: BML sec. 3's name for BCube's allreduce)."""


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


def resolve(name: str) -> str | None:
    """The canonical name of ``name`` (itself, or what the alias stands for); None: no such algorithm."""
    name = ALIASES.get(name, name)
    return name if name in _ENTRIES else None


def entry(name: str) -> Entry | None:
    """What dpcomm has under ``name`` (a canonical name or an alias), or None."""
    canonical = resolve(name)
    return None if canonical is None else _ENTRIES[canonical]


def aliases_of(name: str) -> list[str]:
    """The aliases of canonical ``name`` (``aliases_of("bcube") == ["bml"]``)."""
    return [a for a, c in ALIASES.items() if c == name]


def describe(names: list[str] | tuple[str, ...]) -> str:
    """``"ring, bcube (alias bml), ..."``: a list of canonical names for a message or ``--help``."""
    out = []
    for n in names:
        more = aliases_of(n)
        out.append(f"{n} (alias {', '.join(more)})" if more else n)
    return ", ".join(out)


def implemented() -> list[str]:
    """Names with an implementation, in registration order."""
    return [e.name for e in sorted(_ENTRIES.values(), key=lambda e: e.impl_order) if e.factory is not None]


class CostTable(Mapping[str, Any]):
    """The registry seen as ``{name: cost formulas}`` (live: names with formulas, in registration order)."""

    def _names(self) -> list[str]:
        return [e.name for e in sorted(_ENTRIES.values(), key=lambda e: e.cost_order) if e.cost is not None]

    def __getitem__(self, name: str) -> Any:
        e = entry(name)  # an alias finds its algorithm's formulas; iteration lists canonical names only
        if e is None or e.cost is None:
            raise KeyError(name)
        return e.cost

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"CostTable({self._names()})"
