"""The predictions of a multi-GPU all-reduce case (:class:`~dpcomm.validate.cases.Case` with
``algorithms``): each measured all-reduce against the closed form and the flow model of the same cluster.

The cluster is the case's testbed in the flow model's terms (:meth:`dpcomm.testbed.TestbedConfig.
flow_topology`): ``M`` servers of ``G`` ranks, each server's ranks on one loopback bus of ``B_bus`` (the
tbf rate, both directions together, times 0.998 for TCP's headers on 64 KiB frames), one NIC of ``B_nic``
each way (the tbf rate times 0.936, TCP's duplex ceiling at MTU 1500), a non-blocking switch. Nothing is
fitted: the rates are the tbf's, the header fractions arithmetic, and the start-up ``alpha`` is the one
``testbed launch`` hands every worker (:func:`dpcomm.testbed.config.link_network`, 45.26 us, the 10gbe
preset's); at these sizes (MB at 100 Mbit/s) it is below 0.1% of every call.

- **flow model** (:mod:`dpcomm.sim.network`): the algorithm's own flow schedule
  (:mod:`~dpcomm.sim.network.nccl_ring` with its channels, :mod:`~dpcomm.sim.network.hierarchical`), the
  very messages :mod:`dpcomm.testbed.gpu_allreduce` sends, max-min shared on the fabric, step by step;
- **closed form** (alpha-beta, the schedules' docstrings with a shared bus): NCCL's ring, ``C`` channels,
  ``P = M G``: ``T = 2 (P-1) (alpha + S/P max((G-1) / B_bus, 1 / B_nic))`` (per step the bus carries
  ``G - 1`` chunks of every channel, the NIC one each way); hierarchical: ``T = 2 (G-1) (alpha + S / B_bus)
  + 2 (M-1) (alpha + S / (M B_nic))`` (an intra step moves ``G`` shards of ``S/G`` over the bus, a rail step
  ``G`` pieces of ``S/(G M)`` through the NIC).
"""

from __future__ import annotations

from typing import Any

from dpcomm.validate.predict import Prediction

__all__ = ["closed_form", "predict_allreduce"]


def closed_form(algorithm: str, nbytes: int, hosts: int, gpus: int, bus_Bps: float, nic_Bps: float,
                alpha_s: float) -> float:  # fmt: skip
    """The module docstring's closed form, seconds."""
    p, s = hosts * gpus, float(nbytes)
    if p < 2:
        return 0.0
    if algorithm.startswith("nccl-ring"):
        return 2 * (p - 1) * (alpha_s + s / p * max((gpus - 1) / bus_Bps, (hosts > 1) / nic_Bps))
    intra = 2 * (gpus - 1) * (alpha_s + s / bus_Bps)
    return intra + 2 * (hosts - 1) * (alpha_s + s / (hosts * nic_Bps))


def _cluster(case: dict[str, Any]) -> Any:
    from dpcomm.testbed import TestbedConfig, parse_rate

    intra = parse_rate(case["intra_rate"]) if case.get("intra_rate") else None
    return TestbedConfig(name="predict", topology=case["topology"], rate_bps=parse_rate(case["rate"]),
                         gpus=case["gpus"], intra_rate_bps=intra)  # fmt: skip


def predict_allreduce(record: dict[str, Any]) -> list[Prediction]:
    """Both predictions for every measured (algorithm, size) of a multi-GPU case's record."""
    from dpcomm.sim.network import FlowModel, hierarchical, make_fabric, nccl_ring
    from dpcomm.testbed.config import link_network
    from dpcomm.testbed.gpu_allreduce import parse

    case = record["case"]
    cfg = _cluster(case)
    fabric = make_fabric(cfg.flow_topology(), cfg.rate_bps)
    topo = fabric.topology
    alpha = link_network(cfg.rate_bps, cfg.mtu).alpha
    model = FlowModel(fabric, alpha_s=alpha)
    bus = topo.intra_bps / 8 * topo.intra_eff
    nic = topo.nic_bps / 8 * topo.nic_fraction
    out = []
    for r in record["results"]:
        algo, channels = parse(r["algorithm"])
        p, numel = r["ranks"], r["bytes"] // 4
        if algo == "nccl-ring":
            steps = nccl_ring.steps(p, topo.gpus, numel, 4, channels=channels)
        else:
            steps = hierarchical.steps(p, topo.gpus, numel, 4)
        flow = model.run(steps).time_s
        closed = closed_form(algo, r["bytes"], topo.hosts, topo.gpus, bus, nic, alpha)
        note = "" if r.get("exact", True) else "sums not exact"
        out.append(Prediction(case=case["name"], schedule=f"{r['algorithm']} {_size(r['bytes'])}", kept="",
                              measured_s=r["time_s"], exposed_s=r["time_s"], closed_s=closed, flow_s=flow,
                              note=note))  # fmt: skip
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g}MB" if nbytes >= 2**20 else f"{nbytes / 2**10:g}KB"
