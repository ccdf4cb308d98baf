"""NCCL's tuning constants, as published in its source: the tables :mod:`.nccl_tuning` reads.

From github.com/NVIDIA/nccl at commit 5067397c: ``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``:
base and per-hop latencies in microseconds, the LL and per-channel bandwidth caps in GB/s, the NVLS
efficiency, the tree's correction by size, ``getNetOverhead``) and ``src/graph/search.cc`` (the per-channel
speeds NCCL's topology search tries). Numbers only; the model that combines them is ours.
"""

from __future__ import annotations

__all__ = [
    "BASE_LAT",
    "HW_LAT",
    "LL_MAX_BW_1",
    "LL_MAX_BW_N",
    "MAX_CHANNELS",
    "MAX_NVLS_ARITY",
    "NET_OVERHEAD_US",
    "NVLS_EFF",
    "PER_CH_NVLS_TREE",
    "PER_CH_RING_LL128",
    "PER_CH_TREE",
    "PER_CH_TREE_LL128",
    "SPEED_INTER",
    "SPEED_INTRA",
    "TREE_CORRECTION",
]

# tuning.cc, ncclTunerConstantsDefaults: microseconds
# (LL, LL128, Simple) per algorithm, in ALGORITHMS' order
BASE_LAT = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
HW_LAT = {  # per link type: a hop's latency
    "nvlink": {
        "tree": (0.6, 1.25, 4.0),
        "ring": (0.6, 1.9, 3.4),
        "collnet_direct": (0.0, 0.0, 3.7),
        "collnet_chain": (0.0, 0.0, 2.8),
        "nvls": (0.0, 0.0, 25.0),
        "nvls_tree": (0.0, 0.0, 25.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 4.0),
        "ring": (1.0, 2.5, 5.7),
        "collnet_direct": (0.0, 0.0, 3.7),
        "collnet_chain": (0.0, 0.0, 2.8),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
    },
    "net": {
        "tree": (5.0, 8.5, 14.0),
        "ring": (2.7, 4.0, 14.0),
        "collnet_direct": (0.0, 0.0, 31.0),
        "collnet_chain": (0.0, 0.0, 30.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 20.9),
    },
}
# GB/s caps, per architecture (volta, ampere, hopper, blackwell) x servers (1, 2, more)
LL_MAX_BW_1 = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}  # one server: by GPU
LL_MAX_BW_N = (39.0, 20.4)  # several servers: by CPU (Intel's row), 2 servers / more
PER_CH_RING_LL128 = {
    "volta": (20.0,) * 3,
    "ampere": (20.0,) * 3,
    "hopper": (36.7,) * 3,
    "blackwell": (40.0,) * 3,
}
PER_CH_TREE_LL128 = {
    "volta": (20.0, 20.0, 20.0),
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
PER_CH_TREE = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
PER_CH_NVLS_TREE = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (0.0, 57.7, 45.5),
    "blackwell": (0.0, 96.0, 80.0),
}
NVLS_EFF = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
NET_OVERHEAD_US = 1.0  # getNetOverhead: Intel x86 (AMD: 2.0)
TREE_CORRECTION = {  # by log2(S / 64 B), 0..23
    "LL": (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    "LL128": (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
        1.0,
    ),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
}
# search.cc: per-channel speeds NCCL tries, GB/s (before Hopper / Hopper / Blackwell)
SPEED_INTRA = {
    "volta": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEED_INTER = {
    "volta": (
        48.0,
        30.0,
        28.0,
        24.0,
        20.0,
        18.0,
        15.0,
        12.0,
        10.0,
        9.0,
        7.0,
        6.0,
        5.0,
        4.0,
        3.0,
        2.4,
        1.2,
        0.24,
        0.12,
    ),
    "hopper": (
        48.0,
        45.0,
        42.0,
        40.0,
        30.0,
        24.0,
        22.0,
        20.0,
        17.5,
        15.0,
        12.0,
        6.0,
        3.0,
        2.4,
        1.2,
        0.24,
        0.12,
    ),
    "blackwell": (
        96.0,
        86.0,
        80.0,
        48.0,
        45.1,
        42.0,
        40.0,
        30.0,
        24.0,
        22.0,
        20.0,
        17.5,
        15.0,
        12.0,
        6.0,
        3.0,
        2.4,
        1.2,
        0.24,
        0.12,
    ),
}
MAX_CHANNELS = 32  # MAXCHANNELS / 2 for rings and trees (NCCL's MAXCHANNELS is 64)
MAX_NVLS_ARITY = 16
