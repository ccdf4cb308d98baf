"""The BML schedule of :mod:`dpcomm.collectives.bcube` as plain data: the piece layout, every message, and
each thread's steps (BML paper sec. 3.2, Algorithm 1; the layout is described in that module's docstring).

``transfers(cube, op)`` lists every message of one collective on the whole cube and ``plan(cube, op, rank)``
the steps one rank's threads run; tests count them against the docstring's formulas, and the runner only
walks them. ``cube`` is the topology's :class:`~dpcomm.topology.BCube`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcomm.topology.bcube import BCube

__all__ = [
    "PHASES",
    "Step",
    "Transfer",
    "gset",
    "piece_bounds",
    "piece_rank",
    "plan",
    "position",
    "transfers",
]

PHASES = ("aggregate", "broadcast", "scatter", "gather")


def position(cube: BCube, thread: int, rank: int) -> int:
    """Position of piece ``<thread, rank>`` in thread ``thread``'s block: base-``n`` digits of ``rank`` at
    levels ``thread, thread+1, .., thread+k-1 (mod k)``, most significant first."""
    pos = 0
    for i in range(cube.k):
        pos = pos * cube.n + cube.digit(rank, (thread + i) % cube.k)
    return pos


def piece_rank(cube: BCube, thread: int, pos: int) -> int:
    """Inverse of :func:`position`: the ``q`` of the piece ``<thread, q>`` at ``pos``."""
    rank = 0
    for i in range(cube.k - 1, -1, -1):
        rank += (pos % cube.n) * cube.n ** ((thread + i) % cube.k)
        pos //= cube.n
    return rank


def gset(cube: BCube, thread: int, rank: int, w: int) -> tuple[int, int]:
    """CalcGset(s = rank, w): positions ``[lo, hi)`` of pieces ``<thread, q>`` whose digits at levels
    ``thread .. thread + w (mod k)`` equal ``rank``'s (Algorithm 1, CheckDigits)."""
    span = cube.n ** (cube.k - 1 - w)
    first = position(cube, thread, rank) // span * span
    return first, first + span


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
    k = cube.k
    rd = [cube.digit(root, lv) for lv in range(k)]  # least significant digit first
    for t in range(k):
        for w in range(k):
            up = phase in ("aggregate", "scatter")
            level = (w + t) % k if up else (k - 1 - w + t) % k
            for a in range(cube.size):
                ad = [cube.digit(a, lv) for lv in range(k)]
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
                    peers = tuple(s for s in cube.domain(a, level) if s != a)
                for s in peers:
                    lo, hi = gset(cube, t, s, w) if up else gset(cube, t, a, k - 1 - w)
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


OP_PHASES = {
    "allreduce": ("aggregate", "broadcast"),
    "broadcast": ("scatter", "broadcast"),
    "reduce": ("aggregate", "gather"),
}


def transfers(cube: BCube, op: str, root: int = 0) -> list[Transfer]:
    """Every message of ``op`` on the whole cube, phase by phase (plain data for tests and cost checks)."""
    if op not in OP_PHASES:
        raise ValueError(f"op must be one of {tuple(OP_PHASES)}, got {op!r}")
    return [x for phase in OP_PHASES[op] for x in _phase_transfers(cube, phase, root)]


def plan(cube: BCube, op: str, rank: int, root: int = 0) -> tuple[tuple[Step, ...], ...]:
    """Per thread, the steps rank ``rank`` runs for ``op``: ``plan(...)[t][i]`` is thread ``t``'s step i."""
    xs = transfers(cube, op, root)
    out = []
    for t in range(cube.k):
        steps = []
        for phase in OP_PHASES[op]:
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
