"""The multi-GPU server presets of :mod:`dpcomm.topology.multigpu` (``dgx-h100:S``, ``p5:S``, ...): what a
server holds and what each part achieves, every number with its source. Plain data; the parser and the
:class:`~dpcomm.topology.multigpu.MultiGPU` topology are in :mod:`dpcomm.topology.multigpu`.
"""

from __future__ import annotations

__all__ = ["ALIASES", "PRESETS", "preset_names"]

_GB = 8e9  # bits/s in 1 GB/s

PRESETS: dict[str, dict[str, object]] = {
    # DGX/HGX H100: 8 H100 SXM5; NVLink4 "900 GB/s" bidirectional per GPU = 18 links x 25 GB/s each way
    # (NVIDIA H100 Tensor Core GPU datasheet; NVIDIA H100 architecture whitepaper, "fourth-generation
    # NVLink ... 18 links ... 900 GB/s total bandwidth"); 8 ConnectX-7 400 Gb/s NDR InfiniBand compute NICs,
    # one per GPU (NVIDIA DGX H100 User Guide, "Hardware Overview": "8x ... ConnectX-7 ... up to 400Gb/s
    # InfiniBand"), rail-optimised as in the DGX SuperPOD H100 reference architecture ("rail-optimized
    # ... each of the eight HCAs in a DGX connects to a different leaf switch").
    # Achievable: NVLink 370 of 450 GB/s ("450GB/s is the line rate. With the protocol overhead (~20%)
    # NCCL can get an effective NVLink bandwidth of 370GB/s ... when running with NCCL_ALGO=RING", NCCL
    # maintainer sjeaugey, github.com/NVIDIA/nccl-tests/issues/212); NIC 48 of 50 GB/s ("around 48GB/s
    # from each CX7 NIC at 400Gbps", AddyLaddy, github.com/NVIDIA/nccl-tests/issues/319; "46-48GB/s per
    # NIC" for NDR, github.com/NVIDIA/nccl-tests/issues/290).
    "dgx-h100": {
        "gpus": 8,
        "intra": "nvlink",
        "intra_bps": 450 * _GB,
        "intra_eff": 370 / 450,
        "nics": 8,
        "nic_bps": 400e9,
        "nic_eff": 48 / 50,
        "transport": "ib",
        "arch": "hopper",
        "net": "star",  # the SuperPOD's rail leaves sit under a full-bisection spine (see below)
    },
    # DGX A100: 8 A100 SXM4; NVLink3 "600 GB/s" bidirectional per GPU = 12 links x 25 GB/s each way
    # (NVIDIA A100 Tensor Core GPU datasheet and architecture whitepaper); 8 ConnectX-6 200 Gb/s HDR
    # InfiniBand compute NICs (NVIDIA DGX A100 datasheet: "8x Single-Port Mellanox ConnectX-6 VPI
    # 200Gb/s HDR InfiniBand"), rail-optimised (DGX SuperPOD A100 reference architecture).
    # Achievable: NVLink 230 of 300 GB/s ("The total effective bandwidth should therefore be 240GB/s on
    # A100, but some other bottlenecks on the GPUs limits it to ~230GB/s", sjeaugey,
    # github.com/NVIDIA/nccl-tests/issues/149); NIC 24 of 25 GB/s ("we usually consider 24GB/s is the
    # peak performance per 200G NIC", sjeaugey, github.com/NVIDIA/nccl-tests/issues/119).
    "dgx-a100": {
        "gpus": 8,
        "intra": "nvlink",
        "intra_bps": 300 * _GB,
        "intra_eff": 230 / 300,
        "nics": 8,
        "nic_bps": 200e9,
        "nic_eff": 24 / 25,
        "transport": "ib",
        "arch": "ampere",
        "net": "star",
    },
    # DGX B200: 8 B200; NVLink5 "1.8 TB/s" bidirectional per GPU = 18 links x 50 GB/s each way (NVIDIA DGX
    # B200 datasheet); 8 x 400 Gb/s ConnectX-7 InfiniBand compute NICs ("8x single-port NVIDIA ConnectX-7
    # VPI ... up to 400Gb/s InfiniBand", same datasheet). Achievable NVLink: NCCL's own figure for a
    # Blackwell NVLink, 40.1 GB/s x 18 links = 721.8 GB/s (SM100_NVLINK_BW, NCCL src/graph/topo.h, as
    # its SM90 figure 20.6 x 18 = 370.8 is the H100's 370 above); NICs as InfiniBand's 0.96.
    "dgx-b200": {
        "gpus": 8,
        "intra": "nvlink",
        "intra_bps": 900 * _GB,
        "intra_eff": 721.8 / 900,
        "nics": 8,
        "nic_bps": 400e9,
        "transport": "ib",
        "arch": "blackwell",
        "net": "star",
    },
    # AWS p4d.24xlarge: 8 A100 40GB on NVSwitch (NVLink3 as dgx-a100) and 4 x 100 Gb/s EFA ("GPUDirect RDMA
    # backed with 4x100 Gbps EFA", github.com/aws-samples/aws-efa-eks README); EFA's fraction and latency
    # in dpcomm.topology.transports.
    "p4d": {
        "gpus": 8,
        "intra": "nvlink",
        "intra_bps": 300 * _GB,
        "intra_eff": 230 / 300,
        "nics": 4,
        "nic_bps": 100e9,
        "transport": "efa",
        "arch": "ampere",
        "net": "star",
    },
    # AWS p5.48xlarge: 8 H100 on NVSwitch (NVLink4 as dgx-h100) and 32 x 100 Gb/s EFA, four per GPU
    # (aws-ofi-nccl's tuner for P5: "num_rails = 4" of 12.5 GB/s, src/tuner/nccl_ofi_model.cpp).
    "p5": {
        "gpus": 8,
        "intra": "nvlink",
        "intra_bps": 450 * _GB,
        "intra_eff": 370 / 450,
        "nics": 32,
        "nic_bps": 100e9,
        "transport": "efa",
        "arch": "hopper",
        "net": "star",
    },
}
# dpcomm's emulated cluster with two ranks per server (`dpcomm testbed up --gpus-per-server 2 --intra-rate
# 400mbit --rate 100mbit`, docs/testbed.md "Multi-GPU servers"): the ranks of a server share its network
# namespace's loopback, one tbf of 400 Mbit/s for both directions together (measured: 199.0 Mbit/s of
# payload for one flow and 198.8 for two opposite ones at 200mbit), and one veth NIC of 100 Mbit/s each
# way behind a non-blocking bridge (net=star). Achievable: TCP over the veth at MTU 1500 with both
# directions busy, 0.936 (transport=tcp); over loopback 0.998, from its frames: 64 KiB of payload per
# frame of 52 + 14 header bytes, and one 66-byte ACK per two frames. The rates are the testbed's tbf rates,
# not fitted; `TestbedConfig.flow_topology` spells out any other G and rates.
PRESETS["testbed"] = {
    "gpus": 2,
    "intra": "loopback",
    "intra_bps": 400e6,
    "intra_eff": 0.998,
    "nics": 1,
    "nic_bps": 100e6,
    "transport": "tcp",
    "arch": "volta",  # no NVLS, no CollNet: NCCL's PCIe tables are the closest
    "net": "star",
}
PRESETS["hgx-h100"] = PRESETS["dgx-h100"]  # the HGX board is the DGX's GPU tray: same GPUs and NVSwitch
PRESETS["hgx-a100"] = PRESETS["dgx-a100"]
PRESETS["hgx-b200"] = PRESETS["dgx-b200"]
# DGX/HGX H200: 8 H200 SXM on the H100's NVSwitch board ("18x 4th Gen NVLink, 900GB/s" per GPU, NVIDIA's
# MLPerf Inference v4.1 system description H200-SXM-141GBx8, github.com/mlcommons/inference_results_v4.1
# closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json) and 8 x 400 Gb/s ConnectX-7 compute NICs (NVIDIA DGX
# H200 datasheet: "8x single-port NVIDIA ConnectX-7 VPI, up to 400Gb/s InfiniBand/Ethernet"): the H100
# preset's parts (the same GH100 die; only the memory differs).
PRESETS["dgx-h200"] = PRESETS["dgx-h100"]
PRESETS["hgx-h200"] = PRESETS["dgx-h100"]
# AWS p4de.24xlarge: p4d with A100 80GB: the same NVSwitch and 4 x 100 Gb/s EFA (AWS EC2 P4 instances page:
# p4de.24xlarge, 8 A100 80GB, 400 Gbps EFA, 600 GB/s NVSwitch; torchx's named_resources_aws lists it beside
# p4d.24xlarge with the same 4 EFA devices).
PRESETS["p4de"] = PRESETS["p4d"]
# AWS p5e.48xlarge: 8 H200 on NVSwitch and p5's 32 EFA NICs, 3,200 Gbps ("P5 and P5e instances support up to
# 32 network cards and can provide up to 3,200 Gbps", AWS EC2 User Guide, p5-efa.html; "p5.48xlarge /
# p5e.48xlarge: 8x H100 / H200", NVIDIA Dynamo's AWS EFA guide, docs.nvidia.com/dynamo).
PRESETS["p5e"] = PRESETS["p5"]
# Google Cloud A4 (a4-highgpu-8g): 8 B200 on NVSwitch, 8 ConnectX-7 NICs on RoCE, 3.2 Tbps (github.com/
# dstackai/dstack examples/clusters/a4/README.md: "eight NVIDIA ConnectX-7 (CX-7) NICs that utilize RDMA over
# Converged Ethernet (RoCE)"; examples/clusters/gcp/README.md: A4, B200:8, 3.2 Tbps, RoCE).
PRESETS["a4"] = {**PRESETS["dgx-b200"], "transport": "roce"}
# Google Cloud A3 Ultra (a3-ultragpu-8g): 8 H200 141GB on the all-to-all NVLink board (dgx-h200's parts) and
# 8 ConnectX-7 NICs, one per GPU, 3,200 Gbps together, on GPUDirect RDMA (Google Cloud, "Networking and GPU
# machines", cloud.google.com/compute/docs/gpus/gpu-network-bandwidth: "eight NVIDIA ConnectX-7 (CX7) network
# interface cards ... deliver a total network bandwidth of 3,200 Gbps ... each CX7 NIC is aligned with one
# NVIDIA H200 141GB GPU"); the same page gives A4 the same eight CX-7 NICs, RoCE as a4 below.
PRESETS["a3-ultra"] = {**PRESETS["dgx-h200"], "transport": "roce"}
# A3 High and A3 Mega are not here: they reach other VMs by GPUDirect-TCPX/TCPXO (no achievable fraction
# published), and the stored sources give only each VM's total (1,000 and 1,800 Gbps over 4+1 and 8+1 NICs),
# not the GPU NICs' own rate (docs/netsim.md's A3 Mega table assumes 200 Gbit/s); write them as gpus: specs.
# Azure ND H100 v5: 8 H100 with NVLink 4.0, "Each GPU within the VM is provided with its own dedicated,
# topology-agnostic 400 Gb/s NVIDIA Quantum-2 CX7 InfiniBand connection", 3.2 Tbps per VM (Microsoft Learn,
# ND-H100-v5 size series).
PRESETS["nd-h100-v5"] = PRESETS["dgx-h100"]
# Azure ND H200 v5 (Standard_ND96isr_H200_v5): 8 H200 141 GB on NVLink 4 / NVSwitch, 900 GB/s per GPU, and 8
# x 400 Gb/s NDR InfiniBand ConnectX-7, one per GPU, 3.2 Tbps per VM (Microsoft Learn, "ND H200 v5 sizes
# series", learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/nd-h200-v5-series; not verified
# from a stored copy of the page, which is not stored here: stored third-party pages cite it for "8 x H200
# 141 GB, 900 GB/s NVLink, 400 Gb/s InfiniBand per GPU" and a 3,200 Gbps IB total; Microsoft's own stored
# Aspire reference confirms the size and its 8 GPUs: "Standard_ND96isr_H200_v5 -- 96 vCPUs -- 1850 GB RAM --
# 8 GPU(s)", aspire.dev, Aspire.Hosting.Azure.Kubernetes StandardNDISRH200V5, from microsoft/aspire
# src/Aspire.Hosting.Azure.Kubernetes/AksNodeVmSizes.cs at 5bd693ae): dgx-h200's parts.
PRESETS["nd-h200-v5"] = PRESETS["dgx-h200"]
# OCI BM.GPU.H100.8: 8 H100 SXM on NVSwitch, 16 RDMA ports of 200 Gb/s on OCI's RoCEv2 cluster network
# (16 ports: the NCCL_IB_HCA of github.com/oracle-japan/ocitutorials tutorials/_hpc/benchmark/
# run-nccltests-h100.md, "全16ポートのRDMAインタフェース"; "8 x 2 x 200 Gbps RDMA": OCI's Compute Shapes page,
# docs.oracle.com/en-us/iaas/Content/Compute/References/computeshapes.htm, as crawled in
# github.com/jacklty/oci_doc_crawler iaas/Content/Compute/References/computeshapes.md at 8e7bbd72).
PRESETS["oci-h100"] = {**PRESETS["dgx-h100"], "nics": 16, "nic_bps": 200e9, "transport": "roce"}
# OCI BM.GPU.H200.8: "8x NVIDIA H200 Tensor Core GPUs 141 GB" and "8 x 400 Gbps RDMA" (the same Compute
# Shapes page and crawl); 8 RDMA devices in the NCCL_IB_HCA of OCI's own job (github.com/oracle-quickstart/
# oci-hpc-oke manifests/nccl-tests/kueue/BM.GPU.H200.8.yaml); RoCE as oci-h100 (OCI's cluster networks are
# "RDMA over converged ethernet (RoCE) delivered over NVIDIA ConnectX SmartNICs", blogs.oracle.com, "Building
# a high-performance network in the cloud"); NVLink as dgx-h200.
PRESETS["oci-h200"] = {**PRESETS["dgx-h200"], "transport": "roce"}
ALIASES = {
    "a4-highgpu-8g": "a4",
    "a3-ultragpu-8g": "a3-ultra",
    "nd-h100v5": "nd-h100-v5",
    "nd-h200v5": "nd-h200-v5",
    "bm-gpu-h100-8": "oci-h100",
    "bm-gpu-h200-8": "oci-h200",
}
"""Other names of the presets (the clouds' own machine and shape names, lower case)."""
for _alias, _name in ALIASES.items():
    PRESETS[_alias] = PRESETS[_name]
# Why net=star on the presets: a DGX SuperPOD's rail switches are leaves under spine switches, a
# full-bisection fat tree (the DGX SuperPOD reference architectures), so a NIC reaches any NIC, and
# NCCL's rings leave a server by the last GPU's own NIC (NCCL_CROSS_NIC) rather than over NVLink to the
# first GPU's rail: measured 2 x 8 H100 rings reach 384-392 GB/s busbw (NCCL_ALGO=RING,
# github.com/wutz/k8s-in-action mpi-operator/README.md), above NVLink's 370, which they could not if every
# exit crossed NVLink (docs/netsim.md, in-sample tables). net=rail is a rail-only network (no spine).


def preset_names() -> str:
    """The presets a user may type, for help texts and errors: ``dgx-h100:S, hgx-h100:S, ...`` (the clouds'
    own names after their preset, in parentheses)."""
    alias_of: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        alias_of.setdefault(name, []).append(alias)
    names = [n for n in PRESETS if n not in ALIASES and n != "testbed"]
    return ", ".join(f"{n}:S" + (f" ({', '.join(alias_of[n])})" if n in alias_of else "") for n in names)
