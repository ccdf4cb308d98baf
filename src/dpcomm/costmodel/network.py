"""Networks as alpha-beta-gamma parameters, their presets, and the network file (``dpcomm-network/1``).

Symbols (MG-WFBP Table II, LP paper section 3.1): ``alpha`` start-up latency of one point-to-point
message (s), ``beta`` transfer time per byte (s/byte), ``gamma`` reduction time per byte (s/byte).

A network file is JSON::

    {"format": "dpcomm-network/1", "alpha_s": 4.526e-05, "beta_s_per_byte": 8e-10, "gamma_s_per_byte": 0.0,
     "name": "my-cluster",                           # optional
     "allreduce_tables": {"8": [[bytes, seconds], ...]},   # optional measured tables per node count
     "fabric": {"topology": "gpus:2,8,...", "nic_eff": 0.93, "intra_eff": 0.8, "alpha_s": 2.1e-06, ...}}
                                                     # optional: a multi-GPU fabric fitted to nccl-tests
                                                     # (dpcomm calibrate --from-nccl-tests)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcomm.errors import UserError
from dpcomm.utils.io import atomic_write_json, read_json

__all__ = ["NETWORK_FORMAT", "Network", "PRESETS", "load_network", "resolve_network", "save_network"]

NETWORK_FORMAT = "dpcomm-network/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Network:
    """Point-to-point parameters of a network: ``T(M) = alpha + beta*M (+ gamma*M to reduce it)``."""

    name: str
    """Preset name or file it came from."""
    alpha: float
    """Start-up time of one message, seconds."""
    beta: float
    """Transfer time per byte, seconds/byte (1/bandwidth)."""
    gamma: float = 0.0
    """Reduction (summation) time per byte, seconds/byte."""
    source: str = ""
    """Where the figures come from."""
    allreduce_tables: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Measured all-reduce (bytes, seconds) tables keyed by node count, if any."""
    fabric: dict[str, Any] = field(default_factory=dict)
    """A multi-GPU fabric fitted to the cluster's nccl-tests table (``dpcomm calibrate --from-nccl-tests``:
    ``topology``, ``nic_eff``, ``intra_eff``, ``alpha_s`` or null, ...), empty if none."""

    def __post_init__(self) -> None:
        for key in ("alpha", "beta", "gamma"):
            v = getattr(self, key)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"network {self.name}: {key} must be a finite number >= 0")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": NETWORK_FORMAT,
            "name": self.name,
            "alpha_s": self.alpha,
            "beta_s_per_byte": self.beta,
            "gamma_s_per_byte": self.gamma,
        }
        if self.source:
            out["source"] = self.source
        if self.allreduce_tables:
            out["allreduce_tables"] = {str(n): [list(p) for p in t] for n, t in self.allreduce_tables.items()}
        if self.fabric:
            out["fabric"] = dict(self.fabric)
        return out


# Presets. Sources are in docs/costmodel.md; the 10GbE alpha reproduces MG-WFBP's measured ring start-ups.
PRESETS: dict[str, Network] = {
    "10gbe": Network(
        name="10gbe",
        alpha=45.26e-6,  # s; 2(N-1)*alpha = 90.52 / 271.56 / 633.64 us at N = 2 / 4 / 8 (MG-WFBP sec. V)
        beta=0.8e-9,  # s/byte = 1 / (10 Gb/s / 8)
        gamma=0.0,
        source="MG-WFBP (Shi & Chu), 10GbE cluster, section V: measured ring all-reduce start-ups",
    ),
    # beta below is the line rate (8 bits / rate); protocol overhead (a few %) is not included.
    "25gbe": Network(
        name="25gbe",
        alpha=45.26e-6,  # s; ASSUMPTION: same TCP/MPI software start-up as MG-WFBP's measured 10GbE alpha
        beta=0.32e-9,  # s/byte = 1 / (25 Gb/s / 8), IEEE 802.3by line rate
        gamma=0.0,
        source="25 Gb/s line rate (IEEE 802.3by); alpha assumed equal to MG-WFBP's 10GbE (TCP stack bound)",
    ),
    "40gbe-roce": Network(
        name="40gbe-roce",
        alpha=3.0e-6,  # s; ASSUMPTION: ~1 us RoCE NIC latency (ConnectX-2/3) + ~2 us verbs/MPI software
        beta=0.2e-9,  # s/byte = 1 / (40 Gb/s / 8); BML's testbed: 40 Gb/s ConnectX-3 NICs, RoCE (sec. 4)
        gamma=0.0,
        source="BML testbed (sec. 4: 40GE, ConnectX-3 NICs, RoCE); alpha assumed (RoCE NIC ~1 us + software)",
    ),
    "100gb-ib": Network(
        name="100gb-ib",
        alpha=1.5e-6,  # s; ASSUMPTION: typical osu_latency small-message MPI latency over EDR IB, 1-1.5 us
        beta=0.08e-9,  # s/byte = 1 / (100 Gb/s / 8), EDR 4x line rate
        gamma=0.0,
        source="100 Gb/s EDR InfiniBand line rate; alpha assumed: typical MPI ping-pong latency (1-1.5 us)",
    ),
}


def _num(obj: dict, key: str, source: str, required: bool = True) -> float:
    if key not in obj:
        if required:
            raise UserError(f"{source}: missing field '{key}'")
        return 0.0
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise UserError(f"{source}: field '{key}' must be a finite number >= 0, got {v!r}")
    return float(v)


def network_from_dict(obj: Any, source: str = "network") -> Network:
    """Validate a parsed network file; problems are one-line :class:`UserError` naming the field."""
    if not isinstance(obj, dict):
        raise UserError(f"{source}: a network file is a JSON object")
    if obj.get("format") != NETWORK_FORMAT:
        raise UserError(f"{source}: field 'format' must be '{NETWORK_FORMAT}', got {obj.get('format')!r}")
    alpha = _num(obj, "alpha_s", source)
    beta = _num(obj, "beta_s_per_byte", source)
    gamma = _num(obj, "gamma_s_per_byte", source, required=False)
    tables: dict[int, tuple[tuple[float, float], ...]] = {}
    raw = obj.get("allreduce_tables", {})
    if not isinstance(raw, dict):
        raise UserError(f"{source}: field 'allreduce_tables' must be an object keyed by node count")
    for key, rows in raw.items():
        where = f"allreduce_tables.{key}"
        if not str(key).isdigit() or int(key) < 1:
            raise UserError(f"{source}: field '{where}' must be keyed by a node count >= 1")
        if not isinstance(rows, list) or len(rows) < 2:
            raise UserError(f"{source}: field '{where}' must list at least two [bytes, seconds] pairs")
        pts = []
        for i, row in enumerate(rows):
            ok = isinstance(row, list) and len(row) == 2
            ok = ok and all(isinstance(x, int | float) and not isinstance(x, bool) for x in row)
            if not ok or not all(math.isfinite(x) and x >= 0 for x in row):
                raise UserError(f"{source}: field '{where}[{i}]' must be [bytes >= 0, seconds >= 0]")
            pts.append((float(row[0]), float(row[1])))
        tables[int(key)] = tuple(pts)
    fabric = obj.get("fabric", {})
    if not isinstance(fabric, dict):
        raise UserError(f"{source}: field 'fabric' must be an object")
    if fabric:
        for key in ("nic_eff", "intra_eff"):
            v = fabric.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                raise UserError(f"{source}: field 'fabric.{key}' must be a fraction in (0, 1], got {v!r}")
        a = fabric.get("alpha_s")
        if a is not None and (isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a < 1):
            raise UserError(f"{source}: field 'fabric.alpha_s' must be seconds in [0, 1) or null, got {a!r}")
        g = fabric.get("gpus_per_server")
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise UserError(f"{source}: field 'fabric.gpus_per_server' must be an integer >= 1, got {g!r}")
    name = obj.get("name", str(source))
    return Network(
        name=str(name),
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        source=str(obj.get("source", source)),
        allreduce_tables=tables,
        fabric=dict(fabric),
    )


def load_network(path: str | os.PathLike) -> Network:
    return network_from_dict(read_json(path), source=str(path))


def save_network(net: Network, path: str | os.PathLike) -> Path:
    return atomic_write_json(path, net.to_dict())


def resolve_network(spec: str) -> Network:
    """A preset name (``10gbe``) or the path of a network file."""
    if spec in PRESETS:
        return PRESETS[spec]
    if os.path.exists(spec) or spec.endswith(".json"):
        return load_network(spec)
    raise UserError(f"unknown network '{spec}': use a preset ({', '.join(PRESETS)}) or a network JSON file")
