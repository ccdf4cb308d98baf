"""The units of the simple FSDP planners: ``per-block`` (:func:`block_units`) and ``size:BYTES``
(:func:`size_units`); :mod:`dpcomm.planner.fsdp` documents every method."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["block_units", "size_units"]

Units = list[tuple[int, int]]

_BLOCK = re.compile(r"^((?:[^.]+\.)*?[0-9]+)\.[^.]")


def block_units(names: Sequence[str]) -> Units:
    """Units of ``per-block`` (module docstring) for module names in forward order."""
    keys = [(m.group(1) if (m := _BLOCK.match(n)) else None) for n in names]
    if not any(k is not None for k in keys):  # no repeated blocks (LeNet-5, VGG): the top-level children
        keys = [n.split(".", 1)[0] for n in names]
    units: Units = []
    for i, k in enumerate(keys):
        if i and k == keys[i - 1]:
            units[-1] = (units[-1][0], i)
        else:
            units.append((i, i))
    return units


def size_units(param_bytes: Sequence[float], size_bytes: int) -> Units:
    """Units closed once they hold ``>= size_bytes`` bytes, in forward order; the last holds the rest."""
    units: Units = []
    first, held = 0, 0.0
    for i, x in enumerate(param_bytes):
        held += float(x)
        if held >= size_bytes:
            units.append((first, i))
            first, held = i + 1, 0.0
    if first < len(param_bytes):
        units.append((first, len(param_bytes) - 1))
    return units
