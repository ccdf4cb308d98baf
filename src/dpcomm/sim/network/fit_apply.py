"""A fitted network file on a topology: another server count of the cluster it was fitted on
(:func:`apply_fit`), and how a topology differs from that cluster (:func:`mismatch`: hardware, NCCL and
network-plugin versions), which is refused unless the user says ``--force``. The fit itself is
:mod:`.fit`.

**What carries to another server count** (:func:`scope`). At the fitted count the file applies whole. At
another count of the same cluster it carries what describes the fabric, where the fit measured it, and
nothing that describes the one count it ran on:

* an achievable fraction (``nic_eff``, ``intra_eff``) that the fitted rows measured (:mod:`.fit_scope`):
  their time answered to it, ``fabric.sensitivity`` (the mean ``|d ln t / d ln f|`` over the rows of 64
  MiB and up) at least :data:`CARRIES` (a 10% lower fraction made them 2.5% slower or more), and they
  needed it, ``fabric.need`` (how much worse the fit is with the topology's own value, the latency of the
  large calls searched again) above :data:`NEEDS`. A one-server fit never moves the NICs; a fit whose
  rows the NICs bound says little about NVLink, and a value the rows do not need may have absorbed
  anything else the model missed. Files without them: ``nic_eff`` from a fit on several servers,
  ``intra_eff`` from one on one server;
* the latency of a bandwidth-bound call (``lat_scale``, a factor on NCCL's latency formula) where the rows
  measured it as much, and only between counts of several servers (its network hops were in the fit; one
  server's calls cross NVLink alone);
* the algorithm and protocol the log (or ``--algo``) forced, ``fabric.forced``, as the cluster's
  ``NCCL_ALGO``/``NCCL_PROTO``, where that algorithm runs at the count; where it cannot (NVLS on several
  servers, CollNet or NVLSTree on one), NCCL's own choice there;
* not: the start-up per message (``alpha_s``: solved so that the fitted count's own sequence of messages
  takes the measured time; another count's sequence and NCCL's latency formula grow differently with the
  servers, so NCCL's latency model prices the small calls there), an algorithm the fit chose (what NCCL ran
  at the fitted count; it chooses again at another), ``channels`` (its search at that count), size
  ``ranges`` and the per-size factors (``row_factors``: the fitted count's own deviations, its protocol
  switches and pipeline effects among them).
"""

from __future__ import annotations

import dataclasses
import math

from dpcomm.errors import UserError
from dpcomm.topology.multigpu import MultiGPU, is_multigpu_spec, parse_multigpu
from dpcomm.topology.size_ranges import ranges_from_json

__all__ = ["CARRIES", "apply_fit", "carries", "mismatch", "scope", "startup"]

CARRIES = 0.25
"""The least ``fabric.sensitivity`` of a value that carries it to other server counts (module docstring)."""
NEEDS = 0.005
"""The ``fabric.need`` a value must exceed to carry: rms log error, as :data:`.fit.TIE_RMS`."""

_SAME = (
    ("gpus", "GPUs per server"),
    ("intra", "intra-server fabric"),
    ("intra_bps", "intra-server rate"),
    ("nic_count", "NICs per server"),
    ("nic_bps", "NIC rate"),
    ("transport", "transport"),
    ("arch", "GPU generation"),
    ("net", "network"),
    ("nccl", "NCCL version"),
    ("net_plugin", "network plugin"),
)
"""What a fitted file must share with the topology it is applied to (the server count may differ)."""


def _show(key: str, v: object) -> str:
    if key == "intra_bps":
        return f"{v / 8e9:g}GB/s"
    return f"{v / 1e9:g}gbit" if key == "nic_bps" else str(v)


def mismatch(topo: MultiGPU, fabric: dict) -> list[str]:
    """How ``topo`` differs from the topology a network file's ``fabric`` block was fitted on (hardware,
    NCCL and plugin versions; not the server count, nor what the fit sets), as ``"NIC rate 100gbit (file)
    vs 400gbit"`` items; empty where it is the same cluster (or the file names no topology)."""
    spec = fabric.get("topology")
    if not isinstance(spec, str) or not is_multigpu_spec(spec):
        return []
    try:
        fitted = parse_multigpu(spec)
    except UserError:
        return ["its topology, which does not parse"]
    fitted = dataclasses.replace(
        fitted,
        nccl=fitted.nccl or fabric.get("nccl_version"),
        net_plugin=fitted.net_plugin or fabric.get("net_plugin"),
    )
    out = []
    for key, label in _SAME:
        a, b = getattr(fitted, key), getattr(topo, key)
        if a is not None and b is not None and a != b:
            out.append(f"{label} {_show(key, a)} (file) vs {_show(key, b)}")
    return out


def _fitted_hosts(fabric: dict) -> int | None:
    """The server count the file was fitted on (its ``topology``), None where it names none."""
    spec = fabric.get("topology")
    if not isinstance(spec, str) or not is_multigpu_spec(spec):
        return None
    try:
        return parse_multigpu(spec).hosts
    except UserError:
        return None


def _measures(fabric: dict, field: str, where: str) -> dict[str, float] | None:
    got = fabric.get(field)
    if got is None:
        return None
    ok = isinstance(got, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in got.values()
    )
    if not ok:
        raise UserError(f"{where}: field 'fabric.{field}' must map fitted values to numbers, got {got!r}")
    return {str(k): float(v) for k, v in got.items()}


def _forced(fabric: dict, where: str) -> tuple[str | None, str | None]:
    got = fabric.get("forced")
    if got is None:
        return None, None
    if not isinstance(got, dict) or any(not isinstance(got.get(k), str | None) for k in ("algo", "proto")):
        raise UserError(f"{where}: field 'fabric.forced' must be {{algo, proto}}, names or null, not {got!r}")
    return got.get("algo"), got.get("proto")


def _runs(topo: MultiGPU, algo: str) -> bool:
    """Whether NCCL has ``algo`` (an ``algo=`` value) on ``topo``."""
    from dpcomm.sim.network.nccl import ALGOS
    from dpcomm.sim.network.nccl_tuning import graph

    name = ALGOS.get(f"nccl-{algo}")
    return name is not None and graph(topo, name, topo.nic_bps or 10e9) is not None


def scope(topo: MultiGPU, fabric: dict, where: str = "the network file") -> dict[str, object]:
    """The values of a network file's ``fabric`` block that apply on ``topo`` (module docstring): all of
    them at the count it was fitted on (or where it names none); at another count what carries."""
    keys = ("nic_eff", "intra_eff", "alpha_s", "lat_scale", "algo", "proto", "channels", "ranges")
    fitted = _fitted_hosts(fabric)
    if fitted is None or fitted == topo.hosts:
        out = {k: fabric.get(k) for k in keys}
        out["row_factors"], out["row_algo"] = fabric.get("row_factors"), fabric.get("row_algo")
        return out
    sens, need = _measures(fabric, "sensitivity", where), _measures(fabric, "need", where) or {}
    if sens is None:  # a file from before the sensitivities: the fractions the fit's rows must have moved
        sens = {"nic_eff": float(fitted > 1), "intra_eff": float(fitted == 1)}
    algo, proto = _forced(fabric, where)
    across = fitted > 1 and topo.hosts > 1  # both counts' calls cross the network

    def measured(key: str) -> object:
        return fabric.get(key) if sens.get(key, 0.0) >= CARRIES and need.get(key, 1.0) > NEEDS else None

    return {
        "nic_eff": measured("nic_eff"),
        "intra_eff": measured("intra_eff"),
        "alpha_s": None,
        "lat_scale": measured("lat_scale") if across else None,
        "algo": algo if algo and _runs(topo, algo) else None,
        "proto": proto,
    }


def carries(fabric: dict) -> str:
    """What a fitted file gives other server counts of its cluster, in words (:func:`scope`)."""
    fitted = _fitted_hosts(fabric) or 1
    got = scope(dataclasses.replace(parse_multigpu(fabric["topology"]), hosts=fitted + 1), fabric)
    algo, proto = _forced(fabric, "the fit")
    parts = [k for k in ("nic_eff", "intra_eff") if got.get(k) is not None]
    if fitted > 1 and got.get("lat_scale") is not None:
        parts.append("lat_scale (on several servers)")
    took = f"{', '.join(parts)} (what the rows measured)" if parts else "no fitted fraction"
    took += "".join(f", the forced {x} where it runs" for x in (algo, proto) if x)
    here = f"{fitted} server{'s' if fitted > 1 else ''}"
    return (
        f"other server counts take {took}, NCCL's latency model and its own choice; the start-up per "
        f"message, chosen algorithm, channels, ranges and per-size factors stay at {here}"
    )


def startup(topo: MultiGPU, fabric: dict) -> float | None:
    """The start-up per message a fitted file gives ``topo`` (None: NCCL's latency model; :func:`scope`)."""
    return scope(topo, fabric).get("alpha_s")


def apply_fit(
    topo: MultiGPU, fabric: dict, *, force: bool = False, where: str = "the network file"
) -> MultiGPU:
    """``topo`` with what a network file's ``fabric`` block carries to it (:func:`scope`: all of it at the
    count it was fitted on; at another count of that cluster the fabric's own values). A topology of other
    hardware, another NCCL or plugin version (:func:`mismatch`) is a one-line UserError unless ``force``; the
    file's versions are carried where the topology states none."""
    want = fabric.get("gpus_per_server")
    if want is not None and want != topo.gpus:
        raise UserError(
            f"{where} was fitted on servers of {want} GPUs, the topology has {topo.gpus} per server"
        )
    differs = mismatch(topo, fabric)
    if differs and not force:
        raise UserError(
            f"{where} was fitted on {fabric.get('fitted_on') or 'another cluster'}: {'; '.join(differs)}; "
            "give --force to apply its fit anyway"
        )
    got = scope(topo, fabric, where)
    scale, channels = got.get("lat_scale"), got.get("channels")
    ranges = ranges_from_json(got["ranges"], where) if got.get("ranges") is not None else topo.ranges
    try:
        return dataclasses.replace(
            topo,
            nic_eff=float(got["nic_eff"]) if got["nic_eff"] is not None else topo.nic_eff,
            intra_eff=float(got["intra_eff"]) if got["intra_eff"] is not None else topo.intra_eff,
            algo=got.get("algo") or topo.algo,
            proto=got.get("proto") or topo.proto,
            channels=int(channels) if channels is not None else topo.channels,
            lat_scale=float(scale) if scale is not None else topo.lat_scale,
            ranges=ranges,
            row_factors=tuple((int(n), float(c)) for n, c in got.get("row_factors") or ()),
            row_algo=got.get("row_algo"),
            nccl=topo.nccl or fabric.get("nccl_version"),
            net_plugin=topo.net_plugin or fabric.get("net_plugin"),
        )
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}'s fitted fabric does not fit {topo.spec}: {exc}") from None
