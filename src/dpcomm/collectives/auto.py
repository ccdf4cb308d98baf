"""``auto``: per call, the algorithm the cost model says is fastest for (op, bytes, P, network).

MPICH and NCCL pick their collective algorithm from tuned tables by message size and node count; dpcomm
picks from the alpha-beta-gamma formulas of :mod:`dpcomm.costmodel` instead:
``argmin over algo of collective_cost(op, algo, nbytes, P, network)`` among the registered algorithms that
have a formula: ``ring``, ``lp``, ``mst``, ``be``, ``ps`` by default. ``bcube`` only when asked for
(``candidates=(..., "bcube")``) and ``P = n^k`` with ``k >= 2``: its formula's ``1/k`` assumes ``k`` NICs per
rank, one per BCube level, which a :class:`~dpcomm.costmodel.Network` (one link per rank) does not
describe. ``native`` and ``noop`` are never chosen (``native`` is the baseline the others are compared with).

Every rank computes the same choice from the same inputs, so no agreement step is needed. Ties go to the
first candidate in the order above. The network is the ``network`` option (a preset name, a network file or
a :class:`~dpcomm.costmodel.Network`), else ``$DPCOMM_NETWORK``, else ``10gbe``; ``dpcomm bench --fit``
writes a network file measured on the machine at hand.

One call: price every candidate, run the cheapest (the choice is cached per (op, bytes, P)). For a 1 MiB
allreduce on P = 8 ranks of the ``10gbe`` preset (``choose("allreduce", 2**20, 8, PRESETS["10gbe"])``)::

    ring 2.10 ms | lp 4.37 ms | mst 5.30 ms | be 1.74 ms | ps 2.10 ms
                                             ^^^^^^^^^^
                                    argmin: be.allreduce(tensor)

Cost, steps, bytes and memory: those of the chosen algorithm (see its module).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.collectives.base import Collective, get, names, register, resolve
from dpcomm.costmodel import Network, resolve_network
from dpcomm.costmodel.collective import ALGORITHMS, collective_cost
from dpcomm.errors import UserError
from dpcomm.topology import bcube_shape

__all__ = ["Auto", "CANDIDATES", "choose"]

CANDIDATES = ("ring", "lp", "mst", "be", "ps")
"""Algorithms ``auto`` considers by default, in tie-break order (those registered and costed)."""
_NETWORK_ENV = "DPCOMM_NETWORK"


def _network(spec: str | Network | None) -> Network:
    if isinstance(spec, Network):
        return spec
    return resolve_network(spec or os.environ.get(_NETWORK_ENV) or "10gbe")


def _bcube_opts(nodes: int) -> dict[str, int] | None:
    try:
        n, k = bcube_shape(nodes)
    except UserError:
        return None
    return {"n": n, "k": k}


def choose(
    op: str, nbytes: int, nodes: int, net: Network, candidates: tuple[str, ...] | None = None
) -> tuple[str, dict[str, float]]:
    """The cheapest algorithm for ``op`` of ``nbytes`` on ``nodes`` ranks, and every candidate's cost (s)."""
    registered = set(names())
    costs: dict[str, float] = {}
    for algo in candidates or CANDIDATES:
        if algo not in registered or algo not in ALGORITHMS or ALGORITHMS[algo].cost_only:
            continue
        opts: dict[str, Any] = {}
        if algo == "bcube":
            shape = _bcube_opts(nodes)
            if shape is None:
                continue
            opts = shape
        costs[algo] = collective_cost(op, algo, nbytes, nodes, net, **opts)
    if not costs:
        raise UserError(f"auto: no candidate algorithm for {op} on {nodes} ranks")
    best = min(costs, key=costs.__getitem__)  # min keeps the first of equal costs: the tie-break order
    return best, costs


@register("auto")
class Auto:
    """Options: ``network`` (preset, file or Network), ``candidates`` (names, in tie-break order)."""

    name = "auto"

    def __init__(self, *, network: str | Network | None = None, candidates: tuple[str, ...] | None = None):
        self.net = _network(network)
        self.candidates = tuple(resolve(c) for c in candidates) if candidates else None  # bml -> bcube
        self._algos: dict[str, Collective] = {}
        self._best: dict[tuple[str, int, int], str] = {}  # (op, bytes, ranks) -> choice: priced once
        self.last: str | None = None
        """The algorithm the latest call ran (for logs and tests)."""

    def _pick(self, op: str, tensor: torch.Tensor, group: Any) -> Collective:
        key = (op, tensor.numel() * tensor.element_size(), dist.get_world_size(group))
        best = self._best.get(key)
        if best is None:
            best = self._best[key] = choose(*key, self.net, self.candidates)[0]
        if best not in self._algos:
            self._algos[best] = get(best)
        self.last = best
        return self._algos[best]

    def allreduce(self, tensor: torch.Tensor, *, group: Any = None) -> None:
        self._pick("allreduce", tensor, group).allreduce(tensor, group=group)

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        self._pick("broadcast", tensor, group).broadcast(tensor, root=root, group=group)

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, group: Any = None) -> None:
        self._pick("reduce", tensor, group).reduce(tensor, root=root, group=group)
