"""Who is who in a parameter-server run and which slice of which server each message is (plain data, the same
on every rank), and which process group ("lane") a message travels on (:mod:`dpcomm.ps.node`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpcomm.ps.keys import Key, assign_keys

__all__ = ["Layout", "ask_lane", "lane"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Who is who and which slice of which server each (unit, server) message is; the same on every rank."""

    workers: int
    servers: int
    colocated: bool
    numels: tuple[int, ...]
    """Elements per parameter tensor (model parameter order)."""
    layer_params: tuple[tuple[int, ...], ...]
    """Parameter indices of each layer, forward order (ascending, contiguous)."""
    keys: tuple[Key, ...] = field(init=False)
    _memo: dict[Any, Any] = field(init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(assign_keys(self.numels, self.servers)))
        object.__setattr__(self, "_memo", {})

    def server_rank(self, s: int) -> int:
        return s if self.colocated else self.workers + s

    @property
    def world(self) -> int:
        return self.workers if self.colocated else self.workers + self.servers

    def is_worker(self, rank: int) -> bool:
        return rank < self.workers

    def server_of(self, rank: int) -> int | None:
        """The server index this rank runs, or None."""
        if self.colocated:
            return rank if rank < self.workers else None
        return rank - self.workers if rank >= self.workers else None

    def send_order(self, s: int) -> list[int]:
        """The workers server ``s`` sends each pull batch to, in order: ``s + 1, s + 2, ...`` (mod ``W``;
        its own worker last, and skipped). At any turn the servers then send to different workers, as the
        shift schedule of an all-to-all does, and every worker's link carries one server's slice at a time.
        In worker order (0, 1, ...), with three co-located workers, servers 1 and 2 both sent each batch
        to worker 0 first, sharing its link while worker 2's stood idle. Measured once that way (star:3 at
        50 Mbit/s, compute emulated, receives first): ``ibatch``'s three batches at 0.89 of the model,
        quartiles 122-151 ms; in the rotated order no plan measured below 0.98 of it (``docs/ps.md``)."""
        return [(s + j) % self.workers for j in range(1, self.workers + 1)]

    def shard_keys(self, s: int) -> list[Key]:
        if ("shard", s) not in self._memo:
            self._memo["shard", s] = [k for k in self.keys if k.server == s]
        return self._memo["shard", s]

    def message(self, layers: tuple[int, int], s: int) -> list[Key]:
        """Keys of server ``s`` for the layers ``first..last`` (inclusive), in shard order."""
        memo = ("msg", tuple(layers), s)
        if memo not in self._memo:
            first, last = layers
            params = {p for l in range(first, last + 1) for p in self.layer_params[l]}
            self._memo[memo] = [k for k in self.shard_keys(s) if k.tensor in params]
        return self._memo[memo]

    def shard_slice(self, layers: tuple[int, int], s: int) -> tuple[int, int]:
        """``[start, stop)`` of that message inside server ``s``'s shard (contiguous: layers are)."""
        memo = ("slice", tuple(layers), s)
        if memo not in self._memo:
            keys, off, first = self.message(layers, s), 0, 0
            for k in self.shard_keys(s):
                if keys and k == keys[0]:
                    first = off
                off += k.numel
            self._memo[memo] = (first, first + sum(k.numel for k in keys)) if keys else (0, 0)
        return self._memo[memo]


def lane(lanes: Any, src: int, dst: int) -> Any:
    """The process group of a message from ``src`` to ``dst``: ``lanes`` is ``(up, down[, asks])``
    (module docstring), or one group (or None, the default group) for both directions."""
    if isinstance(lanes, tuple):
        return lanes[0] if src < dst else lanes[1]
    return lanes


def ask_lane(lanes: Any, src: int, dst: int) -> Any:
    """The process group of a pull request: the third of ``lanes`` where given, so that a request never
    queues behind a batch going the same way on the same connection; else :func:`lane`."""
    return lanes[2] if isinstance(lanes, tuple) and len(lanes) > 2 else lane(lanes, src, dst)
