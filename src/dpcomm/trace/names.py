"""Groups of parameters named as a person reads them: ``h.3.mlp.*, h.3.ln_2.*`` rather than unit numbers.

:func:`pattern` compresses a set of parameter names against all of the model's names: a module path whose
parameters are all in the set is written once as ``path.*``; what is left is written by its full name. It
names DDP buckets and FSDP units in ``str(ddp.dpcomm)`` / ``str(model.dpcomm)`` and in dpcomm's warnings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["pattern"]

_SHOWN = 4
"""At most this many items are listed; longer lists show the first and last few and a count."""


def _under(names: Sequence[str], prefix: str) -> list[str]:
    return [n for n in names if not prefix or n == prefix or n.startswith(prefix + ".")]


def _compress(chosen: set[str], names: Sequence[str], prefix: str) -> list[str]:
    inside = _under(names, prefix)
    if inside and all(n in chosen for n in inside):
        return [f"{prefix}.*" if prefix and prefix not in chosen else (prefix or "*")]
    out: list[str] = []
    seen: list[str] = []
    depth = prefix.count(".") + 1 if prefix else 0
    for n in inside:
        child = ".".join(n.split(".")[: depth + 1])
        if child not in seen:
            seen.append(child)
    for child in seen:
        if child in chosen and child in names and not any(m.startswith(child + ".") for m in names):
            out.append(child)  # a parameter itself
        elif any(n in chosen for n in _under(names, child)):
            out += _compress(chosen, names, child)
    return out


def pattern(chosen: Iterable[str], names: Sequence[str]) -> str:
    """``chosen`` (parameter names) written compactly against ``names`` (every name of the model, in
    registration order): ``h.3.mlp.*, h.3.ln_2.*``; ``*`` when it is all of them."""
    items = _compress(set(chosen), list(names), "")
    if len(items) > _SHOWN:
        items = [*items[:2], f"... ({len(items) - 3} more) ...", items[-1]]
    return ", ".join(items)
