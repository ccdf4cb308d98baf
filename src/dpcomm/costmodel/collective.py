"""One table of every algorithm's cost formulas, and the calls the planners and the simulator make.

``collective_cost(op, algo, nbytes, nodes, net)`` is the seconds of one ``op`` (allreduce, broadcast, reduce)
by ``algo``; ``allreduce_linear`` is MG-WFBP Eq. 9's ``T_ar(M) = a + b M`` for a fixed node count;
``allreduce_cost`` is what a planner uses: the network's measured table for that node count if it has one,
else the linear form. The names match :mod:`dpcomm.collectives`' registry; ``native`` (torch.distributed's
own collective) is costed as ``ring`` for allreduce and ``mst`` (binomial tree) for broadcast and reduce;
``binary_tree`` and ``recursive_doubling`` are cost-only. An alias of :data:`dpcomm.registry.ALIASES`
(``bml`` for ``bcube``) prices as its algorithm: ``ALGORITHMS["bml"] is ALGORITHMS["bcube"]``, though only
canonical names are listed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dpcomm.costmodel import bcube, be, binary_tree, lp, mst, ps, recursive_doubling, ring
from dpcomm.costmodel._steps import check
from dpcomm.costmodel.base import CommCost, LinearCost, MeasuredCost
from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.ops import OPS
from dpcomm.registry import CostTable, add_cost, describe

__all__ = ["ALGORITHMS", "Algorithm", "allreduce_cost", "allreduce_linear", "collective_cost"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Algorithm:
    """The cost formulas of one algorithm family; each takes ``(nbytes, nodes, net, **options)``."""

    name: str
    """Name shared with the collective registry (``ring``, ``lp``, ...)."""
    allreduce: Callable[..., float]
    broadcast: Callable[..., float]
    reduce: Callable[..., float]
    allreduce_ab: Callable[..., tuple[float, float]]
    """``(nodes, net, **options) -> (a, b)`` of the allreduce as ``a + b M``."""
    options: tuple[str, ...] = ()
    """Keyword options the formulas accept (``block_bytes`` for LP, ``n``/``k`` for BCube)."""
    cost_only: bool = False
    """True when dpcomm has a cost formula but no implementation under this name."""
    formula: str = ""
    """The allreduce cost in one line, for tables."""
    source: str = ""
    """Paper and table/equation the formulas come from."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an algorithm needs a name")


def _alg(name: str, mod, **kw) -> Algorithm:
    return Algorithm(
        name=name,
        allreduce=mod.allreduce,
        broadcast=mod.broadcast,
        reduce=mod.reduce,
        allreduce_ab=mod.allreduce_ab,
        **kw,
    )


for _a in (
    _alg(
        "ring",
        ring,
        formula="2(N-1) alpha + 2(N-1)/N beta M + (N-1)/N gamma M",
        source="MG-WFBP Table II (Ring)",
    ),
    _alg(
        "lp",
        lp,
        options=("block_bytes",),
        formula="2(p-1+M/b) alpha + (b(p-1)+M)(2 beta + gamma), b = b* by default",
        source="LP paper Table 1 (Linear Pipeline), sec. 3.2",
    ),
    _alg(
        "mst",
        mst,
        formula="ceil(log2 p) (2 alpha + 2 beta M + gamma M)",
        source="LP paper Table 1 (Minimal Spanning Tree)",
    ),
    _alg(
        "be",
        be,
        formula="2 log2 p alpha + 2(p-1)/p beta M + (p-1)/p gamma M + fold 2 alpha + (2 beta+gamma) M",
        source="LP paper Table 1 (BE); MG-WFBP Table II (recursive halving and doubling)",
    ),
    _alg(
        "bcube",
        bcube,
        options=("n", "k"),
        formula="2k(n-1) alpha + 2(N-1)/(kN) beta M + (N-1)/(kN) gamma M",
        source="BML sec. 3.2 (GST = 2(N-1)/(kN) T_F)",
    ),
    _alg(
        "ps",
        ps,
        formula="2(N-1) alpha + 2(N-1)/N beta M + (N-1)/N gamma M",
        source="BML sec. 2 (P2P PS on Fat-Tree, GST = 2(N-1)/N T_F)",
    ),
    Algorithm(
        name="native",
        allreduce=ring.allreduce,
        broadcast=mst.broadcast,
        reduce=mst.reduce,
        allreduce_ab=ring.allreduce_ab,
        formula="as ring (allreduce); as mst (broadcast, reduce)",
        source="torch.distributed's own collective, costed as ring / binomial tree",
    ),
    _alg(
        "binary_tree",
        binary_tree,
        cost_only=True,
        formula="2 floor(log2 N) alpha + floor(log2 N)(2 beta + gamma) M",
        source="MG-WFBP Table II (Binary tree)",
    ),
    _alg(
        "recursive_doubling",
        recursive_doubling,
        cost_only=True,
        formula="log2 N (alpha + (beta + gamma) M) (+2 alpha + (2 beta+gamma) M if N not 2^k)",
        source="MG-WFBP Table II (Recursive doubling)",
    ),
):
    add_cost(_a.name, _a)

ALGORITHMS: Mapping[str, Algorithm] = CostTable()
"""Every algorithm with cost formulas, by name: a view of :mod:`dpcomm.registry` (which also holds the
implementations)."""


def _lookup(algo: str, opts: dict) -> Algorithm:
    if algo not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{algo}' (choose from {describe(list(ALGORITHMS))})")
    alg = ALGORITHMS[algo]
    extra = sorted(set(opts) - set(alg.options))
    if extra:
        accepts = ", ".join(alg.options) or "no options"
        raise UserError(f"algorithm '{algo}' does not take option(s) {', '.join(extra)} (it takes {accepts})")
    return alg


def collective_cost(op: str, algo: str, nbytes: float, nodes: int, net: Network, **opts) -> float:
    """Seconds for one ``op`` of ``nbytes`` bytes over ``nodes`` nodes by ``algo`` (0: 1 node or 0 bytes)."""
    if op not in OPS:
        raise UserError(f"unknown collective '{op}' (choose from {', '.join(OPS)})")
    alg = _lookup(algo, opts)
    check(nbytes, nodes)
    return getattr(alg, op)(float(nbytes), int(nodes), net, **opts)


def allreduce_linear(algo: str, nodes: int, net: Network, **opts) -> LinearCost:
    """MG-WFBP Eq. 9, ``T_ar(M) = a + b M`` for fixed ``nodes``.

    Exact for every algorithm but ``lp`` with its optimal block, where it is the large-``M`` asymptote
    ``a = 2 (p-1) alpha``, ``b = 2 beta + gamma`` (see :func:`dpcomm.costmodel.lp.allreduce_ab`); ``lp``
    with a fixed ``block_bytes`` is exact for ``M >= block_bytes``.
    """
    alg = _lookup(algo, opts)
    check(0, nodes)
    if nodes == 1:
        return LinearCost(a=0.0, b=0.0)
    a, b = alg.allreduce_ab(int(nodes), net, **opts)
    return LinearCost(a=a, b=b)


def allreduce_cost(
    net: Network, nodes: int, algo: str = "ring", *, measured: bool = True, **opts
) -> CommCost:
    """The allreduce cost a planner uses: ``net``'s measured table for ``nodes`` if present (and
    ``measured``), else :func:`allreduce_linear`. One node costs nothing.

    A measured table is the real cluster's allreduce (whatever algorithm measured it, e.g. ``dpcomm
    calibrate``'s torch.distributed allreduce) and overrides the model for every ``algo``; pass
    ``measured=False`` to compare algorithms by their formulas on a calibrated network.
    """
    check(0, nodes)
    if nodes == 1:
        _lookup(algo, opts)
        return LinearCost(a=0.0, b=0.0)
    if measured and int(nodes) in net.allreduce_tables:
        _lookup(algo, opts)
        return MeasuredCost(points=net.allreduce_tables[int(nodes)])
    return allreduce_linear(algo, nodes, net, **opts)
