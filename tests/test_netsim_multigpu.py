"""Servers with several accelerators: ``gpus:``/``dgx-*`` specs, their links and the multi-GPU schedules
(``hierarchical``, ``nccl-ring``, ``nccl-tree``) against hand-worked alpha-beta times (docs/netsim.md)."""

from __future__ import annotations

import numpy as np
import pytest

from dpcomm.sim.network import FlowModel, make_fabric, nccl_tree, simulate_allreduce
from dpcomm.sim.network.nccl_tree import dtree_parents
from dpcomm.topology import parse_multigpu

S = 1 << 24  # bytes
A = 1e-6  # alpha, s
SPEC = (
    "gpus:2,2,nvlink=100GB/s,nic=200gbit,nic_eff=1"  # 2 servers x 2 GPUs, NVLink 100 GB/s, 2 NICs of 25 GB/s
)


def _time(spec: str, algo: str, nbytes: int = S) -> float:
    return simulate_allreduce(FlowModel(make_fabric(spec, 10e9), alpha_s=A), algo, nbytes)[0].time_s


def test_spec_reads_back_and_presets_spell_out():
    t = parse_multigpu("dgx-h100:2,nics=4")
    assert (t.hosts, t.gpus, t.nic_count, t.servers) == (2, 8, 4, 16)
    # line rates and NCCL's achievable fractions (nccl-tests#212: 370 of 450 GB/s; #319: 48 of 50 GB/s)
    want = "gpus:2,8,nvlink=450GB/s,intra_eff=0.8222222222222222,nics=4,nic=400gbit,nic_eff=0.96,net=star"
    assert t.spec == want
    assert parse_multigpu(t.spec) == t
    assert parse_multigpu("gpus:1,2,intra_eff=370/450").intra_eff == 370 / 450


def test_links_carry_the_line_rate_times_the_efficiency():
    f = make_fabric("gpus:2,2,nvlink=100GB/s,intra_eff=3/4,nic=200gbit,nic_eff=0.5", 10e9)
    cap = dict(zip(f.names, f.capacity, strict=True))
    assert cap["h0g0>nv"] == pytest.approx(75e9) and cap["h1n1>sw"] == pytest.approx(12.5e9)


def test_hierarchical_2x2_is_the_alpha_beta_formula():
    # 2 (G-1) (a + S/(G B_in)) + 2 (M-1) (a + S/(G M) / B_nic), G = M = 2
    want = 2 * (A + S / 2 / 100e9) + 2 * (A + S / 4 / 25e9)
    assert _time(SPEC, "hierarchical") == pytest.approx(want, rel=1e-9)


def test_nccl_ring_2x2_is_the_alpha_beta_formula():
    # 2 (P-1) (a + S/P max(1/B_in, 1/(N_nic B_nic))), P = 4; the exit GPU's data crosses NVLink (PXN)
    want = 6 * (A + S / 4 * max(1 / 100e9, 1 / 50e9))
    assert _time(SPEC, "nccl-ring") == pytest.approx(want, rel=1e-9)


def test_a_cross_rail_transfer_goes_over_nvlink_to_the_destination_rail():
    f = make_fabric(SPEC, 10e9)
    route = [f.names[x] for x in f.routes(np.array([1]), np.array([2]))[0] if x >= 0]  # h0g1 -> h1g0
    assert route == ["h0g1>nv", "nv>h0g0", "h0n0>sw", "sw>h1n0"]


def test_nccl_double_binary_tree_is_ncclGetDtree():
    # trees.cc's pictures: 12 ranks mirror (roots 0 and 11), 13 ranks shift by one (roots 0 and 1)
    t0, t1 = dtree_parents(12)
    assert t0.tolist() == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 8, 10]
    assert t1.tolist() == [1, 3, 1, 11, 5, 7, 5, 3, 9, 7, 9, -1]
    assert dtree_parents(13)[1].tolist() == [9, -1, 3, 5, 3, 9, 7, 5, 7, 1, 11, 0, 11]


@pytest.mark.slow
def test_nccl_tree_one_server_is_the_pipelined_chain():
    # one server: a chain of G = 4 GPUs, D = 2 (G - 1) stages; K = 1 chunk when S_t <= 512 KiB
    spec, small = "gpus:1,4,nvlink=100GB/s,nics=1", 4 * 4096  # S_t = S/(2 C) = 8 KiB, C = 1 channel
    # fill: one pipeline (tree 0): a middle GPU's NVLink send link carries its up and down chunk, B_in / 2
    # each; stream: 4 flows of S_t (up and down, two trees), B_in / 4 each; one alpha per stage
    want = 6 * A + (5 * 2 + 4) * (small / 2) / 100e9
    model = FlowModel(make_fabric(spec, 10e9), alpha_s=A)
    assert model.run(nccl_tree.steps(4, 4, small // 4, 4, channels=1)).time_s == pytest.approx(want, rel=1e-9)


@pytest.mark.slow
def test_schedules_on_partial_and_pcie_servers_move_every_byte():
    # 4 ranks on servers of 8 (one server), and 2 servers sharing a PCIe bus and one NIC
    for spec, ranks in (("dgx-a100:2", 4), ("gpus:2,4,pcie=32GB/s,nics=1,nic=100gbit", 8)):
        model = FlowModel(make_fabric(spec, 10e9), alpha_s=0.0)
        for algo in ("hierarchical", "nccl-ring", "nccl-tree", "ring"):
            row, run = simulate_allreduce(model, algo, S, ranks=ranks, links=True)
            assert row.time_s > 0 and run.link_bytes.sum() > 0


@pytest.mark.slow
def test_cli_netsim_and_simulate_answer_for_dgx_servers(capsys):
    from dpcomm.cli.main import main

    assert (
        main(
            [
                "netsim",
                "--topology",
                "dgx-h100:2",
                "--algorithms",
                "nccl-ring",
                "--sizes",
                "1G",
                "--alpha-us",
                "1",
                "--json",
            ]
        )
        == 0
    )
    # the exits leave by their own NICs (net=star): min(NVLink 370 x 8/7, 8 NICs x 50 x 48/50) = 384 GB/s,
    # less 30 alpha of 1 us (nccl-tests#212, #319)
    assert 375 < __import__("json").loads(capsys.readouterr().out)[0]["busbw_GBps"] < 384
    argv = ["simulate", "--trace", "resnet50-k80-b32", "--nodes", "16", "--topology", "dgx-h100:2"]
    assert main([*argv, "--algo", "nccl-tree", "--schedules", "wfbp", "--json"]) == 0
    assert __import__("json").loads(capsys.readouterr().out)[0]["nodes"] == 16
