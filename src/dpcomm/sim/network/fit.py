"""Fit a multi-GPU fabric to a cluster's own nccl-tests table: its start-up and its achievable rates.

``fit_nccl_tests(log, "dgx-h100:2")`` (``dpcomm calibrate --from-nccl-tests``) keeps the topology's shape
(servers, GPUs, NICs, line rates) and fits what a datasheet cannot say:

1. **Start-up**, from the latency-bound rows (8 B to 64 KiB; :data:`SMALL`): the least-squares line ``t =
   a + S/b`` through them gives the start-up at the smallest size, and ``alpha`` (per message, as
   ``--alpha-us``) is set so that the algorithm's all-reduce of that size takes that long. A schedule's
   time is linear in alpha, ``t0 + k alpha`` (``k``: its messages in sequence), so ``alpha = (t_meas -
   t0) / k`` with ``t0`` and ``t0 + k`` priced at alpha 0 and 1 (:func:`alpha_for`). This is the one place
   a collective's measured latency becomes a per-message start-up: typing nccl-tests' 8-byte latency as
   ``--alpha-us`` would charge it once per message (2 (P-1) times on a ring: 16-30x too much). Without
   such rows the start-up stays NCCL's latency model.
2. **Achievable rates**, from the bandwidth-bound rows (64 MiB and up; :data:`LARGE`): the NIC fraction
   (``nic_eff``) and the intra-server fraction (``intra_eff``, the only one on one server) that make the
   model's squared log errors on those rows least: first the NIC fraction so that their mean is zero
   (bisection: time falls as a fraction rises), then each fraction in turn by golden-section search, twice
   (a fraction whose change does not help is kept). Fractions stay in (0, 1]: a table faster than the
   line rate is fitted at 1 and its error stays visible. What NCCL picks depends on the fractions (its
   model reads the speeds), so the fit prices the algorithm as picked on the fitted fabric.

The result names the fitted topology (a ``gpus:`` spec with ``nic_eff=`` and ``intra_eff=``) and every
row's measured and predicted time, so the caller can show how well it fits; :func:`apply_fit` puts a
fitted file's fractions on another size of the same cluster.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpcomm.errors import UserError
from dpcomm.sim.network.algorithms import simulate_allreduce
from dpcomm.sim.network.engine import FlowModel
from dpcomm.sim.network.fabric import make_fabric
from dpcomm.sim.network.nccl_tests import NcclTestsLog
from dpcomm.sim.network.pricing import default_model
from dpcomm.topology.multigpu import MultiGPU, is_multigpu_spec, parse_multigpu

__all__ = ["LARGE", "SMALL", "FabricFit", "alpha_for", "apply_fit", "fit_nccl_tests", "startup_s"]

SMALL = 64 * 1024
"""Rows up to this size (bytes) are latency-bound: they give the start-up."""
LARGE = 64 << 20
"""Rows from this size (bytes) are bandwidth-bound: they give the achievable rates."""
_NIC_RATE = 10e9  # bits/s for a gpus: spec without nic= (the fit needs a rate; calibrate asks for one)
_LOW = 0.02  # the least fraction the fit tries


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FabricFit:
    """A fabric fitted to one nccl-tests table."""

    topology: MultiGPU
    """The given topology with the fitted ``nic_eff`` and ``intra_eff``."""
    algorithm: str
    """The algorithm priced (``nccl``: NCCL's choice; ``nccl-ring``, ... where the run forced one)."""
    alpha_s: float | None
    """Fitted start-up per message, seconds (None: no latency-bound rows; NCCL's latency model stays)."""
    startup_s: float | None
    """The measured start-up it was fitted to: the small rows' line at the smallest size, seconds."""
    rows: tuple[tuple[int, float, float], ...]
    """``(bytes, measured s, predicted s)`` of every row, after the fit."""

    def errors(self, least: int = LARGE) -> list[float]:
        """``predicted / measured - 1`` of the rows of at least ``least`` bytes."""
        return [p / m - 1 for n, m, p in self.rows if n >= least]

    def to_dict(self) -> dict:
        """The network file's ``fabric`` block (:func:`apply_fit` reads it back)."""
        t = self.topology
        return {
            "topology": t.spec,
            "algorithm": self.algorithm,
            "nic_eff": t.nic_fraction,
            "intra_eff": t.intra_eff,
            "alpha_s": self.alpha_s,
            "startup_s": self.startup_s,
            "gpus_per_server": t.gpus,
        }


def startup_s(rows: list[tuple[int, float]]) -> float:
    """Seconds at the smallest size of the least-squares line ``t = a + S/b`` through ``rows``."""
    x = np.array([n for n, _ in rows], dtype=float)
    y = np.array([t for _, t in rows])
    if len(set(x.tolist())) < 2:
        return float(y.mean())
    slope, a = np.polyfit(x, y, 1)
    return float(max(a + slope * x.min(), 0.0))


def alpha_for(topo: MultiGPU, algo: str, p: int, nbytes: int, t_meas: float) -> float:
    """The start-up per message at which ``algo``'s all-reduce of ``nbytes`` on ``p`` ranks takes
    ``t_meas`` seconds (module docstring, point 1); 0 where even alpha 0 is slower."""
    fabric = make_fabric(topo, _NIC_RATE)
    t0, t1 = (simulate_allreduce(FlowModel(fabric, a), algo, nbytes, ranks=p)[0].time_s for a in (0.0, 1.0))
    return max(0.0, (t_meas - t0) / (t1 - t0)) if t1 > t0 else 0.0


def _predict(topo: MultiGPU, algo: str, alpha: float | None, p: int, sizes: list[int]) -> list[float]:
    model = default_model(make_fabric(topo, _NIC_RATE), alpha)
    return [simulate_allreduce(model, algo, n, ranks=p)[0].time_s for n in sizes]


def _logs(topo, algo, alpha, p, rows) -> np.ndarray:
    got = _predict(topo, algo, alpha, p, [n for n, _ in rows])
    return np.log(np.array(got) / np.array([t for _, t in rows]))


def _bisect(topo: MultiGPU, key: str, algo, alpha, p, rows) -> MultiGPU:
    """``topo`` with ``key`` (``nic_eff`` or ``intra_eff``) set so the mean log error is zero (or at 1)."""

    def mean(v: float) -> float:
        return float(_logs(dataclasses.replace(topo, **{key: v}), algo, alpha, p, rows).mean())

    lo, hi = _LOW, 1.0
    if mean(hi) >= 0 or mean(lo) <= 0:
        return dataclasses.replace(topo, **{key: hi if mean(hi) >= 0 else lo})
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if mean(mid) > 0 else (lo, mid)
        if hi / lo < 1 + 1e-6:
            break
    return dataclasses.replace(topo, **{key: (lo * hi) ** 0.5})


def _golden(topo: MultiGPU, key: str, algo, alpha, p, rows) -> MultiGPU:
    """``topo`` with ``key`` set to the least sum of squared log errors on ``rows`` (golden-section search
    in log space over ``[_LOW, 1]``), where that beats the value it has."""

    def sse(v: float) -> float:
        return float((_logs(dataclasses.replace(topo, **{key: v}), algo, alpha, p, rows) ** 2).sum())

    a, b = math.log(_LOW), 0.0
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = sse(math.exp(c)), sse(math.exp(d))
    for _ in range(30):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = sse(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = sse(math.exp(d))
    best = math.exp((a + b) / 2)
    now = getattr(topo, key) if key == "intra_eff" else topo.nic_fraction
    return dataclasses.replace(topo, **{key: best}) if sse(best) < sse(now) else topo


def fit_nccl_tests(log: NcclTestsLog, spec: str, algo: str | None = None) -> FabricFit:
    """Fit ``spec``'s start-up and achievable rates to ``log`` (module docstring). The log's ranks (where
    its header lists them) must be ``spec``'s GPUs; a one-line :class:`UserError` otherwise."""
    if not is_multigpu_spec(spec):
        raise UserError(
            f"--topology {spec}: a table is fitted on servers of GPUs (gpus:S,G,... or dgx-h100:S)"
        )
    topo = parse_multigpu(spec)
    if topo.nic_bps is None:
        topo = dataclasses.replace(topo, nic_bps=_NIC_RATE)
    p = topo.servers
    if log.ranks is not None and log.ranks != p:
        where = f" on {log.hosts} servers" if log.hosts else ""
        raise UserError(f"the table ran on {log.ranks} ranks{where}; --topology {spec} has {p} GPUs")
    if log.hosts is not None and log.ranks == p and log.hosts != topo.hosts:
        raise UserError(f"the table ran on {log.hosts} servers; --topology {spec} has {topo.hosts}")
    if algo is None:
        algo = log.algorithm or "nccl"
        if log.protocol:
            algo = f"{algo}:{log.protocol}"
    small = [(n, t) for n, t in log.rows if n <= SMALL]
    large = [(n, t) for n, t in log.rows if n >= LARGE]
    if not large:
        raise UserError(f"the table has no row of {LARGE:,} bytes or more: nothing to fit the rates to")
    alpha = start = None
    for _ in range(2):  # the start-up depends a little on the rates (the smallest size's flow time)
        if len(small) >= 2:
            start = startup_s(small)
            alpha = alpha_for(topo, algo, p, min(n for n, _ in small), start)
        keys = ("nic_eff", "intra_eff") if topo.hosts > 1 else ("intra_eff",)
        topo = _bisect(topo, keys[0], algo, alpha, p, large)
        for _ in range(2):
            for key in reversed(keys):
                topo = _golden(topo, key, algo, alpha, p, large)
    got = _predict(topo, algo, alpha, p, [n for n, _ in log.rows])
    rows = tuple((n, t, g) for (n, t), g in zip(log.rows, got, strict=True))
    return FabricFit(topology=topo, algorithm=algo, alpha_s=alpha, startup_s=start, rows=rows)


def apply_fit(topo: MultiGPU, fabric: dict) -> MultiGPU:
    """``topo`` with a network file's fitted fractions (its ``fabric`` block), where its servers have as
    many GPUs as the fitted ones (another server count of the same cluster); else a UserError."""
    want = fabric.get("gpus_per_server")
    if want is not None and want != topo.gpus:
        raise UserError(
            f"the network file was fitted on servers of {want} GPUs, the topology has {topo.gpus} per server"
        )
    return dataclasses.replace(topo, nic_eff=float(fabric["nic_eff"]), intra_eff=float(fabric["intra_eff"]))
