"""What of a fit to one nccl-tests table describes the fabric rather than the one server count that ran:
two measures per fitted value, written to the network file for :func:`.fit_apply.scope`.

* **Sensitivity** (``fabric.sensitivity``): the mean over the rows of 64 MiB and up of ``|d ln t / d ln
  v|`` at the fitted values, from ``v`` 10% lower, for ``nic_eff``, ``intra_eff`` and ``lat_scale``: 1
  where the rows' time is that link's (or that latency), 0 where it does not answer to it (the NICs of one
  server; NVLink under NIC-bound rows). Above 1 where a step of NCCL's tuning model (a channel speed, an
  algorithm) lies within those 10%.
* **Need** (``fabric.need``): how much worse, in root-mean-square log error on those rows, the fit is with
  that value set back to the topology's own (the preset's, or the spec's), ``lat_scale`` searched again
  where a fraction is set back (it may explain the rows as well: on 2 H100 servers NVLSTree is not NIC-bound
  above 0.75 of the line, and a start-up per message too low for the large calls can pull a fitted NIC
  fraction down where NCCL's latency, ``lat_scale`` 1, explains the rows at the preset's). A value the
  rows answer to but do not need differs from the topology's own only by what else the fit traded it for.

:func:`.fit_apply.scope` carries a fraction (and ``lat_scale``, between counts of several servers) to
another server count where both are large enough: its sensitivity at least ``CARRIES`` (0.25) and its need
more than :data:`.fit.TIE_RMS` (0.5 percentage points, the margin by which a forced algorithm must beat
NCCL's own choice).
"""

from __future__ import annotations

import dataclasses
import math

from dpcomm.sim.network import fit as _fit
from dpcomm.topology.multigpu import MultiGPU

__all__ = ["KEYS", "measure"]

KEYS = ("nic_eff", "intra_eff", "lat_scale")
"""The fitted values that may carry to other server counts."""
_STEP = 0.9  # the sensitivity's step: the value 10% lower


def _value(t: MultiGPU, key: str) -> float | None:
    return t.nic_fraction if key == "nic_eff" else getattr(t, key)


def _rms(t: MultiGPU, algo: str, alpha, p: int, large) -> float:
    return math.sqrt(float((_fit._logs(t, algo, alpha, p, large) ** 2).mean()))


def measure(
    topo: MultiGPU, given: MultiGPU, algo: str, alpha, p: int, large
) -> tuple[dict[str, float], dict[str, float]]:
    """``(sensitivity, need)`` of each of :data:`KEYS` (module docstring): ``topo`` the fitted topology,
    ``given`` the one the fit started from, ``algo`` what prices it, ``large`` the rows of 64 MiB and up."""
    base = _fit._logs(topo, algo, alpha, p, large)
    rms = math.sqrt(float((base**2).mean()))
    sens, need = {}, {}
    for key in KEYS:
        now, own = _value(topo, key), _value(given, key)
        low = _fit._logs(dataclasses.replace(topo, **{key: (now or 0.0) * _STEP}), algo, alpha, p, large)
        sens[key] = abs(float((low - base).mean())) / math.log(1 / _STEP) if now else 0.0
        back = dataclasses.replace(topo, **{key: own})
        if key != "lat_scale":  # the latency of the large calls may explain the rows instead
            room = _fit._lat_room(back, algo, alpha, p, large)
            back = _fit._golden(back, "lat_scale", algo, alpha, p, large, room)
        need[key] = _rms(back, algo, alpha, p, large) - rms if now != own else 0.0
    return sens, need
