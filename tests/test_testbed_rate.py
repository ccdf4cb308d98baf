"""``dpcomm testbed rate``: a running testbed's links change rate on both ends, one server or all, and the
state follows; bad input is one line. Marked ``testbed`` (root and namespaces; skips with the reason)."""

from __future__ import annotations

import os

import pytest

from dpcomm.cli.main import main
from dpcomm.testbed import build
from dpcomm.testbed.counters import link_counters
from dpcomm.testbed.state import load_state
from tests.test_testbed import _SKIP, _run_cli


@pytest.fixture
def tb(tmp_path, monkeypatch):
    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    name = f"h7b{os.getpid() % 10000}"
    build.down(name)
    yield name
    build.down(name)
    assert not build.leftovers(name)


def test_rate_of_a_testbed_that_is_not_up_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path))
    rc, _, err = _run_cli(capsys, "testbed", "rate", "--name", "h7bnone", "--rate", "10mbit")
    assert rc == 2 and err.startswith("dpcomm: error: no testbed named 'h7bnone'") and err.count("\n") == 1


@pytest.mark.testbed
@pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")
def test_rate_changes_both_ends_of_the_chosen_links(capsys, tb):
    assert main(["testbed", "up", "--topology", "star:3", "--rate", "100mbit", "--name", tb]) == 0
    capsys.readouterr()
    rates = {k: (c["rate_bps"], c["rx_rate_bps"]) for k, c in link_counters(load_state(tb)).items()}
    assert set(rates.values()) == {(100_000_000, 100_000_000)}

    rc, out, _ = _run_cli(capsys, "testbed", "rate", "--name", tb, "--rate", "20mbit", "--server", "1")
    assert rc == 0 and "server 1" in out
    got = {k: (c["rate_bps"], c["rx_rate_bps"]) for k, c in link_counters(load_state(tb)).items()}
    assert got == {k: ((20_000_000,) * 2 if k[0] == 1 else v) for k, v in rates.items()}
    assert load_state(tb)["servers"][1]["rate_bps"] == 20_000_000

    rc, out, _ = _run_cli(capsys, "testbed", "rate", "--name", tb, "--rate", "1gbit")
    assert rc == 0
    state = load_state(tb)
    got = {k: (c["rate_bps"], c["rx_rate_bps"]) for k, c in link_counters(state).items()}
    assert set(got.values()) == {(1_000_000_000, 1_000_000_000)}
    # the default bucket follows the rate: 1 ms of 1 Gbit/s is 125 kB
    assert state["rate_bps"] == 1_000_000_000 and state["burst_bytes"] == 125_000
    assert all("rate_bps" not in s for s in state["servers"])

    for argv, needle in [(["--rate", "fast"], "bad rate 'fast'"), (["--rate", "10mbit", "--server", "3"],
                         "has servers 0..2, not --server 3")]:  # fmt: skip
        rc, _, err = _run_cli(capsys, "testbed", "rate", "--name", tb, *argv)
        assert rc == 2 and needle in err and err.count("\n") == 1
