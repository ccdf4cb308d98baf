"""``bcube``: BML gradient synchronization on a BCube(n, k) network (BML paper sec. 3.2, Algorithm 1).

Symbols (BML Table 1, dpcomm names): ``N = P = n^k`` ranks, each rank ``a`` named by ``k`` base-``n`` digits
``[d_{k-1} .. d_1 d_0]`` (``a = sum d_i n^i``); the level-``l`` switch domain of ``a`` is the ``n`` ranks
that differ from ``a`` only in digit ``l`` (``N_l(a)``: its ``n - 1`` one-hop neighbours); ``M`` bytes;
``alpha``, ``beta``, ``gamma``: s per message, s/byte on one link, s/byte summed; ``T_C = beta M / (k N)``.

The tensor is cut into ``k N`` near-equal pieces; piece ``<e, q>`` (thread ``e``, rank ``q``) is the one
thread ``e`` of rank ``q`` finally aggregates. Each rank runs ``k`` threads; thread ``t`` moves only pieces
``<t, *>``. Memory layout (dpcomm's choice, so that every message is one contiguous slice): thread ``t`` owns
pieces ``t N .. t N + N - 1``, and ``<t, q>`` sits at position ``pos_t(q)`` whose base-``n`` digits, most
significant first, are ``q``'s digits at levels ``t, t+1, .., t+k-1 (mod k)``. CheckDigits(g, s, w) (pieces
whose digits at levels ``t..t+w`` equal ``s``'s) is then the range of positions with those leading digits.

allreduce (Algorithm 1, all ``k`` threads concurrently):
    1. aggregation, steps ``w = 0..k-1`` on level ``l = (w + t) mod k``: send CalcGset(s, w), ``N/n^(w+1)``
       pieces, to each ``s`` in ``N_l(a)``; receive CalcGset(a, w) from each and sum it into place.
       Afterwards thread ``t`` of ``a`` holds the full sum of piece ``<t, a>``.
    2. broadcast, steps ``w = 0..k-1`` on level ``l = (k - 1 - w + t) mod k``: send CalcGset(a, k-1-w),
       ``n^w`` pieces, to each neighbour; receive theirs in place.
    Per rank: ``2 k^2 (n-1)`` messages and ``2 (N-1)/N * M`` bytes sent (``2 k (N-1)`` pieces).
broadcast (dpcomm's derivation, BML's analogue of scatter + allgather):
    1. scatter, in aggregation order: in step ``w`` a rank equal to the root at levels ``t+w .. t+k-1`` sends
       CalcGset(s, w) to each level-``l`` neighbour ``s``; afterwards every rank holds piece ``<t, a>``;
    2. the broadcast stage above. The root sends ``(N-1)/N * M`` bytes; every rank ``<= 2 (N-1)/N * M``.
reduce (the mirror image):
    1. the aggregation stage;
    2. gather, in broadcast order: in step ``w`` a rank equal to the root at the levels already gathered and
       different at ``l`` sends all it holds, CalcGset(a, k-1-w), to its level-``l`` neighbour with the
       root's digit. Non-root tensors end as scratch.

Time (BML: ``GST = 2 (N-1) T_C = 2 (N-1)/(k N) T_F``; alpha and gamma as :mod:`dpcomm.costmodel.bcube`:
the ``k`` threads drive disjoint links, a thread's ``n - 1`` messages of one step share its link):
    allreduce, reduce: ``2 k (n-1) alpha + 2 (N-1)/(k N) beta M + (N-1)/(k N) gamma M``;
    broadcast:         ``2 k (n-1) alpha + 2 (N-1)/(k N) beta M``.
On loopback every level shares one host, so the ``1/k`` shows only on the emulated cluster (a NIC per level).

Memory per call: the aggregation receives into one scratch buffer per thread sized for its largest step,
``(n-1)/n * M/k`` bytes, ``(n-1)/n * M`` in all (less than one message); broadcast, scatter and gather
receive in place.

Process groups: one per level-``l`` switch domain (:func:`make_level_groups`); on an emulated cluster
``interfaces`` (or ``DPCOMM_BCUBE_IFACES=eth0,eth1``) binds level ``l``'s gloo group to its own NIC. Each
thread tags its messages with its id and phase, so threads that reach a level at different times never mix.

One step, BCube(3,2) (9 ranks, digits ``[d1 d0]``), thread 0, aggregation step ``w = 0`` on level 0: each
level-0 switch joins the 3 ranks that differ in ``d0``; each rank sends the 3 pieces its neighbour gathers
(CalcGset) and sums the 3 it gathers itself::

    level-0 switch [0 *]          level-0 switch [1 *]          level-0 switch [2 *]
     00 <--> 01 <--> 02            10 <--> 11 <--> 12            20 <--> 21 <--> 22
      ^______________^              ^______________^              ^______________^
    (every pair swaps N/n = 3 pieces; thread 1 does the same on level 1 at the same time)

Shape: :func:`dpcomm.topology.bcube_shape`, shared with the cost model: ``n`` and ``k`` as given
(``--bcube n,k``), else the most levels, the least ``n >= 2`` with ``P = n^k`` and ``k >= 2`` (a one-level
BCube is a single switch, where BML is the P2P parameter server ``ps``: ask for ``k=1`` explicitly). Any
other ``P > 1`` is a :class:`~dpcomm.errors.UserError`; ``P = 1`` is a no-op.

Layout: the schedule (plain data) is :mod:`._bcube_schedule`, the level groups :mod:`._bcube_groups`; this
module runs them.

Source: Gong et al., "BML: A High-performance, Low-cost Gradient Synchronization Algorithm for DML Training"
(NeurIPS 2018), sec. 3.2, Algorithm 1 and the BCube(3,2) walk-through of Fig. 4.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.collectives import _p2p
from dpcomm.collectives._bcube_groups import LevelGroups, make_level_groups, parse_interfaces
from dpcomm.collectives._bcube_schedule import (
    OP_PHASES,
    PHASES,
    Step,
    Transfer,
    gset,
    piece_bounds,
    piece_rank,
    plan,
    position,
    transfers,
)
from dpcomm.collectives._p2p import CollectiveError
from dpcomm.collectives.base import register
from dpcomm.errors import UserError, first_line
from dpcomm.topology.bcube import BCube, bcube_shape

__all__ = [
    "BCube",
    "Bcube",
    "LevelGroups",
    "OP_PHASES",
    "PHASES",
    "Step",
    "Transfer",
    "gset",
    "make_level_groups",
    "piece_bounds",
    "piece_rank",
    "plan",
    "position",
    "transfers",
]

_GROUP_CACHE: dict[tuple, LevelGroups] = {}
"""Level groups by (default group, ranks, n, k, interfaces): built once, shared by every instance."""


@functools.lru_cache(maxsize=256)
def _cached_plan(cube: BCube, op: str, rank: int, root: int) -> tuple[tuple[Step, ...], ...]:
    return plan(cube, op, rank, root)


@register("bcube")
class Bcube:
    """BML on BCube(n, k). Options: ``n``, ``k`` (default: from the world size), ``interfaces`` (one NIC per
    level, or ``DPCOMM_BCUBE_IFACES``), ``level_groups`` (a prebuilt :class:`LevelGroups`)."""

    name = "bcube"

    def __init__(
        self,
        *,
        n: int | None = None,
        k: int | None = None,
        interfaces: list[str] | str | None = None,
        level_groups: LevelGroups | None = None,
    ) -> None:
        if (n is not None and n < 2) or (k is not None and k < 1):
            raise UserError(f"bcube needs n >= 2 and k >= 1, got n={n}, k={k}")
        self.n, self.k = n, k
        self.interfaces = parse_interfaces(interfaces)
        self._given = level_groups
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # -- the three ops ---------------------------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        self._run("allreduce", tensor, 0, group)

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        self._run("broadcast", tensor, root, group)

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        self._run("reduce", tensor, root, group)

    # -- machinery -------------------------------------------------------------------------------------

    def level_groups(self, group: Any = None) -> LevelGroups:
        """This rank's level groups over ``group`` (built on first use, then shared by every instance)."""
        if self._given is not None:
            return self._given
        size = dist.get_world_size(group)
        n, k = bcube_shape(size, self.n, self.k)
        granks = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(size))
        # keyed by the default group too: a job that re-initialises torch.distributed gets new groups
        key = (id(dist.group.WORLD), granks, n, k, self.interfaces)
        if key not in _GROUP_CACHE:
            _GROUP_CACHE[key] = make_level_groups(n, k, self.interfaces, group=group)
        return _GROUP_CACHE[key]

    def _threads(self, k: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool._max_workers < k:
                self._pool = ThreadPoolExecutor(max_workers=k, thread_name_prefix="dpcomm-bml")
            return self._pool

    def _run(self, op: str, tensor: torch.Tensor, root: int, group: Any) -> None:
        size = dist.get_world_size(group)
        flat = _p2p.flat_view(tensor, "bcube")
        if not 0 <= root < size:
            raise ValueError(f"root {root} is not a rank of the group (size {size})")
        if size == 1:
            return
        lg = self.level_groups(group)
        cube = lg.cube
        if cube.size != size or lg.rank != dist.get_rank(group):
            raise UserError(f"bcube level groups are for BCube({cube.n},{cube.k}), not this group of {size}")
        if flat.numel() == 0:
            return
        steps = _cached_plan(cube, op, lg.rank, root)
        bounds = piece_bounds(flat.numel(), cube)
        if cube.k == 1:
            _run_thread(op, lg, steps[0], flat, bounds)
            return
        pool = self._threads(cube.k)
        futures = [pool.submit(_run_thread, op, lg, steps[t], flat, bounds) for t in range(cube.k)]
        errors = [f.exception() for f in futures]  # wait for every thread before touching the tensor
        for exc in errors:
            if exc is not None:
                raise exc


def _run_thread(
    op: str, lg: LevelGroups, steps: tuple[Step, ...], flat: torch.Tensor, bounds: list[int]
) -> None:
    """One BML thread: each step posts its receives and sends on the level's group, waits, then sums.

    Messages that would carry no element (fewer elements than pieces) are skipped on both sides."""
    cube = lg.cube
    # The aggregation's receive buffer, sized for the largest step (the first, up to the uneven split's
    # extra elements): (n-1) * N/n pieces of M/(kN) bytes = (n-1)/n * M/k bytes; one per thread, reused.
    need = max(
        (
            bounds[x.thread * cube.size + x.hi] - bounds[x.thread * cube.size + x.lo]
            for st in steps
            for x in st.recvs
            if x.reduce
        ),
        default=0,
    )
    buf_all = _p2p.scratch((cube.n - 1) * need, flat.dtype) if need else None
    for st in steps:
        pg, base = lg.groups[st.level], st.thread * cube.size
        tag = st.thread * len(PHASES) + PHASES.index(st.phase)
        where = f"bcube {op}: step {st.phase} {st.step} (thread {st.thread}, level {st.level})"
        pending, sums = [], []
        peer, what = -1, "posting"  # what was under way when something failed, for the error message
        try:
            for x in st.recvs:
                lo, hi = bounds[base + x.lo], bounds[base + x.hi]
                if hi == lo:
                    continue
                if x.reduce:
                    assert buf_all is not None
                    buf = buf_all[len(sums) * (hi - lo) : (len(sums) + 1) * (hi - lo)]
                    sums.append((buf, lo, hi))
                else:
                    buf = flat[lo:hi]
                peer, what = x.src, f"receive of {buf.numel() * buf.element_size()} bytes"
                pending.append((peer, what, pg.recv([buf], cube.digit(peer, st.level), tag)))
            for x in st.sends:
                lo, hi = bounds[base + x.lo], bounds[base + x.hi]
                if hi == lo:
                    continue
                nbytes = (hi - lo) * flat.element_size()
                peer, what = x.dst, f"send of {nbytes} bytes"
                pending.append((peer, what, pg.send([flat[lo:hi]], cube.digit(peer, st.level), tag)))
                _p2p._count(nbytes)
            for peer, what, work in pending:  # noqa: B007 (peer, what name the failure below)
                work.wait()
        except Exception as exc:
            raise CollectiveError(f"{where}: peer {peer} ({what}): {first_line(exc)}") from exc
        for buf, lo, hi in sums:
            _p2p.reduce_into(flat[lo:hi], buf)
