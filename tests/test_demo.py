"""``make demo`` (:mod:`dpcomm.demo`): the simulator fallback (fast tier), and the measured run on the
emulated cluster (``testbed``: root and network namespaces; ~50 s on the 2-core VM), whose testbed must be
gone afterwards, also when the run is interrupted."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dpcomm import demo
from dpcomm.demo_sim import FALLBACK_NODES, SCHEDULES, simulate_cluster
from dpcomm.testbed import names


def test_fallback_simulator_shows_a_plan_beating_ddp():
    """The fallback's numbers: on every cluster size dpcomm's best plan is faster than DDP's buckets, and
    WFBP's per-layer start-ups make it the slowest at 64 nodes."""
    rows = simulate_cluster()
    assert [(r["nodes"], r["schedule"]) for r in rows] == [(n, s) for n in FALLBACK_NODES for s in SCHEDULES]
    for n in FALLBACK_NODES:
        by = {r["schedule"]: r for r in rows if r["nodes"] == n}
        assert by["ddp"]["vs_ddp"] == 1.0
        allreduce = [r["t_iter_s"] for s, r in by.items() if s != "dear"]
        assert by["optimal"]["t_iter_s"] <= min(allreduce) + 1e-12
        assert by["optimal"]["vs_ddp"] < 0.97
        assert by["dear"]["t_iter_s"] <= by["optimal"]["t_iter_s"] * (
            1 + 1e-12
        )  # dear's plans include optimal's
    at64 = {r["schedule"]: r["t_iter_s"] for r in rows if r["nodes"] == 64}
    assert at64["wfbp"] == max(at64.values())


def test_without_root_one_line_says_why_then_the_simulator(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    why = demo.cluster_unavailable()
    assert why is not None and "root" in why and "\n" not in why
    assert demo.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("No emulated cluster here:") for line in out.splitlines()) == 1
    assert "root" in out.split("No emulated cluster here:")[1].splitlines()[0]
    assert "optimal" in out and "t_iter per node count" in out
    assert (tmp_path / "simulated.png").stat().st_size > 0
    assert (tmp_path / "simulated.json").stat().st_size > 0


def test_testbed_names_fit_and_are_this_process():
    assert demo.testbed_name() == f"dm{os.getpid():x}"
    names.check_name(demo.testbed_name(2**22))  # the largest pid Linux gives still fits 8 characters


def test_pooled_cost_fits_the_median_of_every_schedules_points():
    """Four schedules' profiled all-reduces, one of them noisy: the fit goes through the medians."""
    from types import SimpleNamespace

    a, b = 3e-3, 125e-9
    sizes = [4_212, 16_856, 67_428, 269_720, 1_078_888]
    clean = [[m, a + b * m] for m in sizes]
    noisy = [[m, 3 * (a + b * m)] for m in sizes]
    results = [SimpleNamespace(cost={"points": pts}) for pts in (clean, clean, clean, noisy)]
    results.append(SimpleNamespace(cost=None))  # DDP profiles nothing
    cost = demo.pooled_cost(results)
    assert cost.a == pytest.approx(a, rel=1e-6) and cost.b == pytest.approx(b, rel=1e-6)
    assert demo.pooled_cost([SimpleNamespace(cost=None)]) is None


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"dpc-dprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ours() -> list[str]:
    """This process's demo namespaces."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [ns for ns in listed if ns.startswith(names.prefix(demo.testbed_name()))]


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    yield tmp_path
    from dpcomm.testbed import down

    down(demo.testbed_name())


@pytest.mark.testbed
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_measured_run_on_the_emulated_cluster(state_dir, capsys):
    out_dir = state_dir / "out"
    # 1 Gbit/s links: the whole measured path in less time (make demo itself runs 100 Mbit/s)
    assert demo.main(["--iters", "16", "--rate", "1gbit", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert not _ours(), "the demo's testbed is still up"
    assert f"Testbed '{demo.testbed_name()}' removed" in out
    for s in SCHEDULES:
        assert any(line.startswith(f"│ {s} ") for line in out.splitlines()), s
    assert "bitwise identical" in out and "geomean |error|" in out
    assert "with backward slowed by communication" in out and "slowed ms" in out  # issue 31: both errors
    assert (out_dir / "timeline.png").stat().st_size > 0
    assert (out_dir / "simulated.png").stat().st_size > 0
    assert {p.name for p in out_dir.glob("trace.*.json")} == {f"trace.{s}.json" for s in SCHEDULES}


@pytest.mark.testbed
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_interrupted_run_takes_its_testbed_down(state_dir, monkeypatch, capsys):
    import dpcomm.testbed as testbed

    seen = []

    def interrupted(state, *args, **kwargs):
        seen.append(list(_ours()))
        raise KeyboardInterrupt

    monkeypatch.setattr(testbed, "launch_workers", interrupted)
    assert demo.main(["--out", str(state_dir / "out")]) == 130
    assert seen and len(seen[0]) == 5  # it was up: 4 servers and the switch
    assert not _ours()
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.testbed
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_a_killed_demos_testbed_is_removed_by_the_next(state_dir):
    """A demo killed with SIGKILL leaves its testbed (its workers die with it); the next demo removes it,
    and leaves alone the testbed of a demo that still runs (here: this process's)."""
    from dpcomm.testbed import TestbedConfig, down, leftovers, up

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, alive = demo.testbed_name(gone.pid), demo.testbed_name()
    try:
        for name in (dead, alive):
            up(TestbedConfig(name=name, topology="star:2", rate_bps=100_000_000))
        demo._remove_stale()
        assert not leftovers(dead)
        assert len(leftovers(alive)) == 3
    finally:
        down(dead)
        down(alive)
