"""The network transports of a multi-GPU cluster: what fraction of a NIC's line rate NCCL moves over each,
and how long a message takes to start on it.

A :class:`~dpcomm.topology.MultiGPU` names its NICs' transport (``transport=ib|roce|efa|tcp``); the flow
model's NIC links then carry ``line rate x fraction`` unless the spec gives ``nic_eff=`` itself, and the
start-up of a network hop adds the transport's own latency to NCCL's per-hop figure
(:mod:`dpcomm.sim.network.nccl_tuning`). Every number has its source next to it; where a source gives a
range, the table keeps the middle and says so.

Sources, by transport:

* **InfiniBand** (``ib``; HDR 200 Gb/s, NDR 400 Gb/s, XDR 800 Gb/s): 0.96 of the line rate. HDR: "we
  usually consider 24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs)" (NCCL maintainer
  sjeaugey, github.com/NVIDIA/nccl-tests/issues/119); NDR: "around 48GB/s from each CX7 NIC at 400Gbps"
  (AddyLaddy, github.com/NVIDIA/nccl-tests/issues/319; "46-48GB/s per NIC", issues/290); XDR: NCCL's own
  fastest per-channel network speed on Blackwell, 96 GB/s of an 800 Gb/s (100 GB/s) NIC
  (``sm100SpeedArrayInter`` in NCCL's ``src/graph/search.cc``, github.com/NVIDIA/nccl commit 5067397c).
  InfiniBand adds nothing to NCCL's per-hop latency (its net plugin reports latency 0).
* **RoCE** (``roce``): NCCL drives RoCE NICs with the same verbs transport as InfiniBand (``src/transport/
  net_ib.cc``: "IB/RoCE"), and the maintainer's per-NIC rule above is stated for NICs, not link layers
  ("12 GB/s for 100G NICs", issues/119), so the same 0.96; the start-up as InfiniBand's.
* **EFA** (``efa``, AWS Elastic Fabric Adapter through the aws-ofi-nccl plugin): no published achievable
  fraction was found, and what NCCL achieves over EFA depends on its version (and aws-ofi-nccl's), so it is
  fitted per NCCL version range (``nccl=`` of a spec; in-sample, docs/netsim.md): 0.895, fitted to AWS's
  DLAMI guide ("Using EFA on the DLAMI": 2 p4d, NCCL 2.23.4, aws-ofi-nccl 1.13.2, its rows of 64 MiB to 1
  GiB at 51-76 GB/s busbw), holds from NCCL 2.17 on: 2 p4de with NCCL 2.17.1 and aws-ofi-nccl 1.5.0 move
  77.6 GB/s busbw at 1 GiB (github.com/aws-samples/aws-hpc-tutorials pull request #408,
  ``content/08-EFA/05-compile-run-nccl-tests.md``), and a p4d log with NCCL 2.18.3 and the same plugin
  moves 0.86 of EFA's line rate (github.com/aws-samples/awsome-distributed-training at 4bcaf13a,
  ``3.test_cases/0.nccl-tests/slurm-104.out``: 2 p4d, scatter_perf, 2 GiB from rank 0 in 24,982 us, half
  of it to the other server over all 4 NICs, 43.0 of 50 GB/s), and aws-ofi-nccl drives p4d with the same
  SENDRECV protocol from 1.8.1 to 1.13.2 (``src/platform-aws.c``); before NCCL 2.17, or where no version
  is stated, 0.63, fitted to the p4d rows of NVIDIA/nccl#527
  (2, 3 and 4 servers x 8 A100, 4 x 100 Gb/s EFA, 1 GiB, NCCL 2.9.9: 57.2, 31.8, 29.6 GB/s busbw). An
  older p4d table (NCCL 2.8.3, github.com/aws-samples/aws-efa-eks at 043dbe74) moves 1.75x less on the
  same hardware because its job forced the ring (``NCCL_ALGO=RING`` in its ``examples/nccl-efa-tests.yaml``;
  its log shows GPUDirect RDMA on, ``GDRDMA``), whose busbw the NICs bound, where #527 ran the tree: with
  the ring the same 0.63 puts it at -4.6..+21% (in-sample since, docs/netsim.md); a p5 table, 32 x 100
  Gb/s EFA on a recent stack, is at -16..0% (held-out). Its latency is what aws-ofi-nccl reports to NCCL
  as the network's (``platform-aws.cpp``: 75 us on p4d and p5, 35 us from p5en on), which NCCL adds to
  every network hop.
* **TCP** (``tcp``, NCCL's socket transport): the payload fraction of a TCP stream with a 1500-byte MTU
  when both directions are busy, 1448 / (1514 + 66/2) = 0.936 (Ethernet, IP and TCP headers and an ACK
  per two segments: the ceiling measured on dpcomm's testbed, docs/testbed.md section 1, and the flow
  model's own :class:`dpcomm.sim.network.Goodput`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TRANSPORTS", "Transport", "transport"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Transport:
    """One NIC transport: its name, NCCL's achievable fraction of the line rate, its own latency."""

    key: str
    """As written in a spec: ``ib``, ``roce``, ``efa``, ``tcp``."""
    name: str
    """As printed: ``InfiniBand``."""
    fraction: float
    """Fraction of a NIC's line rate NCCL's Simple protocol moves (the flow model's NIC ``nic_eff``)."""
    latency_s: float
    """Extra start-up per network hop beyond NCCL's per-hop figure (NCCL's ``latencyInter``: what the
    net plugin reports as its latency), seconds."""
    source: str
    """Where ``fraction`` and ``latency_s`` come from."""
    by_version: tuple[tuple[str, float, str], ...] = ()
    """``(lowest NCCL version, fraction, source)`` of NCCL versions from which another fraction holds, in
    rising order; :attr:`fraction` holds below the first and where no version is stated."""

    def fraction_for(self, nccl: str | None) -> float:
        """The fraction NCCL ``nccl`` (``2.23.4``; None: not stated) achieves on this transport."""
        got = self.fraction
        if nccl:
            have = _version(nccl)
            for since, frac, _ in self.by_version:
                if have >= _version(since):
                    got = frac
        return got


def _version(text: str) -> tuple[int, ...]:
    """``2.23.4`` (or ``2.23.4+cuda12.5``) as ``(2, 23, 4)``."""
    return tuple(int(x) for x in text.split("+")[0].split(".") if x.isdigit())


TRANSPORTS: dict[str, Transport] = {
    "ib": Transport(
        key="ib",
        name="InfiniBand",
        fraction=0.96,  # 24 of 25 GB/s (HDR, nccl-tests#119), 48 of 50 (NDR, #319), 96 of 100 (XDR)
        latency_s=0.0,  # NCCL's IB plugin reports latency 0: NCCL's own NET hop figures are IB's
        source="nccl-tests#119, #319, #290; NCCL src/graph/search.cc (sm100SpeedArrayInter)",
    ),
    "roce": Transport(
        key="roce",
        name="RoCE",
        fraction=0.96,  # the same verbs transport as IB (NCCL net_ib.cc); "12 GB/s for 100G NICs", #119
        latency_s=0.0,
        source="NCCL src/transport/net_ib.cc (one verbs transport for IB and RoCE); nccl-tests#119",
    ),
    "efa": Transport(
        key="efa",
        name="EFA",
        fraction=0.63,  # fitted: p4d's 2-4 server rows at 1 GiB (NVIDIA/nccl#527), docs/netsim.md in-sample
        latency_s=75e-6,  # what aws-ofi-nccl reports to NCCL on p4d, p4de, p5, p5e (35 us from p5en on)
        source="fraction fitted to NVIDIA/nccl#527 (p4d, NCCL 2.9.9); latency aws/aws-ofi-nccl "
        "src/platform-aws.cpp (75.0 us; 35.0 for p5en and later)",
        by_version=(
            (  # fitted: model / measured busbw 1 in geometric mean over rows >= 64 MiB (docs/netsim.md);
                # from 2.17: the earliest NCCL a published p4d-class table shows at this fraction
                "2.17",
                0.895,
                "fitted to AWS's DLAMI guide 'Using EFA on the DLAMI' (p4d 2 x 8, NCCL 2.23.4, aws-ofi-nccl "
                "1.13.2, 64 MiB to 1 GiB), in-sample; from NCCL 2.17: a 2 x p4de all_reduce table with NCCL "
                "2.17.1 and aws-ofi-nccl 1.5.0 at 77.6 GB/s busbw at 1 GiB (aws-samples/aws-hpc-tutorials "
                "pull request #408, content/08-EFA/05-compile-run-nccl-tests.md), and a p4d scatter_perf log "
                "with NCCL 2.18.3 at 0.86 of the line (aws-samples/awsome-distributed-training 4bcaf13a, "
                "3.test_cases/0.nccl-tests/slurm-104.out)",
            ),
        ),
    ),
    "tcp": Transport(
        key="tcp",
        name="TCP",
        fraction=1448 / (1514 + 66 / 2),  # 0.936: headers and ACKs at MTU 1500, both directions busy
        latency_s=0.0,
        source="TCP/IP framing at MTU 1500 (docs/testbed.md section 1; dpcomm.sim.network.Goodput)",
    ),
}
"""The transports a ``transport=`` key may name."""


def transport(key: str) -> Transport:
    """The transport named ``key`` (a ValueError naming the choices otherwise)."""
    if key not in TRANSPORTS:
        raise ValueError(f"transport is one of {', '.join(TRANSPORTS)}, not {key!r}")
    return TRANSPORTS[key]
