"""``dpcomm validate`` (:mod:`dpcomm.validate`): the cases, the error maths and the report from a fixture
(fast tier), the CLI's one-line refusals, and one tiny case end to end on the emulated cluster (``testbed``:
root and network namespaces; ~25 s on the 2-core VM), whose testbed must be gone afterwards."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dpcomm.cli.main import main as cli
from dpcomm.errors import UserError
from dpcomm.validate import run as vrun
from dpcomm.validate.cases import CASES, Case, select
from dpcomm.validate.predict import error
from dpcomm.validate.report import build_report, geomean_abs, summarize
from dpcomm.validate.run import launches

FIXTURE = Path(__file__).parent / "data" / "validate_r20s4.json"
"""A trimmed record of case r20-s4 (one schedule of each kind), as :func:`dpcomm.validate.run_case` writes."""


def test_the_default_list_covers_every_schedule_kind():
    cases = select()
    assert len(cases) >= 12 and not {"tiny", "r20-s4-1g"} & {c.name for c in cases}
    assert len({c.name for c in CASES}) == len(CASES)
    scheds = {s for c in cases for s in c.schedules}
    for s in ("wfbp", "single", "bucket:256KB", "mgwfbp", "optimal", "ddp", "ddp:optimal", "ps:all",
              "ps:layer", "ps:ibatch", "fsdp:per-block", "fsdp:optimal"):  # fmt: skip
        assert s in scheds, s
    assert {c.mode for c in cases} >= {"overlap", "lp-alg3"}
    assert {c.collective for c in cases} >= {"native", "lp", "bcube"}
    assert all(c.rate == "100mbit" or c.rate == "200mbit" for c in cases)  # network-bound
    assert [c.name for c in select(quick=True)] and all(c.quick for c in select(quick=True))
    assert [c.name for c in select("tiny, r20-s4,tiny")] == ["tiny", "r20-s4"]


@pytest.mark.parametrize("bad", ["nope", "r20-s4,nope", " , "])
def test_an_unknown_case_is_one_line(bad):
    with pytest.raises(UserError) as exc:
        select(bad)
    assert "\n" not in str(exc.value) and "choose from" in str(exc.value)


def test_cases_check_themselves_and_round_trip():
    with pytest.raises(UserError):
        Case(name="a b", schedules=("single",))
    with pytest.raises(UserError):
        Case(name="x", schedules=("single",), iters=8)
    c = select("r20-s4")[0]
    assert Case.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_a_compiled_case_runs_each_plan_in_a_launch_of_its_own():
    from dpcomm.validate.run import node_args

    c = select("gpt2c-s2")[0]
    assert c.compile == "aot_eager" and c.model == "gpt2-tiny" and c in select()
    assert launches(c) == [("ddp:mgwfbp",), ("ddp:optimal",)]
    args = node_args(c, launches(c)[0])
    assert args[args.index("--model") + 1] == "gpt2-tiny" and args[args.index("--compile") + 1] == "aot_eager"
    assert Case.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert "compile" not in select("r20-s4")[0].to_dict()  # other cases' records read as before
    with pytest.raises(UserError):
        Case(name="x", schedules=("ddp",), model="gpt2-tiny", compile="aot_eager")  # no plan to check
    with pytest.raises(UserError):
        Case(name="x", schedules=("ddp:optimal",), compile="aot_eager")  # nothing real to compile


def test_the_parameter_server_runs_alone_each_in_its_own_launch():
    c = Case(name="x", schedules=("wfbp", "ps:all", "ddp", "ps:ibatch"))
    assert launches(c) == [("wfbp", "ddp"), ("ps:all",), ("ps:ibatch",)]
    assert launches(Case(name="y", schedules=("ps:all",))) == [("ps:all",)]


def test_error_and_geomean_maths():
    assert error(110.0, 100.0) == pytest.approx(0.10)
    assert error(None, 1.0) is None and error(1.0, 0.0) is None
    assert geomean_abs([0.02, -0.08]) == pytest.approx(0.04)
    assert geomean_abs([0.0, 0.01]) == pytest.approx(math.sqrt(1e-4 * 0.01))  # |e| floored at 0.01%
    assert geomean_abs([]) is None
    rows = [{"case": "a", "schedule": "s", "err_closed": 0.02, "err_flow": None},
            {"case": "a", "schedule": "t", "err_closed": -0.2, "err_flow": 0.01}]  # fmt: skip
    s = summarize(rows)
    assert s["closed"]["rows"] == 2 and s["closed"]["over_10pct"] == 1
    assert s["closed"]["worst"] == {"case": "a", "schedule": "t", "error": -0.2}
    assert s["flow"]["rows"] == 1 and s["flow"]["geomean_abs_error"] == pytest.approx(0.01)


def test_report_from_a_fixture_record():
    rec = json.loads(FIXTURE.read_text())
    rep = build_report([rec], "dpcomm validate --cases r20-s4")
    by = {r["schedule"]: r for r in rep["rows"]}
    assert set(by) == {r["schedule"] for r in rec["results"]}
    for r in rep["rows"]:  # every kind is priced both ways; all but the PS (docs/validate.md) within 15%
        assert r["closed_s"] and r["flow_s"], r
        if not r["schedule"].startswith("ps:"):
            assert abs(r["err_closed"]) < 0.15 and abs(r["err_flow"]) < 0.15, r
    assert rep["summary"]["closed"]["rows"] == len(rec["results"])
    assert rep["cases"][0]["loadavg_before"] == rec["machine"]["loadavg_before"]
    json.dumps(rep)  # plain data


def test_cli_reports_saved_cases_and_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    rec = json.loads(FIXTURE.read_text())
    (tmp_path / "r20-s4.json").write_text(json.dumps({**rec, "case": select("r20-s4")[0].to_dict()}))
    out = tmp_path / "rep.json"
    assert cli(["validate", "--cases", "r20-s4", "--out", str(tmp_path), "--no-run", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "geomean |error|" in text and "ps:ibatch" in text
    assert json.loads(out.read_text())["rows"]
    assert cli(["validate", "--cases", "nope"]) == 2
    assert cli(["validate", "--cases", "tiny", "--out", str(tmp_path), "--no-run"]) == 2
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli(["validate", "--cases", "tiny", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "root" in err[-1] and "not available" in err[-1]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"dpc-vprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.mark.slow
@pytest.mark.testbed
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_a_tiny_case_end_to_end(tmp_path, monkeypatch, capsys):
    from dpcomm.testbed import leftovers

    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    args = ["validate", "--cases", "tiny", "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"),
            "--plot", str(tmp_path / "r.png")]  # fmt: skip
    assert cli(args) == 0
    assert not leftovers(vrun.testbed_name()), "the case's testbed is still up"
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [r["schedule"] for r in rep["rows"]] == ["single", "optimal"]
    assert all(r["closed_s"] and r["flow_s"] for r in rep["rows"])
    assert (tmp_path / "r.png").stat().st_size > 0 and (tmp_path / "out" / "tiny.json").exists()
    assert "removed" in capsys.readouterr().out
    assert cli(args) == 0  # resumed from out/tiny.json: nothing measured again
    assert "testbed '" not in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.testbed
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_a_compiled_case_end_to_end(tmp_path, monkeypatch):
    """``tinyc``: compiled DDP (aot_eager) with dpcomm's plan on the testbed, planned on the compiled
    model's times, and both predictions of it."""
    from dpcomm.testbed import leftovers
    from dpcomm.validate.predict import predict_case

    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    rec = vrun.run_case(select("tinyc")[0], tmp_path / "out")
    assert not leftovers(vrun.testbed_name()), "the case's testbed is still up"
    (r,) = rec["results"]
    assert r["schedule"] == "ddp:optimal" and len(set(r["params_sha256"])) == 1
    assert r["trace"]["measured_by"] == "dpcomm.ddp.compiled"  # planned on the compiled times
    assert r["trace"]["backend"] == "aot_eager"
    (p,) = predict_case(rec)
    assert p.closed_s and p.flow_s and p.measured_s > 0
