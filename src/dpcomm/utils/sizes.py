"""The one reader of byte sizes on the command line and in configs: ``"16MB"`` means the same everywhere.

Unit: binary, as PyTorch's DDP reads ``bucket_cap_mb=25`` (25 * 2**20 bytes) and as nccl-tests and
Horovod print sizes. ``K``/``KB``/``KiB`` = 2**10, ``M``/``MB``/``MiB`` = 2**20, ``G``/``GB``/``GiB`` = 2**30
bytes; no suffix or ``B`` is bytes; case does not matter. ``MiB`` is accepted as the explicit spelling;
``MB`` is *not* 10**6 (there is no decimal unit: write the bytes, e.g. ``16000000``). A decimal number
with a unit is allowed and truncated to whole bytes (``1.5KiB`` = 1536, ``12.5MB`` = 13,107,200); a byte
count without one is a whole number (``1.5`` is refused, not read as 1 byte).

Limit: a size is at most :data:`MAX_SIZE` bytes (``2**63 - 1``, what an int64 byte count holds), or the
smaller ``maximum`` a caller states (``dpcomm netsim``: 1 PiB); more is a one-line error, never a number
that overflows later. A list (``"1M,16M"``) has no empty entries: ``1M,,`` is a typo, not one size.
"""

from __future__ import annotations

import math
import re

from dpcomm.errors import UserError

__all__ = ["MAX_SIZE", "SIZE_UNITS", "parse_size", "parse_sizes"]

MAX_SIZE = 2**63 - 1
"""Largest size in bytes anything reads: an int64 byte count (numpy, torch and the simulators use int64)."""

SIZE_UNITS: dict[str, int] = {"": 1, "b": 1}
"""Lower-case suffix -> bytes."""
for _i, _p in enumerate("kmg", start=1):
    SIZE_UNITS |= {_p: 2 ** (10 * _i), f"{_p}b": 2 ** (10 * _i), f"{_p}ib": 2 ** (10 * _i)}

_SIZE = re.compile(r"^\s*([0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})\s*([a-zA-Z]*)\s*$")
_EXAMPLES = "e.g. 4096, 64K, 16MB, 1.5MiB; K, M, G are 2**10, 2**20, 2**30"


def parse_size(text: str | int, *, what: str = "size", minimum: int = 0, maximum: int = MAX_SIZE) -> int:
    """``"16MB"`` -> 16777216 bytes. A bad size, or one below ``minimum`` or above ``maximum`` bytes
    (at most :data:`MAX_SIZE`), is a one-line :class:`UserError` that starts with ``what`` (e.g.
    ``"--sizes"``, ``"bucket size"``)."""
    shown = str(text) if len(str(text)) <= 60 else f"{str(text)[:57]}..."
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in SIZE_UNITS:
        raise UserError(f"{what}: cannot read {shown!r} as a size in bytes ({_EXAMPLES})")
    number = m.group(1)
    if SIZE_UNITS[unit] == 1 and not number.isdigit():  # "1.5" bytes: a typo, not 1 byte
        raise UserError(f"{what}: {shown!r} is not a whole number of bytes (write a unit, e.g. 1.5K)")
    # whole numbers exactly (a float would round 2**53 + 1); a decimal through float, then truncated
    value = int(number) * SIZE_UNITS[unit] if number.isdigit() else float(number) * SIZE_UNITS[unit]
    top = min(maximum, MAX_SIZE)
    if not math.isfinite(value) or value > top:
        raise UserError(f"{what}: {shown!r} is more than {top:,} bytes, the most allowed here")
    if value < max(minimum, 0):
        raise UserError(f"{what}: {shown!r} is below {minimum} byte{'s' * (minimum != 1)}")
    return int(value)


def parse_sizes(
    text: str | list[str] | tuple[str, ...],
    *,
    what: str = "--sizes",
    minimum: int = 0,
    maximum: int = MAX_SIZE,
) -> tuple[int, ...]:
    """``"4,1K,64K,16MB"`` (or a list of such strings) -> bytes, duplicates dropped, order kept. An empty
    entry (``"1M,,"``, ``",4K"``) is a one-line :class:`UserError`."""
    parts = [text] if isinstance(text, str) else list(text)
    items = [s for part in parts for s in str(part).split(",")]
    if not any(s.strip() for s in items):
        raise UserError(f"{what}: give at least one size")
    if not all(s.strip() for s in items):
        shown = ",".join(map(str, parts))
        shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
        raise UserError(f"{what}: {shown!r} has an empty size (sizes are separated by single commas)")
    return tuple(dict.fromkeys(parse_size(s, what=what, minimum=minimum, maximum=maximum) for s in items))
