"""``dpcomm calibrate --from-nccl-tests`` round trips: a table the model wrote for a known fabric is fitted
back to that fabric (start-up, fractions, rows of 64 MB and up within 5%). Apart from tests/test_calibrate.py
so that the fast tier spreads these fits over its workers."""

from __future__ import annotations

import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel import load_network
from tests._nccl_logs import SIZES
from tests._nccl_logs import model_rows as _model_rows
from tests._nccl_logs import nccl_tests_log as _nccl_tests_log


@pytest.mark.parametrize(
    ("truth", "given", "algo"),
    [
        # A100, 4 HDR NICs per server, 3 servers: NIC-bound ring; the NIC fraction is recovered
        ("gpus:3,8,nvlink=300GB/s,intra_eff=230/300,nics=4,nic=200gbit,nic_eff=0.81,arch=ampere",
         "gpus:3,8,nvlink=300GB/s,intra_eff=230/300,nics=4,nic=200gbit,arch=ampere", "nccl"),
        # H100 on 2 servers, NCCL's choice (NVLSTree at large sizes), a slower fabric than the preset's
        ("dgx-h100:2,nic_eff=0.7,intra_eff=0.7", "dgx-h100:2", "nccl"),
        # one server, forced ring: the NVLink fraction
        ("dgx-h100:1,intra_eff=0.75", "dgx-h100:1", "nccl-ring"),
    ],
)  # fmt: skip
def test_from_nccl_tests_round_trips(tmp_path, capsys, truth, given, algo):
    from dpcomm.topology import parse_multigpu

    p = parse_multigpu(truth).servers
    rows = _model_rows(truth, algo, 3e-6, SIZES)
    log = tmp_path / "all_reduce.log"
    log.write_text(_nccl_tests_log(rows, ranks=p))
    out = tmp_path / "net.json"
    argv = ["calibrate", "--from-nccl-tests", str(log), "--topology", given, "-o", str(out)]
    assert main([*argv, *(["--algo", algo] if algo != "nccl" else [])]) == 0
    net = load_network(out)
    assert net.fabric["alpha_s"] == pytest.approx(3e-6, rel=0.02)  # the start-up, from 8 B .. 64 KiB
    refit = _model_rows(net.fabric["topology"], algo, net.fabric["alpha_s"], SIZES)
    for (n, t), (_, got) in zip(rows, refit, strict=True):
        if n >= 64 << 20:
            assert abs(got / t - 1) < 0.05, (n, got, t)  # reproduces the table within 5% at 64 MB and up
    if "nics=4" in truth:
        assert net.fabric["nic_eff"] == pytest.approx(0.81, rel=0.01)
    assert net.allreduce_tables[p][0] == (8.0, pytest.approx(rows[0][1], rel=1e-3))
    assert "rows of 4 KiB and up" in capsys.readouterr().out
