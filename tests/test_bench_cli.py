"""``dpcomm bench``: a tiny real run (2 workers), one-line errors with exit 2, the fit on synthetic rows.

Budget: < 40 s (one launch of 2 workers; everything else runs in-process without workers).
"""

from __future__ import annotations

import json

import pytest

from dpcomm.cli.main import main
from dpcomm.collectives import bench_fit
from dpcomm.collectives import benchmark as bm
from dpcomm.costmodel import Network, load_network
from dpcomm.costmodel.collective import collective_cost
from dpcomm.errors import UserError

KEYS = {"op", "algo", "nproc", "bytes", "time_s", "algbw_GBps", "busbw_GBps", "check"}


@pytest.mark.slow
def test_tiny_real_run_json_check_and_fit(capsys, tmp_path):
    net_file = tmp_path / "net.json"
    argv = ["bench", "--nproc", "2", "--algos", "ring,auto", "--ops", "allreduce,reduce", "--sizes", "4,64K"]
    rc = main([*argv, "--iters", "2", "--check", "--json", "--fit", str(net_file)])
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0
    rows = json.loads(out)
    assert [(r["op"], r["algo"], r["bytes"]) for r in rows] == [
        (op, algo, size) for op in ("allreduce", "reduce") for size in (4, 65536) for algo in ("ring", "auto")
    ]
    for r in rows:
        assert set(r) == KEYS and r["nproc"] == 2 and r["check"] == "ok" and r["time_s"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        factor = 2 * (2 - 1) / 2 if r["op"] == "allreduce" else 1.0  # nccl-tests busbw factors
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
    net = load_network(net_file)  # a valid dpcomm-network/1 file (values: whatever a loaded 2-core VM gives)
    assert net.name == "net" and "4 rows of ring" in net.source  # auto has no formula of its own
    assert "fitted network" in captured.err and "each formula" in captured.err  # stdout stays pure JSON


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--nproc", "0"], "--nproc"),
        (["--nproc", "two"], "--nproc"),
        (["--nproc", "2", "--algos", "ring,warp"], "unknown algorithm 'warp'"),
        (["--nproc", "2", "--ops", "allgather"], "unknown op 'allgather'"),
        (["--nproc", "2", "--sizes", "4,12Q"], "'12Q'"),
        (["--nproc", "6", "--algos", "bcube"], "got 6"),
        (["--nproc", "4", "--algos", "ring,bcube", "--bcube", "3,2"], "--bcube 3,2 is 9 ranks"),
        (["--nproc", "4", "--bcube", "3"], "--bcube must be n,k"),
        (["--nproc", "2", "--dtype", "float8"], "unknown dtype"),
        (["--nproc", "2", "--iters", "0"], "--iters"),
        (["--nproc", "1", "--fit", "x.json"], "--fit needs"),
        (["--nproc", "1", "--nnodes", "2", "--node-rank", "2", "--master-port", "29400"], "--node-rank"),
        (["--nproc", "1", "--nnodes", "2"], "--master-port"),
        (
            ["--nproc", "2", "--nnodes", "2", "--master-port", "9", "--algos", "bcube", "--bcube", "3,2"],
            "not 4",
        ),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv, words):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpcomm: error:") and words in err


@pytest.mark.slow
def test_two_machines_as_torchrun_runs_them(tmp_path):
    """``--nnodes 2`` on loopback: two `dpcomm bench` commands (one worker each) are one world of 2, and
    each prints the same rows, timed as the slowest of all ranks (what `testbed launch` runs per server)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "dpcomm",
        "bench",
        "--nproc",
        "1",
        "--nnodes",
        "2",
        "--master-port",
        str(port),
    ]
    argv += ["--algos", "ring,native", "--ops", "allreduce", "--sizes", "1K", "--check", "--json"]
    procs = [
        subprocess.Popen(
            [*argv, "--node-rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    rows = [json.loads(o) for o, _ in outs]
    assert rows[0] == rows[1] and [r["algo"] for r in rows[0]] == ["ring", "native"]
    assert all(r["nproc"] == 2 and r["check"] == "ok" for r in rows[0])


def test_bcube_is_skipped_with_a_note_when_p_is_not_a_power():
    cfg = bm.BenchConfig(nproc=6, algos=("ring", "bcube")).resolved()
    assert cfg.algos == ("ring",) and len(cfg.notes) == 1 and "bcube skipped" in cfg.notes[0]
    assert bm.BenchConfig(nproc=8, algos=("ring", "bcube")).resolved().algos == ("ring", "bcube")
    with pytest.raises(UserError):
        bm.BenchConfig(nproc=6, algos=("bcube",)).resolved()


def test_a_failed_check_exits_1(monkeypatch, capsys):
    bad = bm.Row(
        op="allreduce", algo="ring", nproc=2, bytes=4, time_s=1e-4, algbw_GBps=0, busbw_GBps=0, check="FAIL"
    )
    monkeypatch.setattr(bm, "run_bench", lambda cfg: bm.BenchResult(rows=(bad,)))
    assert main(["bench", "--nproc", "2", "--algos", "ring", "--sizes", "4", "--json"]) == 1
    assert "FAIL" in capsys.readouterr().err


def test_fit_recovers_known_alpha_beta_gamma_from_synthetic_rows():
    truth = Network(name="truth", alpha=37e-6, beta=2.5e-9, gamma=0.4e-9)
    rows = []
    for algo, opts in (("ring", {}), ("mst", {}), ("be", {}), ("ps", {}), ("lp", {"block_bytes": 65536})):
        for op in ("allreduce", "broadcast", "reduce"):
            for p in (2, 3, 4, 8):
                for nbytes in (1024, 65536, 1 << 20, 16 << 20):
                    t = collective_cost(op, algo, nbytes, p, truth, **opts)
                    rows.append(
                        bm.Row(
                            op=op,
                            algo=algo,
                            nproc=p,
                            bytes=nbytes,
                            time_s=t,
                            algbw_GBps=0,
                            busbw_GBps=0,
                            check="ok",
                        )
                    )
    net, reports = bench_fit.fit_network(rows, name="fit", block_bytes=65536)
    assert net.alpha == pytest.approx(truth.alpha, rel=1e-6)
    assert net.beta == pytest.approx(truth.beta, rel=1e-6)
    assert net.gamma == pytest.approx(truth.gamma, rel=1e-6)
    assert {r.algo for r in reports} == {"ring", "mst", "be", "ps", "lp"}
    assert all(r.in_fit and r.max_rel_err < 1e-6 and r.own_median_rel_err < 1e-6 for r in reports)


def test_fit_reports_a_formula_that_does_not_fit():
    # ring rows that grow like log2(P) * M (a tree's shape) cannot be matched by ring's (P-1)/P formula
    truth = Network(name="truth", alpha=10e-6, beta=1e-9)
    rows = [
        bm.Row(op="allreduce", algo=algo, nproc=p, bytes=m, check="ok", algbw_GBps=0, busbw_GBps=0,
               time_s=collective_cost("allreduce", "mst", m, p, truth))
        for algo in ("ring", "mst") for p in (2, 4, 8) for m in (1024, 1 << 20, 16 << 20)
    ]  # fmt: skip
    _, reports = bench_fit.fit_network(rows)
    by = {r.algo: r for r in reports}
    assert by["mst"].own_median_rel_err < 1e-6 and by["ring"].own_median_rel_err > 0.05
