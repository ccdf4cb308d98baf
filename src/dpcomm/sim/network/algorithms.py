"""Which schedule each algorithm name means on a fabric, and one call that prices an allreduce.

``ring``, ``be``, ``mst``, ``lp``, ``ps``: the ``steps()`` of :mod:`dpcomm.collectives` (the messages the
real algorithms send, rank ``i`` on server ``i``). ``ps-dedicated[:S]``: the parameter server on ``S``
dedicated servers (the last ``S`` servers; default half) and ``P - S`` workers (BML sec. 2's "two
clusters"). ``bml``: BML on BCube (Algorithm 1), only on a ``bcube:n,k`` fabric: step ``w`` of the
aggregation (broadcast) holds the messages of all ``k`` threads, thread ``t`` on level ``(w + t) mod k``
(``(k - 1 - w + t) mod k``), each message ``CalcGset``'s run of pieces (:func:`bml_steps`, the vectorised
form of :func:`dpcomm.collectives.bcube.transfers`, which a test compares it with).

Sizes are bytes of float32 (the element count is ``S // 4``); busbw is nccl-tests' ``2 (P-1)/P * S / t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcomm.collectives import be, lp, mst, ps, ring
from dpcomm.collectives.schedule import Step
from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.sim.network.engine import FlowModel, FlowRun
from dpcomm.sim.network.fabric import Fabric
from dpcomm.topology import BCube

__all__ = ["ALGORITHMS", "NetsimRow", "bml_steps", "parse_algorithm", "schedule", "simulate_allreduce"]

ALGORITHMS = ("ring", "be", "mst", "lp", "ps", "ps-dedicated", "bml")
ELEM = 4  # bytes per element (float32)
_MODULES = {"ring": ring, "be": be, "mst": mst, "ps": ps}


def parse_algorithm(text: str) -> tuple[str, int | None]:
    """``"ps-dedicated:4"`` -> ``("ps-dedicated", 4)``; an unknown name is a one-line :class:`UserError`."""
    name, _, arg = text.strip().partition(":")
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{name}' for netsim (choose from {', '.join(ALGORITHMS)})")
    if not arg:
        return name, None
    if name != "ps-dedicated" or not arg.isdigit() or int(arg) < 1:
        raise UserError(
            f"bad algorithm '{text}' (only ps-dedicated takes an argument: ps-dedicated:S, S >= 1)"
        )
    return name, int(arg)


def bml_steps(cube: BCube, numel: int, elem_size: int = ELEM) -> list[Step]:
    """BML allreduce on ``cube``: ``k`` aggregation then ``k`` broadcast steps, all threads together."""
    n, k, big_n = cube.n, cube.k, cube.servers
    parts = k * big_n  # piece boundaries as collectives.bcube.piece_bounds: near-equal pieces of elements
    base, extra = divmod(numel, parts)
    j = np.arange(parts + 1, dtype=np.int64)
    bounds = (j * base + np.minimum(j, extra)) * elem_size
    a = np.repeat(np.arange(big_n, dtype=np.int64), n - 1)
    hop = np.tile(np.arange(1, n, dtype=np.int64), big_n)

    def digit(r: np.ndarray, level: int) -> np.ndarray:
        return (r // n**level) % n

    def position(t: int, r: np.ndarray) -> np.ndarray:
        pos = np.zeros_like(r)
        for i in range(k):
            pos = pos * n + digit(r, (t + i) % k)
        return pos

    def gset_bytes(t: int, r: np.ndarray, w: int) -> np.ndarray:
        span = n ** (k - 1 - w)
        lo = (position(t, r) // span) * span
        return bounds[t * big_n + lo + span] - bounds[t * big_n + lo]

    out = []
    for phase in ("aggregate", "broadcast"):
        for w in range(k):
            src, dst, size, lane = [], [], [], []
            for t in range(k):
                level = (w + t) % k if phase == "aggregate" else (k - 1 - w + t) % k
                d = digit(a, level)
                s = a + (((d + hop) % n) - d) * n**level
                src.append(a)
                dst.append(s)
                size.append(gset_bytes(t, s, w) if phase == "aggregate" else gset_bytes(t, a, k - 1 - w))
                lane.append(np.full(len(a), t, dtype=np.int64))
            out.append(
                Step(
                    label=f"{phase} {w}",
                    src=np.concatenate(src),
                    dst=np.concatenate(dst),
                    nbytes=np.concatenate(size),
                    lane=np.concatenate(lane),
                )
            )
    return out


def schedule(
    algo: str,
    fabric: Fabric,
    nbytes: int,
    alpha_s: float,
    block_bytes: int | None = None,
    ranks: int | None = None,
) -> list[Step]:
    """The steps of ``algo``'s allreduce of ``nbytes`` bytes on ``ranks`` ranks (default: every server of
    ``fabric``), rank ``i`` on server ``i`` (a partly filled topology fills its first edge switches first)."""
    name, arg = parse_algorithm(algo)
    p, numel = fabric.servers if ranks is None else ranks, nbytes // ELEM
    if not 1 <= p <= fabric.servers:
        raise UserError(f"{p} ranks do not fit on the {fabric.servers} servers of {fabric.topology.spec}")
    if name in _MODULES:
        return _MODULES[name].steps(p, numel, ELEM)
    if name == "lp":
        if block_bytes is None:  # LP's own default: the cost model's optimum on this link
            beta = 8 / (fabric.rate_bps * fabric.goodput.one_way)  # as the testbed tells lp (link_network)
            net = Network(name=f"{fabric.topology.spec}@{fabric.rate_bps:g}", alpha=alpha_s, beta=beta)
            block_bytes = lp.LinearPipeline(network=net).block_size(nbytes, p, "allreduce")
        return lp.steps(p, numel, ELEM, block_bytes=block_bytes)
    if name == "ps-dedicated":
        servers = arg if arg is not None else max(1, p // 2)
        if servers >= p:
            raise UserError(
                f"ps-dedicated:{servers} needs fewer servers than the {p} in {fabric.topology.spec}"
            )
        return ps.dedicated_steps(p - servers, servers, numel, ELEM)
    if not isinstance(fabric.topology, BCube):
        raise UserError(f"bml runs on a bcube:n,k topology, not {fabric.topology.spec}")
    if p != fabric.servers:
        raise UserError(
            f"bml needs one rank per server of {fabric.topology.spec} ({fabric.servers}), not {p}"
        )
    return bml_steps(fabric.topology, numel, ELEM)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetsimRow:
    """One simulated allreduce, in nccl-tests' columns."""

    topology: str
    algorithm: str
    servers: int
    bytes: int
    time_s: float
    algbw_GBps: float
    """``S / t`` in GB/s (1e9 bytes/s)."""
    busbw_GBps: float
    """``2 (P-1)/P * S / t`` in GB/s."""
    steps: int

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def simulate_allreduce(
    model: FlowModel,
    algo: str,
    nbytes: int,
    *,
    block_bytes: int | None = None,
    links: bool = False,
    ranks: int | None = None,
) -> tuple[NetsimRow, FlowRun]:
    """Price ``algo``'s allreduce of ``nbytes`` on ``model``'s fabric (``ranks`` of its servers, default
    all): the table row and the run."""
    fabric = model.fabric
    steps = schedule(algo, fabric, nbytes, model.alpha_s, block_bytes, ranks)
    run = model.run(steps, links=links)
    p, t = fabric.servers if ranks is None else ranks, run.time_s
    name, arg = parse_algorithm(algo)
    workers = p - (arg if arg is not None else max(1, p // 2)) if name == "ps-dedicated" else p
    algbw = nbytes / t / 1e9 if t > 0 else 0.0  # one rank: nothing moves, reported as 0 (as JSON allows)
    busbw = algbw * 2 * (workers - 1) / workers if workers > 1 else 0.0
    row = NetsimRow(
        topology=fabric.topology.spec,
        algorithm=algo,
        servers=p,
        bytes=int(nbytes),
        time_s=t,
        algbw_GBps=algbw,
        busbw_GBps=busbw,
        steps=len(steps),
    )
    return row, run
