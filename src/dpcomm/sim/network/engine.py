"""The flow model's event loop: a collective's steps, each a set of concurrent flows, priced on a fabric.

A step (:class:`dpcomm.collectives.schedule.Step`) starts when the previous one has ended. Its cost is
``alpha`` per message its busiest sender posts (per thread: a rank's ``k`` BML threads post in parallel),
then the time its flows take: all start together at max-min fair rates (:func:`.maxmin.maxmin_rates`); at
each completion the rates of the remaining flows are recomputed; the step ends with its last flow.
Completions within a relative ``0.1%`` of the next one are taken together (a ring chunk one element longer
than its neighbour's must not cost a second rate computation; the error is below 0.1% of a step).

One module, though long (~600 lines): the caches, the batched pricing and the kept-rate shortcut below all
share one numbering of a step's links and one completion loop, and splitting them would pass those
internals between modules; the solver itself is :mod:`.maxmin`.

Speed and memory (4,096 servers: every algorithm in a few seconds, under 2 GB):

* Caches keyed by a digest of the arrays (SHA-256), not by their bytes: the rates of a set of
  flows by its ``(src, dst)``, a whole step's time by ``(src, dst, bytes, lane)``. A ring's ``2(P-1)``
  steps, all alike, cost one rate computation. On a star, leaf-spine or fat-tree a step is keyed moved
  down by whole periods of servers (:mod:`.symmetry`: the same problem, the same times bit for bit), so
  LP's sliding stages are priced once. The rate cache holds at most :data:`_CACHE_FLOWS` flows'
  rates, the step cache :data:`_CACHE_MAX` entries.
* Steps are priced many at once (:meth:`FlowModel.step_times`): up to :data:`_BATCH_FLOWS` flows of
  distinct steps are filled together as independent problems (:func:`.maxmin.fill_paired`: each its own
  rounds, so each step's rates are those of filling it alone, bit for bit), and their completions advance
  together, so LP's ~11,000 pipeline stages cost a few dozen numpy passes, not ~22,000 separate solves.
* A flow is held by its forward links only (its ACK links are their reverses, ``l ^ 1``, which each step's
  numbering keeps: a link and its reverse are numbered ``2j, 2j + 1``): half the entries to number, fill,
  and check for bottlenecks after each completion. A link's load still adds its flows' weights one flow
  after the other, so the rates are those of the plain entries bit for bit. After a completion only the
  steps still running are looked at, and only the flows whose bottleneck a departed flow crossed.
* After a completion the remaining flows keep their rates, without a new filling, where that is exact:
  when every one of them still has a bottleneck, a link that froze it and that no departed flow crossed
  (that link's flows and load are unchanged, so it is still full and the flow's rate still its highest;
  a rate vector in which every flow has such a link is the max-min fair one, Bertsekas & Gallager sec.
  6.5.2). A step where some flow lost all its bottlenecks is filled again. The two agree to the filling's
  own tie tolerance (1e-9), which ``tests/test_netsim.py`` checks against filling after every completion.
* Routes of the ``(src, dst)`` pairs already seen are kept as a table of their links (at most
  :data:`_TABLE_MAX` pairs, found through a dense ``src * P + dst`` index where ``P^2`` is small), so
  LP's stages, which reuse the chain's ``2(P-1)`` pairs, are routed once.
* A step of more than :data:`_CHUNK_ENTRIES` entries (a parameter server's 16.8 M flows at 4,096 servers)
  is filled on its forward links only, in chunks, held as 16-bit link ids where they fit in
  :data:`_HOLD_BYTES` (else recomputed per round): a flow's ACK links are its forward links ``^ 1``, so a
  link's load is ``fwd x count(l) + ack x count(l ^ 1)``.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network.fabric import Fabric
from dpcomm.sim.network.maxmin import _TIE, fill_paired
from dpcomm.sim.network.symmetry import hasher as _hasher
from dpcomm.sim.network.symmetry import shift_period, step_digests

__all__ = ["THREADS", "FlowModel", "FlowRun"]

_TOGETHER = 1e-3  # completions within 0.1% of the next one end together
_CACHE_MAX = 4096  # step-time entries before that cache is emptied
_CACHE_FLOWS = 1 << 25  # flows whose rates the rate cache holds (8 bytes each: 256 MiB) before it is emptied
_TABLE_MAX = 1 << 19  # routed (src, dst) pairs kept (int32 links, at most 12 a pair: <= 50 MiB with weights)
_DENSE_MAX = 1 << 25  # a dense src * P + dst -> table row index where P^2 <= this (int32: <= 128 MiB)
_CHUNK_ENTRIES = 1 << 22  # (flow, link) entries per chunk of a step too large to fill at once
_BATCH_FLOWS = 1 << 17  # flows of the steps priced together (a few hundred bytes each while they are)
_BATCH_LINKS = 1 << 23  # steps x links of a batch (the dense index that numbers each step's links)
_HOLD_BYTES = 1 << 29  # a large step's forward links kept between rounds up to this size (512 MiB)
THREADS = max(1, min(2, os.cpu_count() or 1, int(os.environ.get("DPCOMM_NETSIM_THREADS", "1") or 1)))
"""Threads that price batches of steps (``$DPCOMM_NETSIM_THREADS``, default 1, at most 2 and the cores):
the same results on any count. Not on by default: on the 2-core VM with one core busy elsewhere, LP at
4,096 servers took 8.3 s wall and 5.8 CPU s on 2 threads against 5.9 and 5.0 on one (numpy holds the GIL
in enough of each batch that the threads mostly wait); ``benchmarks/netsim_endtoend.py`` compares them."""


def _segments(owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the runs of equal values in a sorted ``owner``."""
    starts = np.flatnonzero(np.diff(owner, prepend=-1))
    return starts, np.diff(np.append(starts, len(owner)))


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowRun:
    """The priced schedule: total time, each step's duration, and the bytes each link carried."""

    time_s: float
    step_s: tuple[float, ...]
    """Duration of each step, alpha included (seconds)."""
    labels: tuple[str, ...]
    link_bytes: np.ndarray | None
    """Payload bytes per directed link over the whole schedule (None unless asked for)."""


@dataclass(slots=True)
class _Flows:
    """Flows of one or more steps, concatenated: ``starts[i]`` is where step ``i``'s begin."""

    src: np.ndarray
    dst: np.ndarray
    pair: np.ndarray
    left: np.ndarray
    """Payload bytes still to send (float)."""
    starts: np.ndarray


class FlowModel:
    """Prices steps on one :class:`Fabric` with per-message start-up ``alpha_s`` (seconds)."""

    def __init__(
        self, fabric: Fabric, alpha_s: float = 0.0, *, alpha_inter_s: float | None = None, nccl: bool = False
    ):
        if not alpha_s >= 0 or not (alpha_inter_s is None or alpha_inter_s >= 0):
            raise ValueError(f"alpha must be >= 0 s, got {alpha_s}, {alpha_inter_s}")
        self.fabric, self.alpha_s = fabric, float(alpha_s)
        self.alpha_inter_s = alpha_inter_s
        """Start-up of a message between two servers of a multi-GPU fabric (None: ``alpha_s``, as any)."""
        self.nccl = nccl
        """The ``nccl-*`` schedules take NCCL's own latency for their algorithm and protocol
        (:mod:`.nccl_tuning`) instead of ``alpha`` per message (the fabric's default start-up)."""
        g = fabric.goodput
        self._fwd, self._ack = g.fwd, g.ack  # wire bytes per payload byte on its links, on their reverses
        self._rates_cache: dict[bytes, np.ndarray] = {}
        self._rate_flows = 0
        self._steps: dict[object, float] = {}
        self._held: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # the arrays of rates keyed by identity
        self._lock = threading.Lock()
        self._reset_table()
        self._period = shift_period(fabric)
        self.rate_solves = 0
        """How many max-min problems were filled (the rest came from the cache or kept their rates)."""

    # ------------------------------------------------------------------------------------------ routes

    def _reset_table(self) -> None:
        """The table of routed pairs: row ``i`` holds the forward links ``_row_link[_row_ptr[i]:_row_ptr[i +
        1]]``, found by ``_dense[pair]`` or by ``_pair_key`` (sorted) and ``_key_row``."""
        p = self.fabric.endpoints
        self._dense = None if p * p > _DENSE_MAX or self.fabric.hops <= 2 else np.zeros(0, dtype=np.int32)
        self._pair_key = np.zeros(0, dtype=np.int64)
        self._key_row = np.zeros(0, dtype=np.int64)
        self._row_ptr = np.zeros(1, dtype=np.int64)
        self._row_link = np.zeros(0, dtype=np.int32)

    def _find(self, pair: np.ndarray) -> np.ndarray:
        """Table rows of ``pair`` (-1 where not routed yet)."""
        if self._dense is not None:
            if not len(self._dense):  # made on first use: a model that never routes a batch needs none
                p = self.fabric.endpoints
                self._dense = np.full(p * p, -1, dtype=np.int32)
            return self._dense[pair]
        table = self._pair_key
        if not len(table):
            return np.full(len(pair), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(table, pair), len(table) - 1)
        return np.where(table[pos] == pair, self._key_row[pos], -1)

    def _add_rows(self, new: np.ndarray) -> None:
        """Route the pairs ``new`` (distinct, not in the table) and append them as rows."""
        p = self.fabric.endpoints
        links = self.fabric.routes(new // p, new % p)
        use = links >= 0
        n_rows = len(self._row_ptr) - 1
        rows = np.arange(n_rows, n_rows + len(new))
        self._row_ptr = np.concatenate([self._row_ptr, self._row_ptr[-1] + np.cumsum(use.sum(axis=1))])
        self._row_link = np.concatenate([self._row_link, links[use].astype(np.int32)])
        if self._dense is not None:
            self._dense[new] = rows
        else:
            keys = np.concatenate([self._pair_key, new])
            order = np.argsort(keys, kind="stable")
            self._pair_key, self._key_row = keys[order], np.concatenate([self._key_row, rows])[order]

    def _entries(
        self, pair: np.ndarray, src: np.ndarray, dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(flow, link, count)``: every (flow, forward link) pair, flow by flow, each flow's links in route
        order (the entries :func:`.maxmin.fill_paired` takes; the reverse links are ``link ^ 1``), and how
        many links each flow has. Thread-safe: the route table changes under the model's lock."""
        if self._dense is None and (self.fabric.hops <= 2 or len(pair) > _TABLE_MAX):
            links = self.fabric.routes(src, dst)  # a star's route is cheaper than the lookup
            if links.min(initial=0) >= 0:  # no pads: every flow has every column
                f = np.repeat(np.arange(len(src)), links.shape[1])
                return f, links.ravel(), np.full(len(src), links.shape[1])
            use = links >= 0
            return np.nonzero(use)[0], links[use], use.sum(axis=1)
        with self._lock:
            row = self._find(pair)
            miss = row < 0
            if miss.any():
                new = np.unique(pair[miss])
                if len(self._row_ptr) - 1 + len(new) > _TABLE_MAX:  # start over, not grow without bound
                    self._reset_table()
                    self._find(new)
                self._add_rows(new)
                row = self._find(pair)
            ptr, row_link = self._row_ptr, self._row_link
        count = ptr[row + 1] - ptr[row]
        f = np.repeat(np.arange(len(pair)), count)
        first = np.cumsum(count) - count  # where each flow's entries begin in the output
        at = np.arange(len(f)) + np.repeat(ptr[row] - first, count)
        return f, row_link[at], count

    # ------------------------------------------------------------------------------------------ rates

    def _per_chunk(self) -> int:
        """Most flows of a step filled at once: :data:`_CHUNK_ENTRIES` (flow, link) entries, ACK links
        counted."""
        return max(1, _CHUNK_ENTRIES // (self.fabric.hops * (2 if self._ack > 0 else 1)))

    def _solve(self, pair: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        if len(src) <= self._per_chunk():
            flow_of, link, _ = self._entries(pair, src, dst)
            one = np.zeros(len(src), dtype=np.int64)
            cap = self.fabric.capacity
            return fill_paired(cap, one[:1], flow_of, link, one, self._fwd, self._ack)[0]
        return self._fill_large(src, dst)

    def _fill_large(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """:func:`.maxmin.fill` of a step too large for its entries, on forward links only: a flow's ACK
        links are its forward links ``^ 1``, so a link's load is ``fwd * n(l) + ack * n(l ^ 1)`` with
        ``n`` the count of forward entries (the same rates up to rounding, 1e-15). Routes are computed
        chunk by chunk and kept as (16-bit where the links fit) ids + 1 (0: no link) within
        :data:`_HOLD_BYTES`, else recomputed each round."""
        fab, g = self.fabric, self.fabric.goodput
        n_links, f_count = fab.links, len(src)
        per = max(1, _CHUNK_ENTRIES // fab.hops)
        chunks = [(i, min(i + per, f_count)) for i in range(0, f_count, per)]
        kind = np.int16 if n_links < np.iinfo(np.int16).max else np.int32
        hold = f_count * fab.hops * np.dtype(kind).itemsize <= _HOLD_BYTES
        held: dict[int, np.ndarray] = {}

        def rows(i0: int, i1: int) -> np.ndarray:
            got = held.get(i0)
            if got is None:
                got = (fab.routes(src[i0:i1], dst[i0:i1]) + 1).astype(kind)
                if hold:
                    held[i0] = got
            return got

        mirror = np.arange(n_links) ^ 1
        rate = np.full(f_count, np.inf)
        active = np.ones(f_count, dtype=bool)
        left = np.array(fab.capacity, dtype=float)
        level = 0.0
        while True:
            count = np.zeros(n_links + 1, dtype=np.int64)
            for i0, i1 in chunks:
                act = active[i0:i1]
                if act.any():
                    r = rows(i0, i1)
                    count += np.bincount((r if act.all() else r[act]).ravel(), minlength=n_links + 1)
            n = count[1:].astype(float)
            load = g.fwd * n + g.ack * n[mirror] if g.ack > 0 else g.fwd * n
            loaded = load > 0
            if not loaded.any():
                return rate
            share = np.full(n_links, np.inf)
            np.divide(left, load, out=share, where=loaded)
            d = max(float(share.min()), 0.0)
            level += d
            full = loaded & (share <= d * (1 + _TIE))
            if not (loaded & ~full).any():  # every loaded link full: every growing flow freezes here
                rate[active] = level
                return rate
            left -= d * load
            left[full] = 0.0
            hit = np.concatenate([[False], full | full[mirror] if g.ack > 0 else full])
            for i0, i1 in chunks:
                act = active[i0:i1]
                if not act.any():
                    continue
                r = rows(i0, i1)
                frozen = hit[r[:, 0]]  # the sender's uplink first: often it decides alone
                if not frozen.all():
                    frozen |= hit[r[:, 1:]].any(axis=1)
                frozen &= act
                rate[i0:i1][frozen] = level
                act[frozen] = False
            if not active.any():
                return rate

    def _rates(self, key: bytes, pair: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Rates by cache key."""
        got = self._rates_cache.get(key)
        if got is None:
            got = self._solve(pair, src, dst)
            self.rate_solves += 1
            self._remember(key, got)
        return got

    def _remember(self, key: bytes, rates: np.ndarray) -> None:
        if self._rate_flows + len(rates) > _CACHE_FLOWS:  # empty it; a step larger than it still fits
            self._rates_cache.clear()
            self._held = {k: v for k, v in self._held.items() if k == key}
            self._rate_flows = 0
        self._rates_cache[key] = rates
        self._rate_flows += len(rates)

    def rates(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Max-min payload rates (bytes/s) of flows ``src[i] -> dst[i]`` running together (cached by the
        flows' signature)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        pair = src * self.fabric.endpoints + dst
        return self._rates(_hasher(pair).digest(), pair, src, dst)

    # ------------------------------------------------------------------------------------------ times

    def _waves(self, fl: _Flows) -> tuple[np.ndarray, np.ndarray, int]:
        """Seconds of each step of ``fl`` (each to its last completion), every flow's first rates, and how
        many problems were filled (it changes nothing of the model but the route table, under its lock, so
        batches run on threads).

        All steps are filled together (:func:`.maxmin.fill_paired`, each step its own problem with its own
        links, a flow's entries on its forward links only); then, wave after wave, each step advances to
        its next completion; a step whose remaining flows all keep a bottleneck that no departed flow
        crossed keeps their rates, the others are filled again (from the entries already built)."""
        fab, fwd, ack = self.fabric, self._fwd, self._ack
        n, f_count, n_links = len(fl.starts) - 1, len(fl.src), fab.links
        step = np.repeat(np.arange(n), np.diff(fl.starts))
        flow_of, link, count = self._entries(fl.pair, fl.src, fl.dst)
        key = step[flow_of] * n_links + link  # each step numbers its own links (a link's reverse: key ^ 1)
        if n * n_links <= _BATCH_LINKS:
            used = np.zeros(n * n_links, dtype=bool)
            used[key] = True
            if ack > 0:  # the reverse links carry the ACKs
                used[key ^ 1] = True
            lkey = np.flatnonzero(used)
            number = np.empty(n * n_links, dtype=np.int32)
            number[lkey] = np.arange(len(lkey), dtype=np.int32)
            cid = number[key]
        else:
            both = np.concatenate([key, key ^ 1]) if ack > 0 else key
            lkey, inv = np.unique(both, return_inverse=True)
            cid = inv[: len(key)]
        lstart = np.searchsorted(lkey, np.arange(n) * n_links)
        cap = fab.capacity[lkey & (n_links - 1) if n_links & (n_links - 1) == 0 else lkey % n_links]
        # the numbered links are closed under ^ 1 and sorted: a link and its reverse stay a pair 2j, 2j + 1
        rate, froze, full_at = fill_paired(cap, lstart, flow_of, cid, step, fwd, ack)
        solves = n
        first = rate.copy()
        valid = None  # per entry: its link, or its reverse, is one of the flow's bottlenecks (after wave 1)
        eptr = np.zeros(f_count + 1, dtype=np.int64)  # flow f's entries: eptr[f]..eptr[f+1]-1
        np.cumsum(count, out=eptr[1:])
        t = np.zeros(n)
        left = fl.left
        alive = np.arange(f_count)
        running = np.ones(f_count, dtype=bool)
        touched = np.zeros(len(cap), dtype=bool)
        busy = np.zeros(n, dtype=bool)
        every = slice(None)  # the first wave: every flow runs (no index arrays)
        while True:
            sel = every if len(alive) == f_count else alive
            need = left[sel] / rate[sel]
            at, size = (fl.starts[:-1], np.diff(fl.starts)) if sel is every else _segments(step[alive])
            dt = np.minimum.reduceat(need, at)
            dt_f = np.repeat(dt, size)
            done = need <= dt_f * (1 + _TOGETHER)
            t[step[alive[at]]] += dt
            left[sel] -= rate[sel] * dt_f
            gone = alive[done]
            alive = alive[~done]
            if not alive.size:
                return t, first, solves
            running[gone] = False
            if valid is None:  # not needed where every step ends in one wave (LP's stages)
                fz = froze[flow_of]
                valid = full_at[cid] == fz
                if ack > 0:
                    valid |= full_at[cid ^ 1] == fz
            # links a departed flow crossed, forward or ACK, in a step still running: no longer a
            # bottleneck of anyone (gone's entries, by offsets); a link and its reverse are touched
            # together, so an entry's flag covers both its links
            busy[:] = False
            busy[step[alive]] = True
            gone = gone[busy[step[gone]]]
            cnt = count[gone]
            at_e = np.arange(cnt.sum()) + np.repeat(eptr[gone] - (np.cumsum(cnt) - cnt), cnt)
            touched[:] = False
            touched[cid[at_e]] = True
            if ack > 0:
                touched[cid[at_e] ^ 1] = True
            # a flow that had a bottleneck after the last wave keeps one unless an entry of it was touched
            lost_e = valid & touched[cid]
            valid &= ~lost_e
            chk = flow_of[lost_e]
            chk = np.unique(chk[running[chk]])
            cnt = count[chk]
            first_e = np.cumsum(cnt) - cnt
            at_e = np.arange(cnt.sum()) + np.repeat(eptr[chk] - first_e, cnt)
            held = np.logical_or.reduceat(valid[at_e], first_e) if len(chk) else np.ones(0, dtype=bool)
            lost = np.zeros(n, dtype=bool)  # steps with a flow that lost every bottleneck: fill again
            lost[step[chk[~held]]] = True
            if lost.any():  # those steps alone, on their own links
                again = lost[step[flow_of]] & running[flow_of]
                ls = np.flatnonzero(lost)
                size = np.append(lstart[1:], len(cap))[ls] - lstart[ls]
                sub_start = np.cumsum(size) - size
                shift = np.zeros(n, dtype=np.int64)
                shift[ls] = lstart[ls] - sub_start
                sub_link = np.arange(size.sum()) + np.repeat(shift[ls], size)
                rank = np.zeros(n, dtype=np.int64)
                rank[ls] = np.arange(len(ls))
                f_again = flow_of[again]
                sub_cid = cid[again] - shift[step[f_again]]
                r2, f2, a2 = fill_paired(cap[sub_link], sub_start, f_again, sub_cid, rank[step], fwd, ack)
                solves += len(ls)
                redo = alive[lost[step[alive]]]
                rate[redo] = r2[redo]
                ok = a2[sub_cid] == f2[f_again]
                if ack > 0:
                    ok |= a2[sub_cid ^ 1] == f2[f_again]
                valid[again] = ok

    def _times(self, items: list[tuple[np.ndarray, np.ndarray, np.ndarray, bytes | None]]) -> list[float]:
        """Seconds until the last flow of each item ``(src, dst, nbytes, rates key)`` completes (no
        start-up); the flows of an item run together, items are independent."""
        p = self.fabric.endpoints
        out = [0.0] * len(items)
        small: list[int] = []
        flows: list[tuple] = []  # (src, dst, bytes, key): no per-flow copies until a batch is priced
        for i, (src, dst, nbytes, key) in enumerate(items):
            src = np.asarray(src, dtype=np.int64)
            dst = np.asarray(dst, dtype=np.int64)
            keep = (nbytes > 0) & (src != dst)
            if not keep.all():  # a copy only when some flow is dropped
                src, dst, nbytes, key = src[keep], dst[keep], nbytes[keep], None
            flows.append((src, dst, nbytes, key))
            if len(src) > self._per_chunk():
                out[i] = self._large_time(src, dst, src * p + dst, nbytes.astype(float), key)
            elif len(src):
                small.append(i)
        # each distinct flow set not in the cache is filled once, many together; the rest use its rates
        batch: list[int] = []
        fresh: dict[bytes, int] = {}
        reuse: list[int] = []
        for i in small:
            src, dst, nbytes, key = flows[i]
            key = key or _hasher(src * p + dst).digest()
            flows[i] = (src, dst, nbytes, key)
            if key in self._rates_cache or key in fresh:
                reuse.append(i)
            else:
                fresh[key] = i
                batch.append(i)
        parts = self._parts(batch, [len(flows[i][0]) for i in batch])
        made = (self._concat([flows[i][:3] for i in part], p) for part in parts)
        for part, (fl, (t, first)) in zip(parts, self._priced(made), strict=True):
            for j, i in enumerate(part):
                out[i] = float(t[j])
                self._remember(flows[i][3], first[fl.starts[j] : fl.starts[j + 1]])
        rest: list[tuple[int, tuple]] = []
        for i in reuse:
            src, dst, nbytes, key = flows[i]
            r = self._rates_cache.get(key)
            if r is None:  # emptied since (the cache holds a bounded number of flows)
                r = self._rates(key, src * p + dst, src, dst)
            left = nbytes.astype(float)
            need = left / r
            dt = float(need.min())
            out[i] = dt
            done = need <= dt * (1 + _TOGETHER)
            if not done.all():
                left = left - r * dt
                rest.append((i, (src[~done], dst[~done], left[~done])))
        parts = self._parts(list(range(len(rest))), [len(x[1][0]) for x in rest])
        made = (self._concat([rest[j][1] for j in part], p) for part in parts)
        for part, (_, (t, _)) in zip(parts, self._priced(made), strict=True):
            for j, tj in zip(part, t, strict=True):
                out[rest[j][0]] += float(tj)
        return out

    def _priced(self, batches: Iterator[_Flows]) -> Iterator[tuple[_Flows, tuple[np.ndarray, np.ndarray]]]:
        """``(batch, (seconds per step, first rates))`` of each batch, in order: :meth:`_waves` on up to
        :data:`THREADS` threads (numpy releases the GIL in its loops; each batch is an independent problem,
        so the results are those of pricing them one by one, bit for bit), at most ``2 x THREADS`` batches
        held at once."""
        if THREADS < 2:
            for fl in batches:
                t, first, solves = self._waves(fl)
                self.rate_solves += solves
                yield fl, (t, first)
            return
        pending: deque = deque()
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            for fl in batches:
                pending.append((fl, pool.submit(self._waves, fl)))
                while len(pending) > 2 * THREADS or (pending and pending[0][1].done()):
                    fl0, fut = pending.popleft()
                    t, first, solves = fut.result()
                    self.rate_solves += solves
                    yield fl0, (t, first)
            while pending:
                fl0, fut = pending.popleft()
                t, first, solves = fut.result()
                self.rate_solves += solves
                yield fl0, (t, first)

    def _parts(self, idx: list[int], sizes: list[int]) -> list[list[int]]:
        """``idx`` cut into runs of at most :data:`_BATCH_FLOWS` flows (a larger item alone)."""
        out: list[list[int]] = []
        cur: list[int] = []
        total = 0
        for i, n in zip(idx, sizes, strict=True):
            if cur and (total + n > _BATCH_FLOWS or (len(cur) + 1) * self.fabric.links > _BATCH_LINKS):
                out.append(cur)
                cur, total = [], 0
            cur.append(i)
            total += n
        return [*out, cur] if cur else out

    @staticmethod
    def _concat(parts: list[tuple], p: int) -> _Flows:
        """Flows ``(src, dst, bytes)`` of several steps as one :class:`_Flows` (``p``: servers)."""
        src = np.concatenate([x[0] for x in parts])
        dst = np.concatenate([x[1] for x in parts])
        return _Flows(
            src=src,
            dst=dst,
            pair=src * p + dst,
            left=np.concatenate([x[2] for x in parts]).astype(float),
            starts=np.concatenate([[0], np.cumsum([len(x[0]) for x in parts])]).astype(np.int64),
        )

    def _large_time(
        self, src: np.ndarray, dst: np.ndarray, pair: np.ndarray, left: np.ndarray, key: bytes | None
    ) -> float:
        """Seconds of a step too large to batch: rates filled again after each completion (rarely more
        than once: a parameter server's shards differ by at most an element)."""
        idx = None  # None: every flow still running (no index arrays for a step's millions of flows)
        t = 0.0
        while idx is None or idx.size:
            if idx is None:
                r = self._rates(key or _hasher(pair).digest(), pair, src, dst)
                need = left / r
            else:
                p = pair[idx]
                r = self._rates(_hasher(p).digest(), p, src[idx], dst[idx])
                need = left[idx] / r
            dt = float(need.min())
            done = need <= dt * (1 + _TOGETHER)
            t += dt
            if idx is None:
                left = left - r * dt
                idx = np.flatnonzero(~done)
            else:
                left[idx] -= r * dt
                idx = idx[~done]
        return t

    def flows_time(
        self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, *, _key: bytes | None = None
    ) -> float:
        """Seconds until the last of these concurrent flows completes (no start-up)."""
        return self._times([(src, dst, np.asarray(nbytes), _key)])[0]

    def _step_key(self, step: Step) -> tuple[bytes | None, bytes]:
        """``(step key, rates key)``: digests of ``(src, dst, bytes, lane)`` and of ``(src, dst)``, a step
        moved down by whole periods of the fabric first (:func:`.symmetry.shift_period`). A step
        too large to batch (a parameter server's millions of flows) is not hashed (that took longer than
        pricing it): no step key, and its rates keyed by its ``src`` and ``dst`` arrays themselves (held
        with the rates, so a parameter server's pull reuses its push's rates)."""
        if len(step.src) > self._per_chunk():
            ident = b"id:%d:%d" % (id(step.src), id(step.dst))
            self._held[ident] = (step.src, step.dst)
            return None, ident
        return step_digests(step, self.fabric.endpoints, self._period)

    def _step_keys(self, steps: Sequence[Step]) -> list[tuple[bytes | None, bytes]]:
        """:meth:`_step_key` of each step, hashed on :data:`THREADS` threads where there are many (SHA-256
        releases the GIL)."""
        if THREADS < 2 or len(steps) < 256:
            return [self._step_key(st) for st in steps]
        per = -(-len(steps) // THREADS)
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            parts = pool.map(
                lambda i: [self._step_key(st) for st in steps[i : i + per]], range(0, len(steps), per)
            )
            return [k for part in parts for k in part]

    def _start(self, step: Step) -> float:
        """``alpha`` x the most messages one sender (one thread of it) posts in the step; on a multi-GPU
        fabric with ``alpha_inter_s``, a message between servers costs that instead, and the busiest sender
        is the one whose messages' start-ups add up to most."""
        inter = self.alpha_inter_s
        if (not self.alpha_s and not inter) or not len(step.src):
            return 0.0
        who = step.src if step.lane is None else step.src * (int(step.lane.max()) + 1) + step.lane
        gpus = getattr(self.fabric.topology, "gpus", None)
        if inter is None or gpus is None:
            return self.alpha_s * int(np.bincount(who).max())
        ranks = self.fabric.servers  # switch endpoints (>= ranks) count as across servers
        cross = (step.src // gpus != step.dst // gpus) | (step.src >= ranks) | (step.dst >= ranks)
        return float(np.bincount(who, weights=np.where(cross, inter, self.alpha_s)).max())

    def step_times(self, steps: Sequence[Step], *, start: bool = True) -> list[float]:
        """Seconds of each step: ``alpha`` x the busiest sender's messages (unless ``start`` is False: a
        schedule whose start-up is priced elsewhere), then its flows (steps not priced before are priced
        together)."""
        keys: list[tuple[object, bytes]] = []
        for i, (key, rates_key) in enumerate(self._step_keys(steps)):
            if key is not None and not start:
                key += b"-"
            keys.append((key if key is not None else ("uncached", i), rates_key))
        todo: dict[object, int] = {}
        for i, (key, _) in enumerate(keys):
            if key not in self._steps and key not in todo:
                todo[key] = i
        new = list(todo.values())
        flows = self._times([(steps[i].src, steps[i].dst, steps[i].nbytes, keys[i][1]) for i in new])
        got = {
            keys[i][0]: (self._start(steps[i]) if start else 0.0) + t for i, t in zip(new, flows, strict=True)
        }
        out = [got[k] if k in got else self._steps[k] for k, _ in keys]
        for k, t in got.items():
            if not isinstance(k, bytes):
                continue
            if len(self._steps) >= _CACHE_MAX:
                self._steps.clear()
            self._steps[k] = t
        return out

    def step_time(self, step: Step) -> float:
        """Seconds of one step: ``alpha`` x the busiest sender's messages, then its flows."""
        return self.step_times([step])[0]

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

    def run(self, steps: Sequence[Step], *, links: bool = False, start: bool = True) -> FlowRun:
        """Price a whole schedule (steps one after the other; ``start``: with their start-ups)."""
        times = tuple(self.step_times(steps, start=start))
        return FlowRun(
            time_s=float(sum(times)),
            step_s=times,
            labels=tuple(st.label for st in steps),
            link_bytes=self.link_bytes(steps) if links else None,
        )
