"""Size ranges of a fitted multi-GPU topology: ``ranges=FROM:key=value...+FROM:...``, as NCCL's tuner plugin
takes a table of message sizes to what runs (``ext-tuner/example``'s ``nccl_tuner.conf``: a size range ->
algorithm, protocol, channels).

A ``gpus:`` spec's own keys price every size below the first range; each range prices the sizes from its
``FROM`` (bytes, ``K``/``M``/``G`` = powers of 1024) up to the next range's, the last one every size above.
A range gives what NCCL runs there, its own ``algo=`` (absent: NCCL's own choice), ``channels=`` (absent:
the model's count) and ``lat_scale=`` (absent: none), and, where it gives them, its own achievable
``nic_eff=`` and ``intra_eff=`` (absent: the spec's). ``dpcomm calibrate --from-nccl-tests`` writes them
where one set of values does not reproduce a table (:mod:`dpcomm.sim.network.fit_ranges`); a bad one is a
one-line :class:`UserError` (from :func:`parse_ranges`) or a ValueError (:class:`SizeRange`).

Example: ``dgx-b200:2,nic_eff=0.9,lat_scale=1.4,ranges=128M:lat_scale=0.8+1G:algo=ring:lat_scale=2``.
"""

from __future__ import annotations

import dataclasses
import re

from dpcomm.errors import UserError

__all__ = [
    "MAX_RANGES",
    "SizeRange",
    "format_ranges",
    "parse_ranges",
    "ranges_from_json",
    "ranges_to_json",
    "topology_at",
]

MAX_RANGES = 8
"""Most ranges a spec may list after its own values."""
_ALGOS = ("ring", "tree", "nvls", "nvlstree", "collnet", "collnet-direct", "collnet-chain")  # = NCCL_ALGOS
_FROM = re.compile(r"^\s*(\d{1,13})\s*([KMG]?)\s*$")
_NUM = re.compile(r"^\s*\d{1,9}(?:\.\d{1,17})?(?:[eE]-?\d{1,3})?\s*$")
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_KEYS = ("algo", "channels", "lat_scale", "nic_eff", "intra_eff")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SizeRange:
    """From ``from_bytes`` on: what NCCL runs (``algo``, ``channels``, ``lat_scale``; None: NCCL's choice,
    the model's channels, no factor) and the achievable fractions where its own (None: the spec's)."""

    from_bytes: int
    algo: str | None = None
    channels: int | None = None
    lat_scale: float | None = None
    nic_eff: float | None = None
    intra_eff: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.from_bytes <= 1 << 50:
            raise ValueError(f"a range starts at 1 byte to 1 PiB, not {self.from_bytes}")
        if self.algo is not None and self.algo not in _ALGOS:
            raise ValueError(f"a range's algo is one of {', '.join(_ALGOS)}, not {self.algo!r}")
        if self.channels is not None and not 1 <= self.channels <= 64:
            raise ValueError(f"a range's channels={self.channels} must be from 1 to 64")
        if self.lat_scale is not None and not 0 <= self.lat_scale <= 1e4:
            raise ValueError(f"a range's lat_scale={self.lat_scale:g} must be from 0 to 10000")
        for key in ("nic_eff", "intra_eff"):
            v = getattr(self, key)
            if v is not None and not 0 < v <= 1:
                raise ValueError(f"a range's {key}={v:g} must be in (0, 1] (a fraction of the line rate)")

    @property
    def text(self) -> str:
        """``128M:algo=ring:lat_scale=0.8``."""
        n = self.from_bytes
        unit = next((u for u in "GMK" if n % _UNIT[u] == 0), "")
        parts = [f"{n // _UNIT[unit]}{unit}"]
        parts += [f"{k}={getattr(self, k)!r}".replace("'", "") for k in _KEYS if getattr(self, k) is not None]
        return ":".join(parts)


def check(ranges: tuple[SizeRange, ...]) -> None:
    """ValueError unless at most :data:`MAX_RANGES` ranges start at increasing sizes."""
    if len(ranges) > MAX_RANGES:
        raise ValueError(f"at most {MAX_RANGES} size ranges, got {len(ranges)}")
    starts = [r.from_bytes for r in ranges]
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        raise ValueError(f"size ranges must start at increasing sizes, got {', '.join(map(str, starts))}")


def format_ranges(ranges: tuple[SizeRange, ...]) -> str:
    """The spec's ``ranges=`` value."""
    return "+".join(r.text for r in ranges)


def parse_ranges(text: str, shown: str) -> tuple[SizeRange, ...]:
    """Read a spec's ``ranges=`` value (module docstring); a one-line :class:`UserError` otherwise."""
    out = []
    for part in text.split("+"):
        head, *items = part.split(":")
        m = _FROM.match(head)
        if not m:
            raise UserError(
                f"bad topology '{shown}': range '{part}' does not start with a size (e.g. 128M:lat_scale=0.8)"
            )
        fields: dict[str, object] = {"from_bytes": int(m.group(1)) * _UNIT[m.group(2)]}
        for item in items:
            key, eq, value = (x.strip() for x in item.partition("="))
            if key not in _KEYS or not eq or key in fields:
                raise UserError(
                    f"bad topology '{shown}': range item '{item}' is not one key=value of {', '.join(_KEYS)}"
                )
            if key != "algo" and not _NUM.match(value) or key == "channels" and not value.isdigit():
                raise UserError(f"bad topology '{shown}': range item '{item}' is not a number")
            fields[key] = value if key == "algo" else int(value) if key == "channels" else float(value)
        try:
            out.append(SizeRange(**fields))
        except ValueError as exc:
            raise UserError(f"bad topology '{shown}': {exc}") from None
    try:
        check(tuple(out))
    except ValueError as exc:
        raise UserError(f"bad topology '{shown}': {exc}") from None
    return tuple(out)


def ranges_from_json(items: object, where: str) -> tuple[SizeRange, ...]:
    """A network file's ``fabric.ranges`` (a list of objects with ``from_bytes`` and the range's keys)."""
    try:
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            raise ValueError("must be a list of objects")
        out = []
        for x in items:
            unknown = set(x) - {"from_bytes", *_KEYS}
            if unknown:
                raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
            if not isinstance(x.get("from_bytes"), int) or not isinstance(x.get("channels", 1), int):
                raise ValueError("needs from_bytes, a whole number (and channels, if any, one too)")
            out.append(
                SizeRange(**{k: (float(v) if k.endswith(("eff", "scale")) else v) for k, v in x.items()})
            )
        check(tuple(out))
        return tuple(out)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: field 'fabric.ranges' {exc}") from None


def ranges_to_json(ranges: tuple[SizeRange, ...]) -> list[dict]:
    """The network file's ``fabric.ranges``: each range's values that are set."""
    return [{k: v for k, v in dataclasses.asdict(r).items() if v is not None} for r in ranges]


def topology_at(t, nbytes: int):
    """The topology (a :class:`~dpcomm.topology.multigpu.MultiGPU`) that prices a message of ``nbytes``: the
    spec's own values below its first range, else the last range starting at or below ``nbytes``."""
    if not t.ranges:
        return t
    r = next((r for r in reversed(t.ranges) if r.from_bytes <= nbytes), None)
    if r is None:
        return dataclasses.replace(t, ranges=())
    return dataclasses.replace(
        t,
        ranges=(),
        algo=r.algo,
        channels=r.channels,
        lat_scale=r.lat_scale,
        nic_eff=r.nic_eff if r.nic_eff is not None else t.nic_eff,
        intra_eff=r.intra_eff if r.intra_eff is not None else t.intra_eff,
    )
