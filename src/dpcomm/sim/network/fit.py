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
2. **Achievable rates and the latency of a bandwidth-bound call**, from the rows of 64 MiB and up
   (:data:`LARGE`): the NIC fraction (``nic_eff``), the intra-server fraction (``intra_eff``, the only
   one on one server) and a factor on NCCL's latency of an LL128 or Simple call (``lat_scale``, from 0
   to as much as makes that latency the fastest large row's time) that make the model's squared log
   errors on those rows least: first the NIC fraction so that their mean is zero (bisection: time falls
   as a fraction rises), then each in turn by golden-section search, twice (one whose change does not
   help is kept). Why a latency of its own: NCCL's model has one per protocol, the small rows run LL,
   and a large row's fixed cost (1.8 ms on the p4d ring of docs/netsim.md, whose time is ~1.8 ms +
   S / 18 GB/s from 64 MiB to 1 GiB) is not the LL start-up. Fractions stay in (0, 1]: a table faster
   than the line rate is fitted at 1 and its error stays visible.
3. **The algorithm**, where the log forced none (nccl-tests logs do not say what ran): NCCL's own choice
   and each algorithm the fabric has (``nccl-ring``, ``nccl-tree``, ``nccl-nvlstree``, ...,
   :func:`candidates`) are fitted as above, and the one with the least squared log error is kept,
   written into the topology as ``algo=`` (as if it were the cluster's ``NCCL_ALGO``; the cluster's NCCL
   version may choose differently from the tuning model read here). NCCL's own choice is the default: a
   forced algorithm replaces it only where its rms log error on the large rows is lower by more than
   ``TIE_RMS`` (0.5 percentage points, nccl-tests' run-to-run spread there) and below ``TIE_RATIO`` (0.9)
   of NCCL's choice's (:func:`clearly_better`); within that the two explain the table equally.
   Where the best fit still needs a fraction at 1, twice the ring's or tree's channels are tried too
   (``channels=``: NCCL's search makes a channel per NIC where a GPU has several, which this model's
   simplification joins; more channels lift NCCL's per-channel caps), kept only where that halves the
   squared error.

4. **Size ranges**, only where the above leaves a row of 64 MiB and up more than 5% off: as NCCL's tuner
   plugin takes them, 2, else 3, contiguous ranges of the large rows, each with its own algorithm,
   channels and latency factor, and its own fractions only where those are not enough (:mod:`.fit_ranges`;
   written as ``ranges=``, :mod:`dpcomm.topology.size_ranges`). Fitting, not validation: a range is kept
   because it reproduces the rows it was fitted on; the held-out comparison of docs/netsim.md uses none.
5. **Every row**: per-size factors on the model so fitted, monotone in size by construction
   (:mod:`.fit_rows`: the table's isotonic fit, the model's shape between its sizes), so the file prices
   each measured size as measured wherever the log's time grows with size, and says where it does not.

The result names the fitted topology (a ``gpus:`` spec with ``nic_eff=``, ``intra_eff=`` and what else was
fitted: ``lat_scale=``, ``algo=``, ``channels=``, ``ranges=``), every row's measured and predicted time, and
how much the large rows' time answers to each fraction and to ``lat_scale`` (``sensitivity``);
:func:`apply_fit` puts all of it on the count it was fitted on, and on other counts of the cluster what
describes the fabric (:mod:`.fit_apply`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpcomm.errors import UserError
from dpcomm.sim.network import fit_rows
from dpcomm.sim.network.algorithms import simulate_allreduce
from dpcomm.sim.network.engine import FlowModel
from dpcomm.sim.network.fabric import make_fabric
from dpcomm.sim.network.fit_apply import apply_fit, mismatch
from dpcomm.sim.network.nccl_tests import NcclTestsLog
from dpcomm.sim.network.nccl_tuning import algorithms_for, graph
from dpcomm.sim.network.pricing import default_model
from dpcomm.topology.multigpu import MultiGPU, is_multigpu_spec, parse_multigpu
from dpcomm.topology.size_ranges import ranges_to_json

__all__ = [
    "LARGE",
    "SMALL",
    "TIE_RATIO",
    "TIE_RMS",
    "FabricFit",
    "alpha_for",
    "apply_fit",
    "candidates",
    "clearly_better",
    "mismatch",
    "fit_nccl_tests",
    "startup_s",
]

SMALL = 64 * 1024
"""Rows up to this size (bytes) are latency-bound: they give the start-up."""
LARGE = 64 << 20
"""Rows from this size (bytes) are bandwidth-bound: they give the achievable rates."""
_NIC_RATE = 10e9  # bits/s for a gpus: spec without nic= (the fit needs a rate; calibrate asks for one)
_LOW = 0.02  # the least fraction the fit tries
_MAX_LAT_SCALE = 1e4  # the most lat_scale may be (MultiGPU's own bound)
_GOLDEN_STEPS = 18  # golden-section steps: 0.618^18 = 1.7e-4 of the range
_FULL_FITS = 3  # candidates fitted in full after the quick ranking
_TOL = 0.05  # the worst error on a large row that needs size ranges (fit_ranges.TOL)
TIE_RMS, TIE_RATIO = 0.005, 0.9  # a forced algorithm must beat NCCL's choice's rms by both (point 3)


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
    """``(bytes, measured s, predicted s)`` of every row, after the fit (its per-size factors included)."""
    fitted_on: str = ""
    """The ``--topology`` the fit was asked for (``p4d:2``), as the user wrote it."""
    forced: tuple[str | None, str | None] | None = None
    """``(algorithm, protocol)`` the log (or ``--algo``) forced, None where nothing was."""
    model_rows: tuple[float, ...] = ()
    """The fitted physical model's seconds at each row, before the per-size factors (where it misses)."""
    tried: dict[str, float] = dataclasses.field(default_factory=dict)
    """Each algorithm fitted, and the root-mean-square log error of its fit on the large rows."""
    sensitivity: dict[str, float] = dataclasses.field(default_factory=dict)
    """How much the large rows' time answers to each fraction and ``lat_scale`` (:mod:`.fit_scope`)."""
    need: dict[str, float] = dataclasses.field(default_factory=dict)
    """How much worse the fit is with each set back to the topology's own (:mod:`.fit_scope`)."""

    def errors(self, least: int = LARGE) -> list[float]:
        """``predicted / measured - 1`` of the rows of at least ``least`` bytes."""
        return [p / m - 1 for n, m, p in self.rows if n >= least]

    def to_dict(self) -> dict:
        """The network file's ``fabric`` block (:func:`apply_fit` reads it back)."""
        t = self.topology
        return {
            "topology": t.spec,
            "fitted_on": self.fitted_on,
            "algorithm": self.algorithm,
            "nic_eff": t.nic_fraction,
            "intra_eff": t.intra_eff,
            "algo": t.algo,
            "lat_scale": t.lat_scale,
            "channels": t.channels,
            "alpha_s": self.alpha_s,
            "startup_s": self.startup_s,
            "gpus_per_server": t.gpus,
            "nccl_version": t.nccl,
            "net_plugin": t.net_plugin,
            "forced": {"algo": self.forced[0], "proto": self.forced[1]} if self.forced else None,
            "sensitivity": {k: round(v, 4) for k, v in self.sensitivity.items()},
            "need": {k: round(v, 5) for k, v in self.need.items()},
            **({"proto": t.proto} if t.proto else {}),
            **({"ranges": ranges_to_json(t.ranges)} if t.ranges else {}),
            **(
                {"row_algo": t.row_algo, "row_factors": [[n, c] for n, c in t.row_factors]}
                if t.row_factors
                else {}
            ),
            "residuals": [
                {"bytes": n, "measured_s": m, "model_s": g0, "fitted_s": g, "error": g / m - 1}
                for (n, m, g), g0 in zip(self.rows, self.model_rows or [None] * len(self.rows), strict=True)
            ],
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
        if hi / lo < 1 + 1e-4:
            break
    return dataclasses.replace(topo, **{key: (lo * hi) ** 0.5})


def _golden(topo: MultiGPU, key: str, algo, alpha, p, rows, hi: float = 1.0) -> MultiGPU:
    """``topo`` with ``key`` set to the least sum of squared log errors on ``rows`` (golden-section search
    over ``[_LOW, 1]`` in log space for a fraction, over ``[0, hi]`` for ``lat_scale``), where that beats
    the value it has."""

    def value(x: float) -> float:
        return x if key == "lat_scale" else math.exp(x)

    def sse(v: float | None) -> float:
        return float((_logs(dataclasses.replace(topo, **{key: v}), algo, alpha, p, rows) ** 2).sum())

    a, b = (0.0, hi) if key == "lat_scale" else (math.log(_LOW), 0.0)
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = sse(value(c)), sse(value(d))
    for _ in range(_GOLDEN_STEPS):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = sse(value(c))
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = sse(value(d))
    best = value((a + b) / 2)
    now = topo.nic_fraction if key == "nic_eff" else getattr(topo, key)
    return dataclasses.replace(topo, **{key: best}) if sse(best) < sse(now) else topo


def _lat_room(topo: MultiGPU, algo, alpha, p, large) -> float:
    """The most ``lat_scale`` can be: NCCL's latency times it at most the fastest large row's time."""
    n, t = min(large)
    t0, t1 = (_predict(dataclasses.replace(topo, lat_scale=x), algo, alpha, p, [n])[0] for x in (0.0, 1.0))
    return min(_MAX_LAT_SCALE, t / (t1 - t0)) if t1 > t0 else 0.0


def _fit_one(topo: MultiGPU, algo: str, p: int, small, large, quick: bool = False):
    """``(topology, alpha, start-up, sse)`` of one algorithm fitted to the rows (module docstring);
    ``quick``: one pass (the NIC fraction and the latency only), to rank the candidates."""
    alpha = start = None
    keys = ("nic_eff", "intra_eff") if topo.hosts > 1 else ("intra_eff",)
    for _ in range(1 if quick or len(small) < 2 else 2):  # the start-up depends a little on the rates
        if len(small) >= 2:
            start = startup_s(small)
            alpha = alpha_for(topo, algo, p, min(n for n, _ in small), start)
        topo = _bisect(topo, keys[0], algo, alpha, p, large)
        for _ in range(1 if quick else 2):
            topo = _golden(topo, "lat_scale", algo, alpha, p, large, _lat_room(topo, algo, alpha, p, large))
            for key in () if quick else reversed(keys):
                topo = _golden(topo, key, algo, alpha, p, large)
    return topo, alpha, start, float((_logs(topo, algo, alpha, p, large) ** 2).sum())


def _best(options: dict[str, tuple[str, MultiGPU]], p: int, small, large) -> dict[str, tuple[str, tuple]]:
    """Each option (label: algorithm, topology) ranked by a quick fit, and the best three fitted in full
    (NCCL's own choice always, the default a forced algorithm must beat)."""
    quick = {k: _fit_one(t, a, p, small, large, quick=True)[3] for k, (a, t) in options.items()}
    top = sorted(options, key=lambda k: quick[k])[:_FULL_FITS]
    top += [k for k in options if k == "nccl" and k not in top]
    return {k: (options[k][0], _fit_one(options[k][1], options[k][0], p, small, large)) for k in top}


def clearly_better(sse: float, sse_nccl: float, rows: int) -> bool:
    """Whether a forced algorithm's fit (sum of squared log errors ``sse`` on ``rows`` rows) beats NCCL's own
    choice's (``sse_nccl``) clearly: by :data:`TIE_RMS` and :data:`TIE_RATIO` in rms (module docstring)."""
    rms, rms_nccl = math.sqrt(sse / max(rows, 1)), math.sqrt(sse_nccl / max(rows, 1))
    return rms < rms_nccl - TIE_RMS and rms < TIE_RATIO * rms_nccl


def candidates(topo: MultiGPU) -> tuple[str, ...]:
    """What a table that forced nothing may have run: NCCL's choice, then each algorithm the fabric has."""
    names = {"nvls_tree": "nvlstree", "collnet_direct": "collnet", "collnet_chain": "collnet-chain"}
    return ("nccl", *(f"nccl-{names.get(a, a)}" for a in algorithms_for(topo, _NIC_RATE)))


def fit_nccl_tests(log: NcclTestsLog, spec: str, algo: str | None = None) -> FabricFit:
    """Fit ``spec``'s start-up, achievable rates, bandwidth-bound latency and algorithm to ``log`` (module
    docstring). The log's ranks (where its header lists them) must be ``spec``'s GPUs; a one-line
    :class:`UserError` otherwise."""
    if not is_multigpu_spec(spec):
        raise UserError(
            f"--topology {spec}: a table is fitted on servers of GPUs (gpus:S,G,... or dgx-h100:S)"
        )
    topo = parse_multigpu(spec)
    if topo.nic_bps is None:
        topo = dataclasses.replace(topo, nic_bps=_NIC_RATE)
    p = topo.servers
    for key, got in (("nccl", log.nccl_version), ("net_plugin", log.net_plugin)):
        if got is not None and getattr(topo, key) not in (None, got):
            raise UserError(f"the log ran {got}; --topology {spec} says {key}={getattr(topo, key)}")
        if got is not None:
            topo = dataclasses.replace(topo, **{key: got})
    given = topo
    if log.ranks is not None and log.ranks != p:
        where = f" on {log.hosts} servers" if log.hosts else ""
        raise UserError(f"the table ran on {log.ranks} ranks{where}; --topology {spec} has {p} GPUs")
    if log.hosts is not None and log.ranks == p and log.hosts != topo.hosts:
        raise UserError(f"the table ran on {log.hosts} servers; --topology {spec} has {topo.hosts}")
    if algo is None and log.algorithm:
        algo = f"{log.algorithm}:{log.protocol}" if log.protocol else log.algorithm
    elif algo is None and log.protocol:
        algo = f"nccl:{log.protocol}"
    was_forced = None
    if algo is not None:
        name, _, proto = algo.partition(":")
        was_forced = (name.removeprefix("nccl-") if name != "nccl" else None, proto or None)
        if proto:  # later runs on this fabric take it as NCCL_PROTO
            topo = dataclasses.replace(topo, proto=proto)
    small = [(n, t) for n, t in log.rows if n <= SMALL]
    large = [(n, t) for n, t in log.rows if n >= LARGE]
    if not large:
        raise UserError(f"the table has no row of {LARGE:,} bytes or more: nothing to fit the rates to")
    names = (algo,) if algo is not None else candidates(topo)
    tried = _best({name: (name, topo) for name in names}, p, small, large)
    best = min(tried, key=lambda k: tried[k][1][3])
    if "nccl" in tried and not clearly_better(tried[best][1][3], tried["nccl"][1][3], len(large)):
        best = "nccl"  # a tie keeps NCCL's own choice (module docstring, point 3)
    if max(tried[best][1][0].nic_fraction, tried[best][1][0].intra_eff) > 0.999 and topo.channels is None:
        # faster than the fabric's rates allow: NCCL's search may have made twice the channels (one per
        # NIC of several per GPU, say), which lifts its per-channel caps; try that for rings and trees
        more = {}
        for name in names:
            if name.split(":")[0] in ("nccl", "nccl-ring", "nccl-tree"):
                ch = graph(topo, "tree" if name.startswith("nccl-tree") else "ring", _NIC_RATE).channels
                more[f"{name} x{2 * ch}"] = (name, dataclasses.replace(topo, channels=min(2 * ch, 64)))
        more = _best(more, p, small, large) if more else {}
        more_best = min(more, key=lambda k: more[k][1][3], default=None)
        if (
            more_best and more[more_best][1][3] < 0.5 * tried[best][1][3]
        ):  # only where it explains clearly more
            best = more_best
        tried |= more
    name, (topo, alpha, start, _) = tried[best]
    best = name
    forced = best.split(":")[0].removeprefix("nccl-")
    if forced != "nccl" and topo.algo is None:
        topo = dataclasses.replace(topo, algo=forced)  # later runs on this fabric take it as NCCL_ALGO
    got = _predict(topo, best, alpha, p, [n for n, _ in log.rows])
    if any(abs(g / t - 1) >= _TOL for (n, t), g in zip(log.rows, got, strict=True) if n >= LARGE):
        from dpcomm.sim.network import fit_ranges as _ranges

        ranged = _ranges.split(topo, parse_multigpu(spec), names, alpha, p, large)  # point 4
        if ranged is not None:
            topo, best = ranged
            got = _predict(topo, best, alpha, p, [n for n, _ in log.rows])
    model_rows = tuple(got)
    from dpcomm.sim.network.fit_scope import measure

    sensitivity, need = measure(topo, given, best, alpha, p, large)  # what carries to other server counts
    topo = dataclasses.replace(topo, row_factors=tuple(fit_rows.factors(log.rows, got)), row_algo=best)
    got = _predict(topo, best, alpha, p, [n for n, _ in log.rows])  # point 5
    rows = tuple((n, t, g) for (n, t), g in zip(log.rows, got, strict=True))
    fits = {k: math.sqrt(v[1][3] / len(large)) for k, v in tried.items()}
    return FabricFit(
        topology=topo,
        algorithm=best,
        alpha_s=alpha,
        startup_s=start,
        rows=rows,
        tried=fits,
        model_rows=model_rows,
        forced=was_forced,
        fitted_on=spec.strip(),
        sensitivity=sensitivity,
        need=need,
    )
