"""Bad input a tough user tries, as a table: each case is exactly one line on stderr, ``dpcomm: error: ...``,
and exit status 2, with no traceback and (where it matters) before any work starts.

Every case runs in this process through :func:`dpcomm.cli.main.main`; none starts a worker. The testbed
cases replace the ``ip``/``tc`` runner with one that fails the test, so a name check that lets something
through can never touch this machine's namespaces.
"""

from __future__ import annotations

import os

import pytest

from dpcomm.cli.main import main

_DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's recursion limit


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A working folder holding a folder, a deeply nested JSON file and a victim outside the state folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "deep.json").write_text(_DEEP)
    (tmp_path / "victim.json").write_text("{}")
    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state" / "tb"))
    return tmp_path


@pytest.fixture
def no_ip(monkeypatch):
    """``ip``/``tc`` may not run: a case that reaches them fails instead of changing the machine."""
    from dpcomm.testbed import build, shell

    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args[:1]} although the input was bad")

    for mod, name in ((shell, "run"), (build, "run"), (build, "netns_list"), (build, "batch")):
        monkeypatch.setattr(mod, name, refuse)
    monkeypatch.setattr(shell, "require", lambda: None)
    monkeypatch.setattr(build, "require", lambda: None)


_SIM = ["simulate", "--trace", "lenet5", "--nodes", "4", "--schedules", "wfbp"]
_BENCH = ["bench", "--nproc", "2", "--algos", "ring", "--ops", "allreduce", "--sizes", "4K", "--json"]
_CAL = ["calibrate", "--nproc", "2", "-o", "net.json"]

CASES = [
    # outputs: a folder, a folder-like name, a format nothing draws
    (["simulate", *_SIM[1:], "--chrome-trace", "adir"], "adir: is a folder"),
    (["simulate", *_SIM[1:], "--plot", "adir"], "adir: is a folder"),
    (["simulate", *_SIM[1:], "--timeline", "new/"], "names a folder"),
    (["simulate", *_SIM[1:], "--plot", "x.txt"], "cannot draw a '.txt' figure"),
    (["simulate", *_SIM[1:], "--chrome-trace", "victim.json/x.json"], "is not a folder"),
    (["profile", "--model", "lenet5", "--batch-size", "2", "--analytic", "k80", "-o", "adir"], "is a folder"),
    (["calibrate", "--nproc", "2", "-o", "adir"], "adir: is a folder"),
    (["netsim", "--topology", "star:4", "--plot", "adir"], "adir: is a folder"),
    ([*_BENCH, "--fit", "adir"], "adir: is a folder"),
    (["train", "--iters", "1", "--chrome-trace", "adir"], "adir: is a folder"),
    (["train", "--iters", "1", "--records-json", "adir"], "adir: is a folder"),
    # inputs
    (["simulate", "--trace", "deep.json", "--nodes", "4"], "nested too deeply"),
    # launch options, said before any worker starts
    ([*_BENCH, "--master-addr", "bad host"], "--master-addr: 'bad host' is not a host name"),
    ([*_BENCH, "--master-addr", "bad@host"], "is not a host name"),
    ([*_BENCH, "--timeout", "0"], "--timeout must be > 0"),
    ([*_BENCH[:2], "100000", *_BENCH[3:]], "DPCOMM_MAX_NPROC=100000"),
    (["train", "--nproc", "100000", "--iters", "1"], "this machine can run about"),
    (["train", "--nproc", "1", "--iters", "1", "--master-addr", "bad host"], "is not a host name"),
    # sizes: too big for the machine, or not whole elements
    ([*_BENCH[:8], "999999G", "--json"], "more than this machine's memory"),
    ([*_BENCH[:8], "4,3", "--json"], "3 B is not a whole number of float32"),
    ([*_BENCH[:8], "1", "--json"], "1 B is not a whole number"),
    ([*_BENCH[:8], "4", "--dtype", "float64", "--json"], "4 B is not a whole number of float64"),
    ([*_CAL, "--sizes", "4K", "999999G"], "more than this machine's memory"),
    ([*_CAL, "--sizes", "4K", "5"], "5 B is not a whole number"),
    (["calibrate", "--nproc", "100000", "-o", "net.json"], "this machine can run about"),
    # training options: the parameter server's and re-planning's
    (["train", "--iters", "1", "--replan-every", "-1"], "--replan-every must be >= 0"),
    (["train", "--iters", "1", "--pull", "ibatch"], "need --ps"),
    (["train", "--iters", "1", "--ps", "--pull", "greedy"], "unknown pull method 'greedy'"),
    (["train", "--iters", "1", "--ps", "--ps-servers", "0"], "--ps-servers must be >= 1"),
    (["train", "--iters", "1", "--ps", "--sparsify", "topk:2"], "ratio must be in (0, 1]"),
    (["train", "--iters", "1", "--ps", "--sparsify", "random:0.1"], "--sparsify must be topk:RATIO"),
    (["train", "--iters", "1", "--ps", "--schedule", "wfbp"], "give --pull, not --schedule"),
    (["train", "--iters", "1", "--ps", "--pull-mode", "poll"], "unknown pull mode 'poll'"),
    (["train", "--iters", "1", "--pull-mode", "request"], "need --ps"),
    (["profile", "--model", "lenet5", "--from-torch-profiler", "missing.json"], "missing.json: no such file"),
    (["testbed", "rate", "--name", "tb", "--rate", "fast"], "bad rate 'fast'"),
    # testbed names: one full-match check for every action
    (["testbed", "status", "--name", "../.."], "bad testbed name '../..'"),
    (["testbed", "down", "--name", ""], "bad testbed name ''"),
    (["testbed", "down", "--name", "../../victim"], "bad testbed name"),
    (["testbed", "down", "--name", "tb\n"], "bad testbed name 'tb\\n'"),
    (["testbed", "exec", "--name", "../tb", "h0", "--", "true"], "bad testbed name"),
    (["testbed", "launch", "--name", "Tb", "--", "true"], "bad testbed name"),
    (["testbed", "up", "--topology", "star:2", "--name", "ab\n"], "bad testbed name"),
    (["testbed", "up", "--topology", "star:2", "--cc", "reno\n"], "bad congestion control"),
    (["testbed", "up", "--topology", "star:2", "--cpus", "nan"], "--cpus nan must be at least 0.1"),
    (["testbed", "up", "--topology", "star:2", "--cpus", "-1"], "--cpus -1 must be at least 0.1"),
    (["testbed", "up", "--topology", "star:2", "--cpus", "inf"], "more than this machine's"),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_bad_input_is_one_line_and_exit_2(files, no_ip, capsys, argv, words):
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("dpcomm: error: "), err
    assert words in err, err
    assert (files / "victim.json").exists()


def test_an_output_folder_is_refused_before_any_work(files, monkeypatch, capsys):
    """The check runs before the simulation: nothing is computed for an output that cannot be written."""
    import dpcomm.sim

    def no_work(*args, **kwargs):
        raise AssertionError("simulated although the output path was a folder")

    monkeypatch.setattr(dpcomm.sim, "sweep", no_work)
    assert main([*_SIM, "--chrome-trace", "adir"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_the_testbed_state_folder_is_never_left(files, no_ip):
    """``down --name ../../victim`` once deleted ``victim.json`` two folders above the state folder."""
    from dpcomm.errors import UserError
    from dpcomm.testbed import build, state

    for bad in ("../../victim", "", "a/b", "tb\n", "x" * 9):
        with pytest.raises(UserError):
            state.state_path(bad)
        with pytest.raises(UserError):
            build.down(bad)
    assert (files / "victim.json").exists()
    assert state.state_path("h6ok") == files / "state" / "tb" / "h6ok.json"
    os.makedirs(files / "state" / "tb")
    (files / "state" / "tb" / "..json").write_text("{}")  # a stray file is not a testbed name
    assert state.saved_names() == []
