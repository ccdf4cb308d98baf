"""A fitted network file on a topology: another server count of the cluster it was fitted on
(:func:`apply_fit`), and how a topology differs from that cluster (:func:`mismatch`: hardware, NCCL and
network-plugin versions), which is refused unless the user says ``--force``. The fit itself is
:mod:`.fit`."""

from __future__ import annotations

import dataclasses

from dpcomm.errors import UserError
from dpcomm.topology.multigpu import MultiGPU, is_multigpu_spec, parse_multigpu
from dpcomm.topology.size_ranges import ranges_from_json

__all__ = ["apply_fit", "mismatch"]

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


def apply_fit(
    topo: MultiGPU, fabric: dict, *, force: bool = False, where: str = "the network file"
) -> MultiGPU:
    """``topo`` with a network file's fitted fractions (its ``fabric`` block): another server count of the
    cluster it was fitted on. A topology of other hardware, another NCCL or plugin version (:func:`mismatch`)
    is a one-line UserError unless ``force``; the file's versions and forced algorithm and protocol are
    carried where the topology states none."""
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
    scale, channels = fabric.get("lat_scale"), fabric.get("channels")
    ranges = ranges_from_json(fabric["ranges"], where) if "ranges" in fabric else topo.ranges
    try:
        return dataclasses.replace(
            topo,
            nic_eff=float(fabric["nic_eff"]),
            intra_eff=float(fabric["intra_eff"]),
            algo=fabric.get("algo") or topo.algo,
            proto=fabric.get("proto") or topo.proto,
            channels=int(channels) if channels is not None else topo.channels,
            lat_scale=float(scale) if scale is not None else topo.lat_scale,
            ranges=ranges,
            row_factors=tuple((int(n), float(c)) for n, c in fabric.get("row_factors") or ()),
            row_algo=fabric.get("row_algo"),
            nccl=topo.nccl or fabric.get("nccl_version"),
            net_plugin=topo.net_plugin or fabric.get("net_plugin"),
        )
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}'s fitted fabric does not fit {topo.spec}: {exc}") from None
