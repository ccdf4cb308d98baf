"""``dpcomm bench --fit``: the network (alpha, beta, gamma) that best explains measured benchmark rows.

:func:`fit_network` fits the network's ``alpha``, ``beta``, ``gamma`` to measured rows with
:func:`dpcomm.costmodel.fit.fit_least_squares` (relative residuals, weights ``1/t^2``: times span decades;
every parameter ``>= 0``), each row predicted by its algorithm's formula in :mod:`dpcomm.costmodel` (linear
in alpha, beta, gamma; LP with the block it actually ran). The fit uses the algorithms whose formula
describes one link per rank (``ring``, ``lp``, ``mst``, ``be``, ``ps``); ``bcube`` (its formula assumes
``k`` NICs) and ``native`` (costed as ring / binomial tree, a stand-in for gloo's own) are scored against
the fitted network but do not steer it; ``auto`` and ``noop`` have no formula. Each algorithm's own
one-algorithm fit is reported alongside: it says whether the formula's *shape* fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcomm.collectives.benchmark import Row
from dpcomm.costmodel.collective import ALGORITHMS, collective_cost
from dpcomm.costmodel.fit import fit_least_squares
from dpcomm.costmodel.lp import lp_optimal_block
from dpcomm.costmodel.network import Network, resolve_network
from dpcomm.errors import UserError
from dpcomm.topology import bcube_shape

__all__ = ["FIT_ALGOS", "FitReport", "features", "fit_network"]

FIT_ALGOS = ("ring", "lp", "mst", "be", "ps")
"""Algorithms whose formula models one link per rank: these set the fitted network."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    """How well one algorithm's formula predicts its own rows."""

    algo: str
    rows: int
    in_fit: bool
    """Whether its rows set the joint network."""
    median_rel_err: float
    """Median ``|predicted - measured| / measured`` with the joint network."""
    max_rel_err: float
    own_median_rel_err: float
    """The same with alpha, beta, gamma fitted to this algorithm's rows alone (NaN if < 2 rows)."""


def features(op: str, algo: str, nbytes: int, nodes: int, block_bytes: int | None) -> np.ndarray | None:
    """``(dT/d alpha, dT/d beta, dT/d gamma)`` of ``algo``'s formula, which is linear in them (LP with the
    block it ran with: ``block_bytes``, or LP's default, the optimum for its default network ``10gbe``)."""
    if algo not in ALGORITHMS:
        return None
    opts: dict[str, Any] = {}
    if algo == "bcube":
        n, k = bcube_shape(nodes)
        opts = {"n": n, "k": k}
    if algo == "lp":
        opts = {"block_bytes": block_bytes or lp_optimal_block(nbytes, nodes, resolve_network("10gbe"), op)}
    units = [Network(name="unit", alpha=a, beta=b, gamma=g) for a, b, g in ((1, 0, 0), (0, 1, 0), (0, 0, 1))]
    return np.array([collective_cost(op, algo, nbytes, nodes, u, **opts) for u in units])


def _nnls_relative(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.array(fit_least_squares(a, t, weighting="relative", nonneg=True).coef)


def fit_network(rows: list[Row] | tuple[Row, ...], name: str = "bench-fit", block_bytes: int | None = None):
    """Fit ``Network(alpha, beta, gamma)`` to measured rows; returns ``(network, [FitReport per algo])``.

    ``block_bytes`` is the LP block the rows were measured with (None: LP's default optimum).
    """
    usable = []
    for r in rows:
        if r.nproc < 2 or r.bytes == 0 or r.time_s <= 0:
            continue
        f = features(r.op, r.algo, r.bytes, r.nproc, block_bytes)
        if f is not None and f.any():
            usable.append((r, f))
    fit_rows = [(r, f) for r, f in usable if r.algo in FIT_ALGOS] or usable
    if len(fit_rows) < 2:
        raise UserError("--fit needs at least two measured rows with P >= 2 and bytes > 0")
    A = np.array([f for _, f in fit_rows])
    t = np.array([r.time_s for r, _ in fit_rows])
    alpha, beta, gamma = _nnls_relative(A, t)
    fit_algos = sorted({r.algo for r, _ in fit_rows})
    net = Network(
        name=name,
        alpha=float(alpha),
        beta=float(beta),
        gamma=float(gamma),
        source=f"dpcomm bench --fit: {len(fit_rows)} rows of {', '.join(fit_algos)}",
    )
    reports = []
    for algo in dict.fromkeys(r.algo for r, _ in usable):
        mine = [(r, f) for r, f in usable if r.algo == algo]
        Am = np.array([f for _, f in mine])
        tm = np.array([r.time_s for r, _ in mine])
        err = np.abs(Am @ np.array([alpha, beta, gamma]) - tm) / tm
        own = np.abs(Am @ _nnls_relative(Am, tm) - tm) / tm if len(mine) >= 2 else np.array([math.nan])
        reports.append(
            FitReport(
                algo=algo,
                rows=len(mine),
                in_fit=any(r.algo == algo for r, _ in fit_rows),
                median_rel_err=float(np.median(err)),
                max_rel_err=float(err.max()),
                own_median_rel_err=float(np.median(own)),
            )
        )
    return net, reports
