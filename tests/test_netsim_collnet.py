"""NCCL's CollNet all-reduces (InfiniBand SHARP): Chain beside Direct (``dpcomm.sim.network.collnet``), their
names, and a table that ran one of them. Pure and fast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpcomm.cli.main import main

# 2 servers x 4 GPUs on NVSwitch, 2 NICs per server (NIC n beside GPU 2n), switches that reduce
SMALL = "gpus:2,4,nvlink=100GB/s,nics=2,nic=100gbit,net=star,sharp=1"


def _bytes_per_link(steps, spec=SMALL):
    from dpcomm.sim.network import FlowModel, make_fabric

    fabric = make_fabric(spec, 10e9)
    return dict(zip(fabric.names, FlowModel(fabric, 0.0).link_bytes(steps).astype(int).tolist(), strict=True))


def test_chain_bytes_per_link_by_hand():
    from dpcomm.sim.network.collnet import collnet_chain_steps

    # 2 channels of 400 B (S = 800): channel 0's chain is GPUs 0-1-2-3 (head 0, beside NIC 0), channel 1's
    # 2-3-0-1 (head 2, beside NIC 1). Each edge carries 400 B up (partial sums) and 400 B down (the result):
    # GPU 0 sends 0->1 (ch 0 down), 0->3 (ch 1 up), 0->1 (ch 1 down) = 1200 and receives 1->0, 1->0, 3->0 =
    # 1200; so every GPU, 2 S (C - 1/2) / C = 1.5 S (it heads or ends one chain of two). A head sends its
    # channel's 400 B to its rail's switch and gets 400 B back: 400 B on each NIC each way (S / R)
    got = _bytes_per_link(collnet_chain_steps(8, 4, 800, heads=2, channels=2, sw0=8 + 2))
    for h in range(2):
        for g in range(4):
            assert got[f"h{h}g{g}>nv"] == got[f"nv>h{h}g{g}"] == 1200
        for n in range(2):
            assert got[f"h{h}n{n}>sw"] == got[f"sw>h{h}n{n}"] == 400
    # one channel (S = 800 on one chain 0-1-2-3, head 0): the middle GPUs send 800 up and 800 down, the head
    # 800 down only (its sum goes to the switch over NIC 0), the tail 800 up only; NIC 1 idles
    got = _bytes_per_link(collnet_chain_steps(8, 4, 800, heads=2, channels=1, sw0=10))
    assert [got[f"h0g{g}>nv"] for g in range(4)] == [800, 1600, 1600, 800]
    assert [got[f"nv>h0g{g}"] for g in range(4)] == [800, 1600, 1600, 800]
    assert (got["h0n0>sw"], got["sw>h0n0"], got["h0n1>sw"], got["sw>h0n1"]) == (800, 800, 0, 0)


def test_direct_moved_and_unchanged():
    from dpcomm.sim.network.collnet import collnet_steps

    # Direct: every GPU sends S/R to each other head (R = 2: one 400 B share) and a head gets S/R from each
    # of the G - 1 others (3 x 400) for its share: GPU 0 (a head) sends 400 to head 2 + 3 x 400 back = 1600
    got = _bytes_per_link(collnet_steps(8, 4, 800, heads=2, sw0=10))
    assert [got[f"h0g{g}>nv"] for g in range(4)] == [1600, 800, 1600, 800]
    assert got["h0n0>sw"] == got["h0n1>sw"] == 400
    with pytest.raises(ValueError, match="across servers"):
        collnet_steps(4, 4, 800, heads=2, sw0=10)


def test_nccl_collnet_chain_prices_as_run():
    from dpcomm.sim.network import make_fabric, simulate_allreduce
    from dpcomm.sim.network.pricing import default_model

    model = default_model(make_fabric("dgx-h100:2,sharp=1", 10e9))
    s = 1 << 30
    chain, run = simulate_allreduce(model, "nccl-collnet-chain", s, links=True)
    direct = simulate_allreduce(model, "nccl-collnet-direct", s)[0]
    legacy = simulate_allreduce(model, "nccl-collnet", s)[0]
    assert chain.ran.startswith("collnet_chain/Simple") and direct.ran.startswith("collnet_direct/Simple")
    assert legacy.time_s == direct.time_s and legacy.algorithm == "nccl-collnet"  # nccl-collnet is Direct
    # NVLink-bound: each GPU sends 2 S (G-1)/G = 1.75 S at 370 GB/s (dgx-h100's achievable NVLink), so
    # busbw 2 (P-1)/P S / T = 2 x 15/16 x 370 / 1.75 = 396 GB/s, less NCCL's latency (tens of us of 5 ms)
    assert chain.busbw_GBps == pytest.approx(2 * 15 / 16 * 370 / 1.75, rel=0.03)
    assert run.link_bytes is not None and np.isclose(run.link_bytes.max(), 1.75 * s, rtol=0.01)


def test_collnet_names_spec_log_and_choice(capsys):
    from dpcomm.sim.network import make_fabric, simulate_allreduce
    from dpcomm.sim.network.fit import candidates
    from dpcomm.sim.network.nccl_tests import parse_nccl_tests
    from dpcomm.sim.network.pricing import default_model
    from dpcomm.topology import parse_multigpu

    # algo= narrows NCCL's choice to either (collnet alone is Direct, as before)
    for algo, ran in (
        ("collnet-chain", "collnet_chain"),
        ("collnet-direct", "collnet_direct"),
        ("collnet", "collnet_direct"),
    ):
        model = default_model(make_fabric(f"dgx-h100:2,sharp=1,algo={algo}", 10e9))
        row = simulate_allreduce(model, "nccl", 1 << 28)[0]
        assert row.ran.startswith(ran) and row.algorithm == f"nccl-{algo}"
    # a log that ran NCCL_ALGO=CollNetChain (NCCL's own spelling, any case) is priced as run
    log = parse_nccl_tests(
        "#  NCCL_ALGO=CollNetChain\n 1073741824 268435456 float sum -1 9000 0 0 0 9000 0 0 0\n"
    )
    assert log.algorithm == "nccl-collnet-chain"
    text = "NCCL_ALGO set by environment to CollnetDirect\n 8 2 float sum -1 9 0 0 0 9 0 0 0\n"
    assert parse_nccl_tests(text).algorithm == "nccl-collnet-direct"
    # calibrate tries both where the switches reduce; NCCL's own choice runs Chain's schedule where it picks
    assert {"nccl-collnet", "nccl-collnet-chain"} <= set(candidates(parse_multigpu("dgx-h100:2,sharp=1")))
    row = simulate_allreduce(default_model(make_fabric("p4d:2,sharp=1", 10e9)), "nccl", 1 << 30)[0]
    assert row.ran.startswith("collnet_chain/Simple")  # NCCL's tuning model picks Chain on p4d's 4 NICs
    argv = [
        "netsim",
        "--topology",
        "dgx-h100:2,sharp=1",
        "--algorithms",
        "nccl-collnet-chain",
        "--sizes",
        "1G",
    ]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["ran"].startswith("collnet_chain/")


@pytest.mark.parametrize(
    ("topology", "algo", "words"),
    [
        ("dgx-h100:2", "nccl-collnet-chain", "nccl-collnet-chain needs switches that reduce (sharp=1)"),
        ("dgx-h100:1,sharp=1", "nccl-collnet-chain", "servers (2+)"),
        ("gpus:2,8,pcie=32GB/s,nic=100gbit,sharp=1", "nccl-collnet-direct", "NVSwitch"),
        ("gpus:2,16,nic=100gbit,sharp=1", "nccl-collnet-chain", "at most 8 GPUs"),
        ("dgx-h100:2,sharp=1,algo=collnet-ring", "nccl", "algo is one of"),
    ],
)
def test_collnet_where_nccl_has_none_is_one_line(capsys, topology, algo, words):
    assert main(["netsim", "--topology", topology, "--algorithms", algo, "--sizes", "1M"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcomm: error: ") and words in err and err.count("\n") == 1, err
