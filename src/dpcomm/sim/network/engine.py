"""The flow model's event loop: a collective's steps, each a set of concurrent flows, priced on a fabric.

A step (:class:`dpcomm.collectives.schedule.Step`) starts when the previous one has ended. Its cost is
``alpha`` per message its busiest sender posts (per thread: a rank's ``k`` BML threads post in parallel),
then the time its flows take: all start together at max-min fair rates (:func:`.maxmin.maxmin_rates`); at
each completion the rates of the remaining flows are recomputed; the step ends with its last flow.
Completions within a relative ``0.1%`` of the next one are taken together (a ring chunk one element longer
than its neighbour's must not cost a second rate computation; the error is below 0.1% of a step).

Speed and memory (4,096 servers: every algorithm in seconds, well under 2 GB):

* Caches keyed by a digest of the arrays (BLAKE2b, 20 bytes), not by their bytes: the rates of a set of
  flows by its ``(src, dst)``, a whole step's time by ``(src, dst, bytes, lane)``. A ring's ``2(P-1)``
  steps, all alike, cost one rate computation, and a step is routed only when its signature is new. The
  rate cache holds at most :data:`_CACHE_FLOWS` flows' rates, the step cache :data:`_CACHE_MAX` entries.
* Routes of the ``(src, dst)`` pairs already seen are kept in a table (at most :data:`_TABLE_MAX` pairs), so
  LP's thousands of pipeline stages, which reuse the chain's ``2(P-1)`` pairs, are routed once.
* Max-min filling works on flat ``(flow, link, weight)`` entries (:func:`.maxmin.fill`); a step of more
  than :data:`_CHUNK_ENTRIES` entries (a parameter server's 16.8 M flows at 4,096 servers) is filled chunk
  by chunk, its routes recomputed per chunk, never held whole (:func:`.maxmin.fill_chunked`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpcomm.collectives.schedule import Step
from dpcomm.sim.network.fabric import Fabric
from dpcomm.sim.network.maxmin import fill, fill_chunked

__all__ = ["FlowModel", "FlowRun"]

_TOGETHER = 1e-3  # completions within 0.1% of the next one end together
_CACHE_MAX = 4096  # step-time entries before that cache is emptied
_CACHE_FLOWS = 1 << 25  # flows whose rates the rate cache holds (8 bytes each: 256 MiB) before it is emptied
_TABLE_MAX = 1 << 19  # routed (src, dst) pairs kept (int32 rows of 2 x hops: at most 48 MiB for BCube(2,12))
_CHUNK_ENTRIES = 1 << 22  # (flow, link) entries per chunk of a step too large to fill at once


def _hasher(*arrays: np.ndarray):
    """BLAKE2b (20 bytes) over the arrays' lengths and bytes: the caches' keys (a digest, not the bytes, so
    a cached 16.8 M-flow step costs 20 bytes of key)."""
    h = hashlib.blake2b(digest_size=20)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowRun:
    """The priced schedule: total time, each step's duration, and the bytes each link carried."""

    time_s: float
    step_s: tuple[float, ...]
    """Duration of each step, alpha included (seconds)."""
    labels: tuple[str, ...]
    link_bytes: np.ndarray | None
    """Payload bytes per directed link over the whole schedule (None unless asked for)."""


class FlowModel:
    """Prices steps on one :class:`Fabric` with per-message start-up ``alpha_s`` (seconds)."""

    def __init__(self, fabric: Fabric, alpha_s: float = 0.0):
        if not alpha_s >= 0:
            raise ValueError(f"alpha must be >= 0 s, got {alpha_s}")
        self.fabric, self.alpha_s = fabric, float(alpha_s)
        g = fabric.goodput
        weights = np.array([g.fwd] * fabric.hops + [g.ack] * fabric.hops)
        self._cols = np.flatnonzero(weights > 0)  # a link a flow loads with weight 0 is not its constraint
        self._wcol = weights[self._cols]
        self._rates_cache: dict[bytes, np.ndarray] = {}
        self._rate_flows = 0
        self._steps: dict[bytes, float] = {}
        self._pair_key = np.zeros(0, dtype=np.int64)  # sorted src * P + dst of the routed pairs
        self._pair_row = np.zeros((0, len(self._cols)), dtype=np.int32)  # their links (the used columns)
        self.rate_solves = 0
        """How many times max-min rates were computed (the rest came from the cache)."""

    # ------------------------------------------------------------------------------------------ routes

    def _route(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """``(F, C)`` links of each flow, forward then reverse (ACK) links, the columns of positive weight;
        negative where unused (``-1 ^ 1 = -2``: a pad stays a pad)."""
        fwd = self.fabric.routes(src, dst)
        out = np.empty((len(fwd), 2 * fwd.shape[1]), dtype=np.int32)
        out[:, : fwd.shape[1]] = fwd
        out[:, fwd.shape[1] :] = fwd ^ 1  # the ACKs go back over the same cables
        return out if len(self._cols) == out.shape[1] else out[:, self._cols]

    def _links(self, pair: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """:meth:`_route` through the table of pairs already routed (int32); ``pair`` is ``src * P + dst``."""
        if len(pair) > _TABLE_MAX or self.fabric.hops <= 2:  # a star's route is cheaper than the lookup
            return self._route(src, dst)
        table = self._pair_key
        pos = np.searchsorted(table, pair)
        if len(table):
            hit = table[np.minimum(pos, len(table) - 1)] == pair
        if not len(table) or not hit.all():
            new = np.unique(pair if not len(table) else pair[~hit])
            rows = self._route(new // self.fabric.servers, new % self.fabric.servers)
            if len(table) + len(new) > _TABLE_MAX:  # start over rather than grow without bound
                self._pair_key, self._pair_row = new, rows
            else:
                keys = np.concatenate([table, new])
                order = np.argsort(keys, kind="stable")
                self._pair_key, self._pair_row = keys[order], np.concatenate([self._pair_row, rows])[order]
            pos = np.searchsorted(self._pair_key, pair)
        return self._pair_row[pos]

    def _entries(self, links: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        use = links >= 0  # pads are negative
        flow_of, col = np.nonzero(use)
        return flow_of, links[use], self._wcol[col]

    # ------------------------------------------------------------------------------------------ rates

    def _per_chunk(self) -> int:
        return max(1, _CHUNK_ENTRIES // max(1, len(self._cols)))

    def _solve(self, pair: np.ndarray, src: np.ndarray, dst: np.ndarray, links=None) -> np.ndarray:
        f_count, cap, per = len(src), self.fabric.capacity, self._per_chunk()
        if f_count <= per:
            links = self._links(pair, src, dst) if links is None else links()
            return fill(cap, *self._entries(links), f_count)
        chunks = [(i, min(i + per, f_count)) for i in range(0, f_count, per)]
        return fill_chunked(
            cap, f_count, chunks, lambda i0, i1: self._entries(self._route(src[i0:i1], dst[i0:i1]))
        )

    def _rates(
        self, key: bytes, pair: np.ndarray, src: np.ndarray, dst: np.ndarray, links=None
    ) -> np.ndarray:
        """Rates by cache key; ``links``: a callable giving the flows' links, if the caller holds them."""
        got = self._rates_cache.get(key)
        if got is None:
            got = self._solve(pair, src, dst, links)
            self.rate_solves += 1
            if self._rate_flows + len(got) > _CACHE_FLOWS:  # empty it; a step larger than it still fits
                self._rates_cache.clear()
                self._rate_flows = 0
            self._rates_cache[key] = got
            self._rate_flows += len(got)
        return got

    def rates(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Max-min payload rates (bytes/s) of flows ``src[i] -> dst[i]`` running together (cached by the
        flows' signature)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        pair = src * self.fabric.servers + dst
        return self._rates(_hasher(pair).digest(), pair, src, dst)

    def flows_time(
        self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, *, _key: bytes | None = None
    ) -> float:
        """Seconds until the last of these concurrent flows completes (no start-up)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        keep = (nbytes > 0) & (src != dst)
        if not keep.all():  # a copy only when some flow is dropped
            src, dst, nbytes, _key = src[keep], dst[keep], nbytes[keep], None
        if not len(src):
            return 0.0
        pair = src * self.fabric.servers + dst
        left = nbytes.astype(float)
        idx = None  # None: every flow still running (no index arrays for a step's millions of flows)
        held: list[np.ndarray] = []  # the step's links, routed once whatever the events (small steps)

        def links(sub: np.ndarray | None = None):
            if not held:
                held.append(self._links(pair, src, dst))
            return held[0] if sub is None else held[0][sub]

        small = len(src) <= self._per_chunk()
        t = 0.0
        while idx is None or idx.size:
            if idx is None:
                r = self._rates(_key or _hasher(pair).digest(), pair, src, dst, links if small else None)
                need = left / r
            else:
                p, sub = pair[idx], idx
                r = self._rates(
                    _hasher(p).digest(),
                    p,
                    src[idx],
                    dst[idx],
                    (lambda sub=sub: links(sub)) if small else None,
                )
                need = left[idx] / r
            dt = float(need.min())
            done = need <= dt * (1 + _TOGETHER)
            t += dt
            if idx is None:
                left -= r * dt
                idx = np.flatnonzero(~done)
            else:
                left[idx] -= r * dt
                idx = idx[~done]
        return t

    def step_time(self, step: Step) -> float:
        """Seconds of one step: ``alpha`` x the busiest sender's messages, then its flows."""
        pair = step.src * self.fabric.servers + step.dst
        h = _hasher(pair)
        rates_key = h.copy().digest()  # the flows' signature, as :meth:`rates` keys it
        lane = step.lane if step.lane is not None else np.zeros(0, dtype=np.int64)
        h.update(b"|")
        for a in (step.nbytes, lane):
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(memoryview(np.ascontiguousarray(a)).cast("B"))
        key = h.digest()
        got = self._steps.get(key)
        if got is None:
            if len(self._steps) >= _CACHE_MAX:
                self._steps.clear()
            start = 0.0
            if self.alpha_s and len(step.src):
                who = step.src if step.lane is None else step.src * (int(step.lane.max()) + 1) + step.lane
                start = self.alpha_s * int(np.bincount(who).max())
            got = start + self.flows_time(step.src, step.dst, step.nbytes, _key=rates_key)
            self._steps[key] = got
        return got

    def link_bytes(self, steps: Sequence[Step]) -> np.ndarray:
        """Payload bytes each directed link carries over ``steps`` (routed in chunks)."""
        out = np.zeros(self.fabric.links)
        per = max(1, _CHUNK_ENTRIES // max(1, self.fabric.hops))
        for st in steps:
            for i in range(0, len(st.src), per):
                routes = self.fabric.routes(st.src[i : i + per], st.dst[i : i + per])
                ok = routes >= 0
                w = np.broadcast_to(st.nbytes[i : i + per, None].astype(float), routes.shape)[ok]
                out += np.bincount(routes[ok], weights=w, minlength=self.fabric.links)
        return out

    def run(self, steps: Sequence[Step], *, links: bool = False) -> FlowRun:
        """Price a whole schedule (steps one after the other)."""
        times = tuple(self.step_time(st) for st in steps)
        return FlowRun(
            time_s=float(sum(times)),
            step_s=times,
            labels=tuple(st.label for st in steps),
            link_bytes=self.link_bytes(steps) if links else None,
        )
