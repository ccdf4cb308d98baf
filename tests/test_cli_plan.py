"""``dpcomm plan`` and ``dpcomm simulate``: JSON schemas, files written, bad input -> one line, exit 2.

Runs the CLI in-process (``dpcomm.cli.main.main``), no subprocesses. Budget: ~5 s.
"""

import json

import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel.base import LinearCost
from dpcomm.trace import save_trace
from tests._sim_ref import make_trace, ref_t_iter


@pytest.fixture
def trace_file(tmp_path):
    trace = make_trace([0.002, 0.001, 0.003, 0.002], [0.001] * 4, [1000, 200_000, 50_000, 4_000_000], 4)
    path = tmp_path / "t.json"
    save_trace(trace, path)
    return trace, str(path)


def _json(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_plan_json_schema(trace_file, capsys):
    trace, path = trace_file
    argv = ["plan", "--trace", path, "--nodes", "16", "--schedule", "optimal", "--linear-cost", "0.001,1e-9"]
    obj = _json(capsys, argv + ["--json"])
    assert set(obj) == {"schedule", "nodes", "groups", "t_iter_s", "t_comm_exposed_s", "planning_s"}
    assert obj["schedule"] == "optimal" and obj["nodes"] == 16
    assert sorted(l for g in obj["groups"] for l in g) == [0, 1, 2, 3] and 3 in obj["groups"][0]
    t = ref_t_iter(trace, obj["groups"], LinearCost(0.001, 1e-9))
    assert obj["t_iter_s"] == pytest.approx(t)
    assert obj["t_comm_exposed_s"] == pytest.approx(t - trace.t_f - trace.t_b)
    assert obj["planning_s"] >= 0
    assert main(argv) == 0 and "optimal plan" in capsys.readouterr().out  # the rich table


def test_plan_with_network_preset(trace_file, capsys):
    _, path = trace_file
    obj = _json(
        capsys,
        [
            "plan",
            "--trace",
            path,
            "--nodes",
            "8",
            "--network",
            "10gbe",
            "--schedule",
            "bucket:25MB",
            "--json",
        ],
    )
    assert obj["schedule"] == "bucket:25MB" and obj["groups"] == [[0, 1, 2, 3]]  # 16.8 MB < 25 MB


def test_simulate_json_and_files(trace_file, tmp_path, capsys):
    _, path = trace_file
    files = [tmp_path / "s.png", tmp_path / "t.png", tmp_path / "c.json"]
    argv = ["simulate", "--trace", path, "--nodes", "4,8,16", "--network", "10gbe"]
    argv += ["--schedules", "wfbp,single,mgwfbp,optimal", "--json"]
    argv += ["--plot", str(files[0]), "--timeline", str(files[1]), "--chrome-trace", str(files[2])]
    rows = _json(capsys, argv)
    assert [(r["nodes"], r["schedule"]) for r in rows] == [
        (n, s) for n in (4, 8, 16) for s in ("wfbp", "single", "mgwfbp", "optimal")
    ]
    for r in rows:
        assert set(r) == {"nodes", "schedule", "t_iter_s", "speedup", "efficiency"}
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["nodes"])
    assert files[0].read_bytes()[:4] == files[1].read_bytes()[:4] == b"\x89PNG"
    assert "traceEvents" in json.loads(files[2].read_text())
    assert main(argv[:-6]) == 0 and "optimal" in capsys.readouterr().out  # the rich table


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--nodes", "4", "--schedule", "nope"],
        ["plan", "--nodes", "0"],
        ["plan", "--nodes", "-3"],
        ["plan", "--nodes", "4", "--schedule", "bucket:12XB"],
        ["plan", "--nodes", "4", "--schedule", "bucket:0"],
        ["plan", "--nodes", "4", "--network", "nosuchnet"],
        ["plan", "--nodes", "4", "--linear-cost", "1"],
        ["plan", "--nodes", "4,8"],
        ["simulate", "--nodes", "4,x"],
        ["simulate", "--schedules", "wfbp,zz"],
        ["simulate", "--nodes", "4,8", "--timeline-nodes", "16"],
    ],
)
def test_bad_input_one_line_exit_2(trace_file, capsys, argv):
    assert main(argv + ["--trace", trace_file[1]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcomm: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("content", ["{not json", '{"format": "dpcomm-trace/1"}', "[]"])
def test_bad_trace_file(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for cmd in (["plan", "--nodes", "4"], ["simulate"]):
        assert main(cmd + ["--trace", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad) in err
    assert main(["plan", "--nodes", "4", "--trace", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
