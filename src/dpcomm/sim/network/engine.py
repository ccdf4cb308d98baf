"""The flow model's event loop: a collective's steps, each a set of concurrent flows, priced on a fabric.

A step (:class:`dpcomm.collectives.schedule.Step`) starts when the previous one has ended. Its cost is
``alpha`` per message its busiest sender posts (per thread: a rank's ``k`` BML threads post in parallel),
then the time its flows take: all start together at max-min fair rates (:func:`.maxmin.maxmin_rates`); at
each completion the rates of the remaining flows are recomputed; the step ends with its last flow.
Completions within a relative ``0.1%`` of the next one are taken together (a ring chunk one element longer
than its neighbour's must not cost a second rate computation; the error is below 0.1% of a step).

Speed (symmetric collectives at 1,024+ servers): the rates of a set of flows are cached by the set's
``(src, dst)`` signature, and a whole step's time by ``(src, dst, bytes)``: a ring's ``2(P-1)`` steps, all
alike, cost one rate computation, and a step is routed only when its signature is new.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpcomm.collectives.schedule import Step
from dpcomm.sim.network.fabric import Fabric
from dpcomm.sim.network.maxmin import maxmin_rates

__all__ = ["FlowModel", "FlowRun"]

_TOGETHER = 1e-3  # completions within 0.1% of the next one end together
_CACHE_MAX = 4096  # entries per cache before it is emptied (a sweep's memory stays bounded)


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
        self._weights = np.array([g.fwd] * fabric.hops + [g.ack] * fabric.hops)
        self._rates: dict[tuple[bytes, bytes], np.ndarray] = {}
        self._steps: dict[tuple[bytes, ...], float] = {}
        self.rate_solves = 0
        """How many times max-min rates were computed (the rest came from the cache)."""

    def _links(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        fwd = self.fabric.routes(src, dst)
        rev = np.where(fwd >= 0, fwd ^ 1, -1)  # the ACKs go back over the same cables
        return np.concatenate([fwd, rev], axis=1)

    def rates(self, src: np.ndarray, dst: np.ndarray, links: np.ndarray | None = None) -> np.ndarray:
        """Max-min payload rates (bytes/s) of flows ``src[i] -> dst[i]`` running together (cached by the
        flows' signature); ``links``: their routes with reverse links, if already known."""
        key = (src.tobytes(), dst.tobytes())
        got = self._rates.get(key)
        if got is None:
            if len(self._rates) >= _CACHE_MAX:
                self._rates.clear()
            got = maxmin_rates(
                self.fabric.capacity, self._links(src, dst) if links is None else links, self._weights
            )
            self.rate_solves += 1
            self._rates[key] = got
        return got

    def flows_time(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> float:
        """Seconds until the last of these concurrent flows completes (no start-up)."""
        keep = (nbytes > 0) & (src != dst)
        src, dst = src[keep], dst[keep]
        left = nbytes[keep].astype(float)
        idx = np.arange(len(src))
        links = None
        t = 0.0
        while idx.size:
            s, d = src[idx], dst[idx]
            if links is None and (s.tobytes(), d.tobytes()) not in self._rates:
                links = self._links(src, dst)  # routed once per step, whatever the events
            r = self.rates(s, d, None if links is None else links[idx])
            need = left[idx] / r
            dt = float(need.min())
            done = need <= dt * (1 + _TOGETHER)
            t += dt
            left[idx] -= r * dt
            idx = idx[~done]
        return t

    def step_time(self, step: Step) -> float:
        """Seconds of one step: ``alpha`` x the busiest sender's messages, then its flows."""
        lane = step.lane if step.lane is not None else np.zeros(0, dtype=np.int64)
        key = (step.src.tobytes(), step.dst.tobytes(), step.nbytes.tobytes(), lane.tobytes())
        got = self._steps.get(key)
        if got is None:
            if len(self._steps) >= _CACHE_MAX:
                self._steps.clear()
            start = 0.0
            if self.alpha_s and len(step.src):
                who = step.src if step.lane is None else step.src * (int(step.lane.max()) + 1) + step.lane
                start = self.alpha_s * int(np.bincount(who).max())
            got = start + self.flows_time(step.src, step.dst, step.nbytes)
            self._steps[key] = got
        return got

    def link_bytes(self, steps: Sequence[Step]) -> np.ndarray:
        """Payload bytes each directed link carries over ``steps``."""
        out = np.zeros(self.fabric.links)
        for st in steps:
            routes = self.fabric.routes(st.src, st.dst)
            w = np.repeat(st.nbytes.astype(float)[:, None], routes.shape[1], axis=1)
            ok = routes >= 0
            out += np.bincount(routes[ok], weights=w[ok], minlength=self.fabric.links)
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
