"""``dpcomm plan`` and ``dpcomm simulate``: JSON schemas, files written, bad input -> one line, exit 2.

Runs the CLI in-process (``dpcomm.cli.main.main``), no subprocesses. Budget: ~5 s.
"""

import json

import pytest

from dpcomm.cli._costargs import load_trace_arg
from dpcomm.cli.main import main
from dpcomm.costmodel import Network, allreduce_cost, save_network
from dpcomm.costmodel.base import LinearCost
from dpcomm.planner.dear import limits
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
    assert set(obj) == {
        "schedule", "nodes", "groups", "t_iter_s", "t_comm_exposed_s", "planning_s", "limit_s", "verdict",
    }  # fmt: skip
    assert obj["schedule"] == "optimal" and obj["nodes"] == 16
    assert sorted(l for g in obj["groups"] for l in g) == [0, 1, 2, 3] and 3 in obj["groups"][0]
    t = ref_t_iter(trace, obj["groups"], LinearCost(0.001, 1e-9))
    assert obj["t_iter_s"] == pytest.approx(t)
    assert obj["t_comm_exposed_s"] == pytest.approx(t - trace.t_f - trace.t_b)
    assert obj["planning_s"] >= 0
    assert obj["limit_s"] == limits(trace, LinearCost(0.001, 1e-9), 16)["allreduce"] <= obj["t_iter_s"]
    assert obj["verdict"]["times_s"]["optimal"] == obj["t_iter_s"]  # the plan just made, not made again
    assert "FSDP2" in obj["verdict"]["not_priced"]  # --linear-cost prices no all-gather
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
        assert set(r) == {"nodes", "schedule", "t_iter_s", "speedup", "efficiency", "limit_s"}
        assert r["limit_s"] <= r["t_iter_s"]
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
        ["plan", "--nodes", "4", "--schedule", "dear:2"],
        ["plan", "--nodes", "4", "--schedule", "dear", "--memory", "1M"],
        ["simulate", "--schedules", "dear,fsdp:nope"],
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


SLOW = Network(name="100mbit", alpha=50e-6, beta=8e-8)  # s, s/byte: 100 Mbit/s


@pytest.fixture
def slow_net(tmp_path):
    """A 100 Mbit/s network file: ResNet-20's all-reduce on 4 ranks (~130 ms) outlasts its backward."""
    path = tmp_path / "100mbit.json"
    save_network(SLOW, path)
    return str(path)


def test_plan_dear_says_reduce_scatter_and_all_gather_with_limits_and_verdict(slow_net, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the rich table's title on one line
    argv = ["plan", "--trace", "resnet20-cpu-b32", "--nodes", "4", "--network", slow_net]
    assert main(argv + ["--schedule", "dear"]) == 0
    out = capsys.readouterr().out
    assert "dear plan: resnet20, N=4, 6 group(s) reduce-scattered in backward, all-gathered in the next " \
        "forward" in out  # fmt: skip
    assert "all-gather ms" in out and "scatter ms" in out and "all-reduce cost" in out
    lines = out.splitlines()
    limit = next(l for l in lines if l.startswith("limits ("))
    assert limit.index("dear max(F, AG) + max(B, RS) = ") < limit.index("all-reduce plans F + max(B, C) = ")
    assert next(l for l in lines if l.startswith("fastest in the model: dear, 0.")) == lines[-1]
    obj = _json(capsys, argv + ["--schedule", "dear", "--json"])
    trace, cost = load_trace_arg("resnet20-cpu-b32"), allreduce_cost(SLOW, 4, "ring")
    assert obj["limit_s"] == limits(trace, cost, 4)["dear"] <= obj["t_iter_s"]
    assert obj["verdict"]["fastest"] == "dear" and obj["verdict"]["text"] == lines[-1]
    assert main(argv + ["--schedule", "optimal"]) == 0  # an all-reduce plan: its own limit first
    out = capsys.readouterr().out
    assert "all-reduced" in out and "limit" in out and "plans F + max(B, C) = 50.56 + max(78.08, " in out


def test_plans_verdict_is_simulates_numbers(slow_net, capsys):
    """DDP's optimal plan, dear and FSDP2 in the verdict are ``simulate``'s optimal, dear and fsdp:optimal
    rows, with and without --fsdp (FSDP2 within 5% of its optimum: ``sim.verdict.GAP``)."""
    common = ["--trace", "resnet20-cpu-b32", "--network", slow_net, "--update-s", "0.002", "--gap", "0.05"]
    common += ["--json"]
    rows = _json(capsys, ["simulate", "--nodes", "4", "--schedules", "optimal,dear,fsdp:optimal", *common])
    want = dict(zip(["optimal", "dear", "FSDP2"], [r["t_iter_s"] for r in rows], strict=True))
    for extra in ([], ["--schedule", "mgwfbp"], ["--fsdp", "optimal"]):
        got = _json(capsys, ["plan", "--nodes", "4", *common, *extra])["verdict"]
        assert got["times_s"] == want and got["fastest"] == "dear" and got["not_priced"] == {}
    per_block = _json(capsys, ["plan", "--nodes", "4", *common, "--fsdp", "per-block"])
    assert per_block["verdict"]["times_s"]["fsdp:per-block"] == per_block["t_iter_s"]
    assert main(["plan", "--nodes", "4", *common[:-1], "--fsdp", "optimal"]) == 0
    out = capsys.readouterr().out
    assert "fastest in the model: dear, " in out and "all-reduce plans F + max(B, C) = " in out


def test_simulate_has_each_schedules_limit(slow_net, capsys):
    argv = ["simulate", "--trace", "resnet20-cpu-b32", "--nodes", "4,8", "--network", slow_net]
    rows = _json(capsys, argv + ["--schedules", "mgwfbp,dear,ps-all", "--json"])
    trace = load_trace_arg("resnet20-cpu-b32")
    for r in rows:
        if r["schedule"] == "ps-all":
            assert "limit_s" not in r  # a parameter server's plan: neither limit holds
            continue
        lim = limits(trace, allreduce_cost(SLOW, r["nodes"], "ring"), r["nodes"])
        assert r["limit_s"] == lim["dear" if r["schedule"] == "dear" else "allreduce"]
        assert r["limit_s"] <= r["t_iter_s"]
    assert main(argv + ["--schedules", "mgwfbp,dear"]) == 0
    out = capsys.readouterr().out
    lim = {n: limits(trace, allreduce_cost(SLOW, n, "ring"), n) for n in (4, 8)}
    at = [
        f"N={n} all-reduce {x['allreduce'] * 1e3:.2f} ms, dear {x['dear'] * 1e3:.2f} ms"
        for n, x in lim.items()
    ]
    assert out.splitlines()[-1] == (
        "limits, no plan of the schedule beats them (all-reduce plans F + max(B, C), dear max(F, AG) + "
        f"max(B, RS)): {'; '.join(at)}"
    )
    assert "reduce-scatter, all-gather" in " ".join(out.split())  # the caption, wrapped
