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

Shape: ``n`` and ``k`` as given (``--bcube n,k``), else the smallest ``n >= 2`` with ``P = n^k`` and
``k >= 2`` (a one-level BCube is a single switch, where BML is the P2P parameter server ``ps``: ask for
``k=1`` explicitly). Any other ``P > 1`` is a :class:`~dpcomm.errors.UserError`; ``P = 1`` is a no-op.

Source: Gong et al., "BML: A High-performance, Low-cost Gradient Synchronization Algorithm for DML Training"
(NeurIPS 2018), sec. 3.2, Algorithm 1 and the BCube(3,2) walk-through of Fig. 4.
"""

from __future__ import annotations

import datetime
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.collectives import _p2p
from dpcomm.collectives._p2p import CollectiveError
from dpcomm.collectives.base import register
from dpcomm.errors import UserError
from dpcomm.topology.bcube import server_digits

__all__ = [
    "BCube",
    "Bcube",
    "LevelGroups",
    "Step",
    "Transfer",
    "bcube_shape",
    "make_level_groups",
    "PHASES",
    "piece_bounds",
    "plan",
    "transfers",
]

PHASES = ("aggregate", "broadcast", "scatter", "gather")
_IFACES_ENV = "DPCOMM_BCUBE_IFACES"


# ---------------------------------------------------------------------------------------------- the topology


@dataclass(frozen=True, slots=True, kw_only=True)
class BCube:
    """BCube(n, k): ``n^k`` servers with ``k`` levels of ``n``-port switches (BML sec. 3.1)."""

    n: int
    """Switch ports: ranks per switch domain (>= 2)."""
    k: int
    """Levels (NICs per server, BML threads per rank) (>= 1)."""

    def __post_init__(self) -> None:
        if self.n < 2 or self.k < 1:
            raise UserError(f"BCube(n,k) needs n >= 2 and k >= 1, got n={self.n}, k={self.k}")

    @property
    def size(self) -> int:
        """``N = n^k`` ranks."""
        return self.n**self.k

    def digits(self, rank: int) -> tuple[int, ...]:
        """``(d_0, .., d_{k-1})``: digit ``l`` is the rank's port on its level-``l`` switch (the topology's
        server ID, least significant digit first)."""
        return server_digits(rank, self.n, self.k)[::-1]

    def with_digit(self, rank: int, level: int, value: int) -> int:
        d = (rank // self.n**level) % self.n
        return rank + (value - d) * self.n**level

    def domain(self, rank: int, level: int) -> tuple[int, ...]:
        """The ``n`` ranks under ``rank``'s level-``level`` switch, by digit (so also by rank)."""
        return tuple(self.with_digit(rank, level, v) for v in range(self.n))

    def neighbours(self, rank: int, level: int) -> tuple[int, ...]:
        """``N_l(a)``: the one-hop neighbours of ``rank`` on level ``level``."""
        return tuple(r for r in self.domain(rank, level) if r != rank)

    def domains(self, level: int) -> list[tuple[int, ...]]:
        """Every level-``level`` switch domain, ordered by its smallest rank."""
        return [self.domain(r, level) for r in range(self.size) if (r // self.n**level) % self.n == 0]

    def position(self, thread: int, rank: int) -> int:
        """Position of piece ``<thread, rank>`` in thread ``thread``'s block (see the module docstring)."""
        d, pos = self.digits(rank), 0
        for i in range(self.k):
            pos = pos * self.n + d[(thread + i) % self.k]
        return pos

    def piece_rank(self, thread: int, pos: int) -> int:
        """Inverse of :meth:`position`: the ``q`` of the piece ``<thread, q>`` at ``pos``."""
        rank = 0
        for i in range(self.k - 1, -1, -1):
            rank += (pos % self.n) * self.n ** ((thread + i) % self.k)
            pos //= self.n
        return rank

    def gset(self, thread: int, rank: int, w: int) -> tuple[int, int]:
        """CalcGset(s = rank, w): positions ``[lo, hi)`` of pieces ``<thread, q>`` whose digits at levels
        ``thread .. thread + w (mod k)`` equal ``rank``'s (Algorithm 1, CheckDigits)."""
        span = self.n ** (self.k - 1 - w)
        return (self.position(thread, rank) // span) * span, (self.position(thread, rank) // span + 1) * span


def bcube_shape(world: int, n: int | None = None, k: int | None = None) -> tuple[int, int]:
    """``(n, k)`` with ``n^k == world``: the given ones checked, else the least ``n >= 2`` with ``k >= 2``."""
    if k is not None and k < 1 or n is not None and n < 2:
        raise UserError(f"--bcube needs n >= 2 and k >= 1, got n={n}, k={k}")
    if n is not None and k is not None:
        if n**k != world:
            raise UserError(f"BCube({n},{k}) has {n**k} ranks, not the world size {world}")
        return n, k
    for cand in [n] if n is not None else range(2, world + 1):
        kk, size = 1, cand
        while size < world:
            kk, size = kk + 1, size * cand
        if size == world and (kk == k if k is not None else kk >= 2 or n is not None):
            return cand, kk
    want = f"n^{k}" if k is not None else f"{n}^k" if n is not None else "n^k with n >= 2, k >= 2"
    raise UserError(f"bcube needs a world size of {want}, got {world} (set --bcube n,k to choose)")


# ---------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """One message: thread ``thread``'s pieces at positions ``[lo, hi)`` from ``src`` to ``dst``."""

    phase: str
    """``aggregate``, ``broadcast``, ``scatter`` or ``gather``."""
    step: int
    """``w``, the step within the phase."""
    thread: int
    level: int
    """Switch level ``l`` the message crosses (src and dst differ only in digit ``l``)."""
    src: int
    dst: int
    lo: int
    hi: int
    reduce: bool
    """The receiver sums the pieces into its own (aggregation) instead of overwriting them."""

    @property
    def count(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """What one thread of one rank does in one step: post every receive and send, wait, then sum."""

    phase: str
    step: int
    thread: int
    level: int
    sends: tuple[Transfer, ...]
    recvs: tuple[Transfer, ...]


def _phase_transfers(cube: BCube, phase: str, root: int) -> list[Transfer]:
    out = []
    k, rd = cube.k, cube.digits(root)
    for t in range(k):
        for w in range(k):
            up = phase in ("aggregate", "scatter")
            level = (w + t) % k if up else (k - 1 - w + t) % k
            for a in range(cube.size):
                ad = cube.digits(a)
                if phase == "scatter":  # holders so far: ranks equal to the root on levels not yet split
                    if any(ad[(t + i) % k] != rd[(t + i) % k] for i in range(w, k)):
                        continue
                if phase == "gather":  # holders: equal to the root on levels gathered so far
                    if any(ad[(k - 1 - i + t) % k] != rd[(k - 1 - i + t) % k] for i in range(w)):
                        continue
                    if ad[level] == rd[level]:
                        continue
                    peers = (cube.with_digit(a, level, rd[level]),)
                else:
                    peers = cube.neighbours(a, level)
                for s in peers:
                    lo, hi = cube.gset(t, s, w) if up else cube.gset(t, a, k - 1 - w)
                    out.append(
                        Transfer(
                            phase=phase,
                            step=w,
                            thread=t,
                            level=level,
                            src=a,
                            dst=s,
                            lo=lo,
                            hi=hi,
                            reduce=phase == "aggregate",
                        )
                    )
    return out


_OP_PHASES = {
    "allreduce": ("aggregate", "broadcast"),
    "broadcast": ("scatter", "broadcast"),
    "reduce": ("aggregate", "gather"),
}


def transfers(cube: BCube, op: str, root: int = 0) -> list[Transfer]:
    """Every message of ``op`` on the whole cube, phase by phase (plain data for tests and cost checks)."""
    if op not in _OP_PHASES:
        raise ValueError(f"op must be one of {tuple(_OP_PHASES)}, got {op!r}")
    return [x for phase in _OP_PHASES[op] for x in _phase_transfers(cube, phase, root)]


def plan(cube: BCube, op: str, rank: int, root: int = 0) -> tuple[tuple[Step, ...], ...]:
    """Per thread, the steps rank ``rank`` runs for ``op``: ``plan(...)[t][i]`` is thread ``t``'s step i."""
    xs = transfers(cube, op, root)
    out = []
    for t in range(cube.k):
        steps = []
        for phase in _OP_PHASES[op]:
            for w in range(cube.k):
                mine = [x for x in xs if x.thread == t and x.phase == phase and x.step == w]
                sends = tuple(x for x in mine if x.src == rank)
                recvs = tuple(x for x in mine if x.dst == rank)
                level = mine[0].level if mine else -1
                if sends or recvs:
                    steps.append(Step(phase=phase, step=w, thread=t, level=level, sends=sends, recvs=recvs))
        out.append(tuple(steps))
    return tuple(out)


def piece_bounds(numel: int, cube: BCube) -> list[int]:
    """Element offsets of the ``k N + 1`` piece boundaries: near-equal pieces, the first ``numel mod kN``
    one element longer."""
    parts = cube.k * cube.size
    base, extra = divmod(numel, parts)
    return [j * base + min(j, extra) for j in range(parts + 1)]


# ---------------------------------------------------------------------------------------------- the groups


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelGroups:
    """This rank's ``k`` switch-domain process groups; group-local rank of a member = its digit ``l``."""

    cube: BCube
    rank: int
    """This process's rank in the cube (its rank in the parent group)."""
    groups: tuple[Any, ...]
    """``groups[l]``: the process group of this rank's level-``l`` domain (``send``/``recv`` go to it)."""
    interfaces: tuple[str, ...] | None = None
    """NIC per level when the groups were bound to interfaces, else None."""

    def __post_init__(self) -> None:
        if len(self.groups) != self.cube.k:
            raise ValueError(f"need one group per level ({self.cube.k}), got {len(self.groups)}")


_GROUP_CACHE: dict[tuple, LevelGroups] = {}
_BUILD_COUNT: dict[tuple, int] = {}


def _parse_interfaces(interfaces: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    if interfaces is None:
        interfaces = os.environ.get(_IFACES_ENV) or None
    if interfaces is None:
        return None
    if isinstance(interfaces, str):
        interfaces = interfaces.split(",")
    out = tuple(s.strip() for s in interfaces)
    if not out or not all(out):
        raise UserError(f"bcube interfaces must be non-empty names, one per level, got {interfaces!r}")
    return out


def make_level_groups(
    n: int,
    k: int,
    interfaces: list[str] | tuple[str, ...] | str | None = None,
    *,
    group: Any = None,
    timeout_s: float | None = None,
) -> LevelGroups:
    """Build the ``k`` level groups of this rank in BCube(n, k) over ``group`` (None: the default group).

    Collective over ``group``: every member calls it with the same arguments. With ``interfaces`` (one NIC
    name per level, e.g. ``["eth0", "eth1"]``) each level is a ``ProcessGroupGloo`` bound to its own
    interface (``new_group(pg_options=...)`` ignores gloo options, so the group is constructed directly on a
    prefix of the default store); otherwise the groups come from ``torch.distributed.new_group`` with the
    default backend (gloo on CPU, NCCL on GPU).
    """
    cube = BCube(n=n, k=k)
    ifaces = _parse_interfaces(interfaces)
    if ifaces is not None and len(ifaces) != k:
        raise UserError(f"BCube({n},{k}) needs {k} interfaces (one per level), got {len(ifaces)}: {ifaces}")
    size = dist.get_world_size(group)
    if cube.size != size:
        raise UserError(f"BCube({n},{k}) has {cube.size} ranks but the group has {size}")
    me = dist.get_rank(group)
    granks = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(size))
    timeout = _timedelta(timeout_s) if timeout_s is not None else _group_timeout(group)
    key = (granks, n, k, ifaces)
    build = _BUILD_COUNT[key] = _BUILD_COUNT.get(key, -1) + 1  # same count on every member: unique prefixes
    groups: list[Any] = []
    if ifaces is None and len(granks) == dist.get_world_size():
        # Every process of the job is here: create every domain in one global order (plain new_group, any
        # backend). Non-members get a placeholder back.
        for level in range(k):
            for dom in cube.domains(level):
                pg = dist.new_group([granks[r] for r in dom], timeout=timeout)
                if me in dom:
                    groups.append(pg)
    elif dist.get_backend(group) == "gloo":
        # Only the parent group's members are here (or each level needs its own NIC): build this rank's k
        # gloo groups directly on prefixes of the default store, as new_group does inside. (new_group's
        # use_local_synchronization names a group by a hash that counts the process's existing groups, which
        # differs between ranks that were not members of the same earlier groups, and hangs.)
        from torch.distributed import PrefixStore, ProcessGroupGloo
        from torch.distributed.distributed_c10d import _get_default_store

        for level in range(k):
            members = [granks[r] for r in cube.domain(me, level)]
            store = PrefixStore(f"dpcomm-bcube/{build}/{n},{k}/L{level}/{members}/", _get_default_store())
            opts = ProcessGroupGloo._Options()
            if timeout is not None:
                opts._timeout = timeout
            if ifaces is not None:
                opts._devices = [ProcessGroupGloo.create_device(interface=ifaces[level])]
            else:
                opts._devices = [ProcessGroupGloo.create_default_device()]
            groups.append(ProcessGroupGloo(store, cube.digits(me)[level], n, opts))
    else:
        if ifaces is not None:
            raise UserError("bcube interfaces need the gloo backend")
        # Another backend on a sub-group: torch's local synchronisation (see the caveat above: only safe
        # when every member has created the same number of process groups so far).
        for level in range(k):
            members = [granks[r] for r in cube.domain(me, level)]
            groups.append(dist.new_group(members, timeout=timeout, use_local_synchronization=True))
    return LevelGroups(cube=cube, rank=me, groups=tuple(groups), interfaces=ifaces)


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _group_timeout(group: Any) -> datetime.timedelta | None:
    """The parent group's own timeout (``init_worker(timeout_s=...)``), so a dead peer fails as fast here."""
    pg = group if group is not None else dist.group.WORLD
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None


# ---------------------------------------------------------------------------------------------- running it


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
        self.interfaces = _parse_interfaces(interfaces)
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
                pending.append((peer, what, pg.recv([buf], cube.digits(peer)[st.level], tag)))
            for x in st.sends:
                lo, hi = bounds[base + x.lo], bounds[base + x.hi]
                if hi == lo:
                    continue
                nbytes = (hi - lo) * flat.element_size()
                peer, what = x.dst, f"send of {nbytes} bytes"
                pending.append((peer, what, pg.send([flat[lo:hi]], cube.digits(peer)[st.level], tag)))
                _p2p._count(nbytes)
            for peer, what, work in pending:  # noqa: B007 (peer, what name the failure below)
                work.wait()
        except Exception as exc:
            raise CollectiveError(f"{where}: peer {peer} ({what}): {_p2p.cause(exc)}") from exc
        for buf, lo, hi in sums:
            _p2p.reduce_into(flat[lo:hi], buf)
