"""NCCL's all-reduce on multi-GPU fabrics: its choice of algorithm and protocol (``nccl``), forced choices,
fabrics as they are (NIC counts, transports), the defaults a user gets on GPU presets, and the ``ddp``
schedule of ``dpcomm simulate`` (docs/netsim.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpcomm.cli.main import main
from dpcomm.sim.network import FlowModel, make_fabric, simulate_allreduce
from dpcomm.sim.network.nccl_tuning import choose, graph, latency_us
from dpcomm.sim.network.nvls import nvls_rounds, nvls_tree_rounds
from dpcomm.sim.network.pricing import default_model
from dpcomm.topology import parse_multigpu

A100_4NIC = "gpus:3,8,nvlink=300GB/s,intra_eff=230/300,nics=4,nic=200gbit,arch=ampere"


def _pick(spec: str, nbytes: int) -> tuple[str, str]:
    c = choose(parse_multigpu(spec), nbytes, 10e9)
    return c.algorithm, c.protocol


def test_nccl_picks_as_its_maintainers_say():
    # one H100 server: NVLink SHARP at large sizes (nccl-tests#212: "allreduce uses NVLink SHARP by default")
    assert _pick("dgx-h100:1", 1 << 30) == ("nvls", "Simple")
    # H100 across servers: NVLSTree (nccl-tests#309); small sizes: the low-latency protocol on a tree
    assert _pick("dgx-h100:2", 1 << 30) == ("nvls_tree", "Simple")
    assert _pick("dgx-h100:16", 8)[1] == "LL"
    # A100 (no NVLS) on 3 servers of 4 HDR NICs: the ring, at 4 x 24 GB/s (nccl-tests#119's 96 GB/s)
    assert _pick(A100_4NIC, 128 << 20) == ("ring", "Simple")
    assert graph(parse_multigpu(A100_4NIC), "ring", 10e9).channels == 4


def test_nccl_latency_is_the_published_tables():
    # ring, Simple, 2 servers x 8: base 8.4 + 28 x max(3.4, 3 x 1.0) + 2 x 14 us (tuning.cc)
    assert latency_us(parse_multigpu("dgx-h100:2"), "ring", "Simple") == pytest.approx(
        8.4 + 28 * 3.4 + 2 * 14
    )
    # tree, LL, 16 servers: 6.8 + 2 (7 x 0.6 + 4 x 5.0)
    assert latency_us(parse_multigpu("dgx-h100:16"), "tree", "LL") == pytest.approx(
        6.8 + 2 * (7 * 0.6 + 4 * 5)
    )
    # EFA's own latency (aws-ofi-nccl reports 75 us on p4d/p5) is added per network hop, twice for Simple
    efa = parse_multigpu("gpus:2,8,nics=4,nic=100gbit,transport=efa,arch=ampere")
    ib = parse_multigpu("gpus:2,8,nics=4,nic=100gbit,transport=ib,arch=ampere")
    assert latency_us(efa, "ring", "Simple") - latency_us(ib, "ring", "Simple") == pytest.approx(2 * 2 * 75)


def test_forced_algorithm_and_protocol_run_as_named():
    model = default_model(make_fabric("dgx-h100:2", 10e9))
    got = {
        a: simulate_allreduce(model, a, 64 << 20)[0].ran for a in ("nccl-ring:LL128", "nccl-tree", "nccl:LL")
    }
    assert got["nccl-ring:LL128"].startswith("ring/LL128")
    assert got["nccl-tree"].startswith("tree/")
    assert got["nccl:LL"].endswith("x8") and "/LL " in got["nccl:LL"] + " "
    # LL sends a flag with every 4 data bytes: at 1 GiB the forced LL ring is far slower than Simple
    ll = simulate_allreduce(model, "nccl-ring:LL", 1 << 30)[0].time_s
    simple = simulate_allreduce(model, "nccl-ring:Simple", 1 << 30)[0].time_s
    assert ll > 2 * simple


def test_the_ib_preset_gets_nccl_latency_not_tcp_start_up(capsys):
    # issue 39: 45.26 us (TCP) per ring step halved dgx-h100's busbw at 1 GB; now NCCL's latencies
    assert (
        main(["netsim", "--topology", "dgx-h100:8", "--algorithms", "nccl-ring", "--sizes", "1G", "--json"])
        == 0
    )
    busbw = json.loads(capsys.readouterr().out)[0]["busbw_GBps"]
    assert busbw > 300
    # the same with the TCP start-up given on purpose: priced so, with a one-line note
    argv = ["netsim", "--topology", "dgx-h100:8", "--algorithms", "nccl-ring", "--sizes", "1G", "--json"]
    assert main([*argv, "--alpha-us", "45.26"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)[0]["busbw_GBps"] < 200
    assert out.err.count("\n") == 1 and "TCP start-up" in out.err


def test_simulate_on_a_gpu_preset_gives_no_fake_win(capsys):
    # issue 39's example: with the TCP start-up, optimal looked 2x faster than 25 MB buckets
    argv = ["simulate", "--trace", "gpt2-h200bf16-b8", "--nodes", "128", "--topology", "dgx-h100:16"]
    assert main([*argv, "--schedules", "bucket:25MB,optimal,ddp", "--json"]) == 0
    rows = {r["schedule"]: r["t_iter_s"] for r in json.loads(capsys.readouterr().out)}
    assert rows["optimal"] <= rows["bucket:25MB"] * 1.0001  # the planner's optimum is optimal here too
    assert rows["bucket:25MB"] / rows["optimal"] < 1.05
    assert rows["ddp"] / rows["optimal"] < 1.05


def test_netsim_header_counts_servers_and_gpus(capsys):
    assert main(["netsim", "--topology", "dgx-h100:8", "--sizes", "1M"]) == 0
    head = capsys.readouterr().out.split("\n")[0]
    assert "8 servers x 8 GPUs (64 ranks)" in head and "64 servers" not in head


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--topology", "dgx-h100:2", "--rate", "100gbit"], "sets its NICs' rate"),
        (["--topology", "dgx-h100:2", "--mtu", "9000"], "carries no TCP framing"),
        (["--topology", "gpus:2,8,nics=6"], "cannot be wired evenly"),
        (["--topology", "gpus:2,8,nics=0"], "cannot be wired evenly"),
        (["--topology", "gpus:2,8,transport=udp"], "transport is one of"),
        (["--topology", "dgx-a100:2", "--algorithms", "nccl-nvls"], "needs NVLink SHARP"),
        (["--topology", "dgx-h100:2", "--algorithms", "nccl-ring:LL256"], "unknown NCCL protocol"),
        (["--topology", "gpus:2,8,nic=0gbit"], "rate"),
        (["--topology", "p4d:2,algo=warp"], "algo is one of"),
        (["--topology", "p4d:2,algo=nvls"], "needs NVLink SHARP"),
        (["--topology", "p4d:2,channels=0"], "channels=0 must be from 1 to 64"),
        (["--topology", "p4d:2,lat_scale=lots"], "lat_scale=lots"),
    ],
)
def test_bad_fabric_input_is_one_line(argv, needle, capsys):
    rc = main(["netsim", *argv, "--sizes", "1M"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("dpcomm: error:") and needle in err


def test_rate_applies_where_the_spec_has_none(capsys):
    argv = ["netsim", "--topology", "gpus:2,8,nics=8", "--algorithms", "nccl-ring", "--sizes", "1G", "--json"]
    assert main([*argv, "--rate", "100gbit"]) == 0
    slow = json.loads(capsys.readouterr().out)[0]["busbw_GBps"]
    assert main([*argv, "--rate", "400gbit"]) == 0
    fast = json.loads(capsys.readouterr().out)[0]["busbw_GBps"]
    assert fast > 2 * slow  # 8 x 12 vs 8 x 48 GB/s of NICs (x 0.96, InfiniBand)


def test_more_nics_than_gpus_join_per_gpu():
    # 16 x 100G RoCE on 8 GPUs: each GPU's two NICs are one link of 2 x 12.5 x 0.96 GB/s
    f = make_fabric("gpus:2,8,nics=16,nic=100gbit,transport=roce", 10e9)
    cap = dict(zip(f.names, f.capacity, strict=True))
    assert cap["h0n7>sw"] == pytest.approx(2 * 12.5e9 * 0.96) and "h0n8>sw" not in cap
    t = parse_multigpu("gpus:2,8,nics=16,nic=100gbit,transport=roce")
    assert t.nic_count == 16 and "16 x 100gbit RoCE NICs" in t.describe()


def test_netsim_on_gpu_servers_does_not_import_torch():
    code = (
        "import sys; from dpcomm.cli.main import main; "
        "main(['netsim', '--topology', 'dgx-h100:4', '--sizes', '1M,1G', '--json']); "
        "print('torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("False")


def test_ddp_schedule_is_ddps_default_buckets():
    from dpcomm.costmodel import LinearCost
    from dpcomm.planner import make_plan
    from dpcomm.trace import find_trace

    trace = find_trace("gpt2-h200bf16-b8")
    plan = make_plan("ddp", trace, LinearCost(1e-5, 1e-10), 8)
    sizes = [sum(trace.layer_bytes(i) for i in g) for g in plan.groups]
    assert plan.groups[0][-1] == trace.num_layers - 1  # the last layer's gradients go first
    assert sizes[0] >= 1 << 20 and sizes[0] - trace.layer_bytes(plan.groups[0][0]) < 1 << 20  # 1 MiB first
    for g, size in zip(plan.groups[1:-1], sizes[1:-1], strict=True):  # then 25 MiB caps, met at the end
        assert size >= 25 << 20 and size - trace.layer_bytes(g[0]) < 25 << 20


def test_flow_model_prices_switch_endpoints():
    # one H100 server, NVLS at 1 GiB: every GPU sends and receives S (1 + 1/G) / 0.85 over its NVLink,
    # through a 3-stage pipeline of 64 rounds (16 MiB each: nvls_rounds), so x (64 + 2) / 64
    model = FlowModel(make_fabric("dgx-h100:1", 10e9), alpha_s=0.0)
    t = simulate_allreduce(model, "nccl-nvls", 1 << 30)[0].time_s
    want = (1 << 30) * (1 + 1 / 8) / 0.85 / 370e9 * 66 / 64
    assert t == pytest.approx(want, rel=1e-6)


def test_nvls_one_server_chunks_and_fill_are_nccls():
    # NCCL's NVLS chunking inside one server (src/enqueue.cc calcCollChunking): 16 channels x 8 heads; 128 KiB
    # chunks from 64 x 128 x 128 KiB = 1 GiB, 64 KiB below it (32 x in NCCL 2.17), 32 KiB below 64 MiB
    assert nvls_rounds("hopper", 8, 1 << 30) == (64, 128, 128 << 10)
    assert nvls_rounds("hopper", 8, 512 << 20) == (64, 128, 64 << 10)
    assert nvls_rounds("hopper", 8, 512 << 20, "2.17.1") == (32, 128, 128 << 10)
    assert nvls_rounds("hopper", 8, 64 << 20) == (8, 128, 64 << 10)
    assert nvls_rounds("hopper", 8, 32 << 20) == (8, 128, 32 << 10)
    assert nvls_rounds("blackwell", 8, 1 << 30)[1] == 24 * 8  # NVLS_NCHANNELS_SM100_NVL from NCCL 2.27
    assert nvls_rounds("blackwell", 8, 1 << 30, "2.26.2")[1] == 32 * 8
    # the price: 3 stages (scatter, reduce-broadcast, gather), so 64 MiB (8 rounds) is x 10/8 of the stream
    # and 512 MiB (64 rounds) x 66/64, the same per byte otherwise
    model = FlowModel(make_fabric("dgx-h100:1", 10e9), alpha_s=0.0)
    small, big = (simulate_allreduce(model, "nccl-nvls", n)[0].time_s for n in (64 << 20, 512 << 20))
    assert small / (64 << 20) == pytest.approx(big / (512 << 20) * (10 / 8) / (66 / 64), rel=1e-6)


def test_nvls_tree_chunks_and_pipeline_fill_are_nccls():
    # NCCL's NVLSTree chunking (src/enqueue.cc, src/transport/nvls.cc): H100, 2 servers, 8 heads: 16 channels
    # x 8 heads of 128 KiB = 16 MiB a round, so 64 MiB is 4 rounds; at 8 MiB the chunk halves to 64 KiB
    assert nvls_tree_rounds("hopper", 2, 8, 8, 50.0, 64 << 20) == (4, 128, 128 << 10)
    assert nvls_tree_rounds("hopper", 2, 8, 8, 50.0, 8 << 20) == (1, 128, 64 << 10)
    # from 4 servers NVLSTree's chunk is at most 64 KiB; B200 on 2 servers of 400G NICs: 32 x 8 ops of 64 KiB
    assert nvls_tree_rounds("hopper", 4, 8, 8, 50.0, 1 << 30)[2] == 64 << 10
    assert nvls_tree_rounds("blackwell", 2, 8, 8, 50.0, 64 << 20) == (4, 256, 64 << 10)
    # the price: the streaming step x (n + D - 1) / n, D = 1 + 2 log2 M = 3 stages on 2 servers
    model = FlowModel(make_fabric("dgx-h100:2", 10e9), alpha_s=0.0)
    small, big = (simulate_allreduce(model, "nccl-nvlstree", n)[0].time_s for n in (64 << 20, 1 << 30))
    assert small / (64 << 20) == pytest.approx(big / (1 << 30) * (4 + 2) / 4 / ((64 + 2) / 64), rel=1e-6)


def test_simulate_prices_ps_schedules_on_the_topology(capsys):
    # the ps-* schedules used --network's beta whatever the topology; now a byte costs what it costs there
    argv = ["simulate", "--trace", "resnet50-k80-b32", "--nodes", "16", "--schedules", "ps-all", "--json"]
    got = {}
    for nic in ("100gbit", "400gbit"):
        assert main([*argv, "--topology", f"gpus:2,8,nics=8,nic={nic}"]) == 0
        got[nic] = json.loads(capsys.readouterr().out)[0]["t_iter_s"]
    assert got["100gbit"] > got["400gbit"]


def test_simulate_header_names_servers_and_gpus(capsys):
    argv = ["simulate", "--trace", "resnet50-k80-b32", "--nodes", "16", "--schedules", "ddp"]
    assert main([*argv, "--topology", "dgx-h100:2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 servers x 8 GPUs (16 ranks)" in out and "all-reduce nccl on dgx-h100:2" in out


def test_what_calibrate_fits_is_spec_keys():
    # algo= narrows NCCL's choice as NCCL_ALGO does; channels= sets the ring's and tree's channels;
    # lat_scale= scales NCCL's latency of an LL128/Simple call and replaces the start-up per message there
    def run(spec, alpha=None, nbytes=1 << 30):
        row, _ = simulate_allreduce(default_model(make_fabric(spec, 10e9), alpha), "nccl", nbytes)
        return row

    assert run("p4d:2").ran.startswith("tree/") and run("p4d:2,algo=ring").ran == "ring/Simple x4"
    assert run("p4d:2,algo=ring,channels=8").ran == "ring/Simple x8"
    t = parse_multigpu("p4d:2,algo=ring,channels=8,lat_scale=2.5")
    assert parse_multigpu(t.spec) == t and graph(t, "tree", 10e9).channels == 8
    base, scaled = run("p4d:2,algo=ring").time_s, run("p4d:2,algo=ring,lat_scale=2").time_s
    lat = latency_us(parse_multigpu("p4d:2"), "ring", "Simple") * 1.4e-6  # with the ring's plateau
    assert scaled - base == pytest.approx(lat, rel=1e-6)
    # with a start-up per message given, a scaled call pays the scaled latency, not the start-up
    assert run("p4d:2,algo=ring,lat_scale=2", alpha=50e-6).time_s == pytest.approx(scaled, rel=1e-9)
    assert run("p4d:2,algo=ring", alpha=50e-6).time_s > base  # unscaled: 30 messages x 50 us
