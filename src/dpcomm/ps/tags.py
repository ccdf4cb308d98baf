"""Every message tag of a parameter-server run, in one place, with the range each family uses.

A run's point-to-point messages share process groups (:mod:`dpcomm.ps.node`), so a receive posted for one
kind of message must never match another: each family is a base plus a unit index (a push group, a pull
batch), and the families' ranges are disjoint for every unit index below :data:`MAX_UNITS`
(``tests/test_ps_keys.py`` checks it). gloo tags are C ``int``s: every tag is below 2**31.
"""

from __future__ import annotations

__all__ = [
    "MAX_UNITS",
    "MOMENTUM",
    "PROBE",
    "PULL",
    "RANGES",
    "RESIDUAL",
    "pull",
    "push",
    "request",
]

MAX_UNITS = 20_000
"""Push groups and pull batches a run may have (each is a run of learnable layers, so: layers per model)."""

_PUSH = 1_000
"""Push group ``g``: ``_PUSH + 2 g`` (dense values, or a sparse push's indices), ``+ 1`` (its values)."""
PULL = 500_000
"""Training's pulls: batch ``k`` is ``PULL + k``; its request ``PULL + _REQUEST + k``."""
PROBE = 900_000
"""The planner's probe rounds (:mod:`dpcomm.ps.probe`), as :data:`PULL`."""
_REQUEST = MAX_UNITS
"""Offset of a pull batch's request from the pull's own tag."""
MOMENTUM = 950_000
"""A server's momentum shard sent to rank 0 for a checkpoint (:mod:`dpcomm.ps.state`)."""
RESIDUAL = MOMENTUM + 1
"""A worker's top-k residual sent to rank 0 for a checkpoint."""


def push(g: int, part: int = 0) -> int:
    """Tag of push group ``g``'s message ``part`` (0: values or indices, 1: a sparse push's values)."""
    return _PUSH + 2 * g + part


def pull(base: int, k: int) -> int:
    """Tag of batch ``k`` of a pull (``base``: :data:`PULL` or :data:`PROBE`)."""
    return base + k


def request(base: int, k: int) -> int:
    """Tag of the request for batch ``k`` of a pull (request mode)."""
    return base + _REQUEST + k


RANGES: dict[str, range] = {
    "push": range(push(0), push(MAX_UNITS - 1, 1) + 1),
    "pull": range(pull(PULL, 0), pull(PULL, MAX_UNITS)),
    "pull request": range(request(PULL, 0), request(PULL, MAX_UNITS)),
    "probe": range(pull(PROBE, 0), pull(PROBE, MAX_UNITS)),
    "probe request": range(request(PROBE, 0), request(PROBE, MAX_UNITS)),
    "momentum": range(MOMENTUM, MOMENTUM + 1),
    "residual": range(RESIDUAL, RESIDUAL + 1),
}
"""Every tag each family can use (unit indices ``0..MAX_UNITS-1``)."""
