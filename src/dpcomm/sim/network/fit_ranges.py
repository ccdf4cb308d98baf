"""Size ranges for a table one set of fitted values does not reproduce, as NCCL's tuner plugin takes them.

NCCL chooses its algorithm, protocol and channels per message size, and its tuner plugin interface takes
exactly such a table (``ext-tuner/example``'s ``nccl_tuner.conf``: a size range -> algorithm, protocol,
channels). Where calibrate's one-piece fit (:mod:`.fit`) leaves a row of 64 MiB and up more than 5% off,
:func:`split` cuts the table's large rows into 2, else 3, contiguous ranges (boundaries at measured sizes,
each of at least 2 rows where the table has enough) and fits each range on its own, from the fewest free
values up:

A. **what NCCL runs there**: each range's algorithm (the same candidates as the one-piece fit: NCCL's
   choice and each algorithm the fabric has, or only the one the log forced; twice the model's ring or
   tree channels, kept where that halves the range's squared log error) and its factor on NCCL's latency
   of a bandwidth-bound call (``lat_scale``, from 0 to as much as makes that latency the range's fastest
   row's time), on the one-piece fit's achievable fractions. A call's time is linear in ``lat_scale``
   (the factor multiplies a latency added to a flow time that does not depend on it), so each candidate
   is priced twice per row (factor 0 and 1) and each range's factor is a search on those numbers;
B. **its own achievable fractions**, only for a range of at least 2 rows that A leaves more than 5% off:
   one fraction (the NIC's or the intra-server one, whichever fits better), and on 3 rows or more both
   where one is not enough, so that a range never has more free values than rows; each fraction by
   golden-section search with the best factor at each value, for the candidates A fitted best (up to 3,
   in that order; the first that comes within 5% is kept). Fractions stay in (0, 1].

A range of 1 row (its algorithm and factor only) is tried only where no cut into as many ranges of 2
rows or more does. The fewest ranges that bring every large row within 5% win (among those, the least
sum of squared log errors); where no cut of at most 3 does, the one-piece fit stays. The first range's
values are the spec's own (they price every size below the second range, and the small sizes too); the
others are written as ``ranges=`` (:mod:`dpcomm.topology.size_ranges`). This is fitting, not validation: a
range is chosen because it reproduces the rows it was fitted on.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from dpcomm.sim.network import fit as _fit
from dpcomm.sim.network.nccl_tuning import graph
from dpcomm.topology.multigpu import MultiGPU
from dpcomm.topology.size_ranges import SizeRange

__all__ = ["MOST", "TOL", "split"]

TOL = _fit._TOL
"""The worst error (``predicted / measured - 1``) a fit must reach on every row of 64 MiB and up."""
MOST = 3
"""Most ranges."""
_STEPS = 48  # golden-section steps on lat_scale: 0.618^48 = 1e-10 of the range
_B_CANDIDATES = 3  # tier B fits the fractions of the candidates that tier A fitted best
_FRACTION_STEPS = 14  # golden-section steps on a fraction: 0.618^14 = 1.2e-3 of log(1/0.02), 0.5%


@dataclasses.dataclass(frozen=True, slots=True)
class _Candidate:
    label: str  # "nccl-ring x16"
    name: str  # what is priced: "nccl", "nccl-ring", "nccl-ring:LL128"
    topo: MultiGPU  # with the candidate's channels
    a: np.ndarray  # seconds per large row at lat_scale 0
    b: np.ndarray  # seconds per large row per unit of lat_scale


@dataclasses.dataclass(frozen=True, slots=True)
class _Range:
    lo: int  # first row (index into the large rows)
    hi: int  # one past the last
    cand: _Candidate
    topo: MultiGPU  # the range's values (lat_scale, channels, fractions)
    sse: float
    worst: float  # the largest |predicted / measured - 1| on its rows


def _sig(x: float) -> float:
    """``x`` to 4 significant digits (the written spec is then exactly what was priced)."""
    return float(f"{x:.4g}")


def _candidates(topo: MultiGPU, names, alpha, p, sizes) -> list[_Candidate]:
    out = []
    for name in names:
        options = [(name, topo.channels)]
        if name.split(":")[0] in ("nccl", "nccl-ring", "nccl-tree") and topo.channels is None:
            ch = graph(topo, "tree" if name.startswith("nccl-tree") else "ring", _fit._NIC_RATE).channels
            options.append((f"{name} x{min(2 * ch, 64)}", min(2 * ch, 64)))
        for label, ch in options:
            t = dataclasses.replace(topo, channels=ch, lat_scale=0.0)
            a = np.array(_fit._predict(t, name, alpha, p, sizes))
            b = np.array(_fit._predict(dataclasses.replace(t, lat_scale=1.0), name, alpha, p, sizes)) - a
            out.append(_Candidate(label, name, t, a, np.maximum(b, 0.0)))
    return out


def _scale(a: np.ndarray, b: np.ndarray, m: np.ndarray) -> tuple[float, float]:
    """``(lat_scale, sse)``: the factor in ``[0, room]`` with the least squared log error of ``a + s b``
    against ``m`` (room: the factor that makes the latency the fastest row's time)."""

    def sse(s: float) -> float:
        return float((np.log((a + s * b) / m) ** 2).sum())

    room = min(_fit._MAX_LAT_SCALE, m[0] / b[0]) if b[0] > 0 else 0.0
    lo, hi = 0.0, room
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(_STEPS if room > 0 else 0):
        c, d = hi - phi * (hi - lo), lo + phi * (hi - lo)
        lo, hi = (lo, d) if sse(c) < sse(d) else (c, hi)
    s = min(_sig((lo + hi) / 2), room)
    s = 0.0 if s < 1e-6 * max(room, 1.0) else s  # none, not 1e-10
    return s, sse(s)


def _fits(cands: list[_Candidate], m: np.ndarray, lo: int, hi: int) -> list[_Range]:
    """Each candidate on rows ``lo:hi`` with its best factor (tier A)."""
    out = []
    for c in cands:
        s, e = _scale(c.a[lo:hi], c.b[lo:hi], m[lo:hi])
        worst = float(np.abs((c.a[lo:hi] + s * c.b[lo:hi]) / m[lo:hi] - 1).max())
        out.append(_Range(lo, hi, c, dataclasses.replace(c.topo, lat_scale=s), e, worst))
    return out


def _sse(f: _Range) -> float:
    return max(f.sse, 1e-8)  # below 1e-8 (0.01% rms) all fits are exact: the first candidate wins


def _best(fits: list[_Range]) -> _Range:
    """The least error (NCCL's own choice where a forced algorithm is not clearly better, as in
    :func:`.fit.clearly_better`, and where it too is within :data:`TOL` if that one is; doubled channels
    only where they halve it)."""
    best = min((f for f in fits if " x" not in f.cand.label), key=_sse, default=None)
    own = next((f for f in fits if f.cand.label.split(":")[0] == "nccl"), None)
    if best is not None and own is not None and (own.worst < TOL or best.worst >= TOL):
        best = best if _fit.clearly_better(_sse(best), _sse(own), best.hi - best.lo) else own
    more = min((f for f in fits if " x" in f.cand.label), key=_sse, default=None)
    if best is None or more is not None and _sse(more) < 0.5 * _sse(best):
        return more
    return best


def _range_b(fits: list[_Range], hosts: int, alpha, p, rows) -> _Range:
    """Tier B: the range's own factor and one fraction (the better of the NIC's and the intra-server one),
    then, on 3 rows or more and where that is not enough, both; for the candidates in the order of tier A's
    error, the first that comes within :data:`TOL` (else the closest of :data:`_B_CANDIDATES`)."""
    seg = rows[fits[0].lo : fits[0].hi]
    options = [("nic_eff",), ("intra_eff",)] if hosts > 1 else [("intra_eff",)]
    both = [("nic_eff", "intra_eff")] if hosts > 1 and len(seg) >= 3 else []
    out = []
    for r in sorted(fits, key=_sse)[:_B_CANDIDATES]:
        best = r
        for keys in [*options, *both]:
            if len(keys) == 2 and best.worst < TOL:
                break  # one fraction was enough
            got = _own(r, keys, alpha, p, seg)
            best = got if (got.worst < TOL, -got.sse) > (best.worst < TOL, -best.sse) else best
        if best.worst < TOL:
            return best
        out.append(best)
    return min(out, key=lambda r: r.worst)


def _own(r: _Range, keys: tuple[str, ...], alpha, p, seg) -> _Range:
    """The range fitted with its own ``keys`` (fractions) and factor: golden-section search on each
    fraction in turn (in log space over ``[_LOW, 1]``, twice where two), each value priced with its best
    factor (two prices a row, as in tier A)."""
    sizes, m = [n for n, _ in seg], np.array([t for _, t in seg])

    def fitted(t: MultiGPU) -> tuple[MultiGPU, float]:
        a = np.array(_fit._predict(dataclasses.replace(t, lat_scale=0.0), r.cand.name, alpha, p, sizes))
        b = np.array(_fit._predict(dataclasses.replace(t, lat_scale=1.0), r.cand.name, alpha, p, sizes)) - a
        s, e = _scale(a, np.maximum(b, 0.0), m)
        return dataclasses.replace(t, lat_scale=s), e

    best, err = fitted(r.topo)
    phi = (math.sqrt(5) - 1) / 2
    for key in keys * len(keys):

        def sse(x: float, key: str = key, t: MultiGPU = best) -> float:
            return fitted(dataclasses.replace(t, **{key: math.exp(x)}))[1]

        lo, hi = math.log(_fit._LOW), 0.0
        c, d = hi - phi * (hi - lo), lo + phi * (hi - lo)
        fc, fd = sse(c), sse(d)
        for _ in range(_FRACTION_STEPS):
            if fc < fd:
                hi, d, fd = d, c, fc
                c = hi - phi * (hi - lo)
                fc = sse(c)
            else:
                lo, c, fc = c, d, fd
                d = lo + phi * (hi - lo)
                fd = sse(d)
        got, e = fitted(dataclasses.replace(best, **{key: min(1.0, _sig(math.exp((lo + hi) / 2)))}))
        if e < err:
            best, err = got, e
    logs = _fit._logs(best, r.cand.name, alpha, p, seg)
    return _Range(r.lo, r.hi, r.cand, best, float((logs**2).sum()), float(np.abs(np.expm1(logs)).max()))


def _cuts(n: int, k: int, least: int):
    """Row indices where ranges 2..k start: contiguous, each of at least ``least`` rows."""
    for cut in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cut, n)
        if all(b - a >= least for a, b in zip(edges, edges[1:], strict=False)):
            yield edges


def split(topo: MultiGPU, given: MultiGPU, names, alpha, p: int, large) -> tuple[MultiGPU, str] | None:
    """``(topology with ranges, algorithm name to price it with)`` of the fewest ranges (2 or 3) that bring
    every row of ``large`` within :data:`TOL` (module docstring), ``topo`` the one-piece fit (its fractions
    are tier A's) and ``given`` the topology as the user gave it; None where no cut does."""
    rows = sorted(large)
    n, m = len(rows), np.array([t for _, t in sorted(large)])
    if n < 2:
        return None
    rounded = {k: _sig(getattr(topo, k)) for k in ("nic_eff", "intra_eff") if getattr(topo, k) is not None}
    base = dataclasses.replace(topo, algo=given.algo, channels=given.channels, ranges=(), **rounded)
    cands = _candidates(base, names, alpha, p, [s for s, _ in rows])
    tier_a: dict[tuple[int, int], list[_Range]] = {}
    tier_b: dict[tuple[int, int], _Range] = {}
    for k, least, tier in itertools.product(range(2, MOST + 1), (2, 1), "AB"):
        found = []
        for edges in _cuts(n, k, least):
            if least == 1 and all(b - a > 1 for a, b in zip(edges, edges[1:], strict=False)):
                continue  # tried with 2 rows and more
            for e in zip(edges, edges[1:], strict=False):
                if e not in tier_a:
                    tier_a[e] = _fits(cands, m, *e)
            parts = {e: _best(tier_a[e]) for e in zip(edges, edges[1:], strict=False)}
            if tier == "B":  # the ranges tier A leaves off get their own fractions: fitted ones first
                for lo, hi in sorted(parts, key=lambda e: ((e not in tier_b), e[1] - e[0])):
                    if parts[lo, hi].worst < TOL or hi - lo < 2:
                        continue
                    if (lo, hi) not in tier_b:
                        tier_b[lo, hi] = _range_b(tier_a[lo, hi], topo.hosts, alpha, p, rows)
                    parts[lo, hi] = min(parts[lo, hi], tier_b[lo, hi], key=lambda x: x.worst)
                    if parts[lo, hi].worst >= TOL:
                        break  # this cut does not do: fit no more of its ranges
            if max(r.worst for r in parts.values()) < TOL:
                found.append([parts[e] for e in sorted(parts)])
        if found:
            return _written(min(found, key=lambda ps: sum(r.sse for r in ps)), rows, names)
    return None


def _algo(c: _Candidate, given: MultiGPU) -> str | None:
    name = c.name.split(":")[0]
    return given.algo if name == "nccl" else name.removeprefix("nccl-")


def _written(parts: list[_Range], rows, names) -> tuple[MultiGPU, str]:
    """The first range's values as the spec's own, the others as ``ranges=``; the name to price with:
    the forced one where the log forced one, else ``nccl`` (each range's ``algo=`` narrows it)."""
    first = parts[0].topo
    t0 = dataclasses.replace(first, algo=_algo(parts[0].cand, first), ranges=())
    ranges = []
    for r in parts[1:]:
        t = r.topo
        ranges.append(
            SizeRange(
                from_bytes=rows[r.lo][0],
                algo=_algo(r.cand, first),
                channels=t.channels,
                lat_scale=t.lat_scale,
                nic_eff=t.nic_fraction if t.nic_fraction != t0.nic_fraction else None,
                intra_eff=t.intra_eff if t.intra_eff != t0.intra_eff else None,
            )
        )
    name = names[0] if len(names) == 1 else "nccl"
    return dataclasses.replace(t0, ranges=tuple(ranges)), name
