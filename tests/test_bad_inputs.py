"""Bad input a tough user tries, as a table: each case is exactly one line on stderr, ``dpcomm: error: ...``,
and exit status 2, with no traceback and (where it matters) before any work starts.

Every case runs in this process through :func:`dpcomm.cli.main.main`; none starts a worker (the launcher is
replaced by one that fails the test, so a check that only the workers make shows). The testbed cases
replace the ``ip``/``tc`` runner with one that fails the test, so a name check that lets something through
can never touch this machine's namespaces.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time

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
    layer = {"name": "fc", "params": 10**30, "forward_s": 0.001, "backward_s": 0.002}
    top = {"format": "dpcomm-trace/1", "model": "m", "batch_size": 1, "device": "cpu", "dtype_bytes": 4}
    (tmp_path / "huge_layer.json").write_text(json.dumps({**top, "layers": [layer]}))
    small = {"name": "fc", "params": 10, "forward_s": 0.001, "backward_s": 0.002}
    v2 = {**top, "format": "dpcomm-trace/2"}
    for name, obj in (
        ("dup_names.json", {**top, "layers": [small, small]}),
        ("v2_no_names.json", {**v2, "layers": [{**small, "param_names": ["fc.w"]}, {**small, "name": "b"}]}),
        ("v2_empty_names.json", {**v2, "layers": [{**small, "name": "a", "param_names": []}]}),
        ("neg_backward.json", {**top, "iteration_backward_s": -1.0, "layers": [small]}),
        ("neg_batch.json", {**top, "batch_size": -4, "layers": [small]}),
    ):
        (tmp_path / name).write_text(json.dumps(obj))
    for name, size in (("big_trace.json", 65 << 20), ("big_profile.json", 257 << 20)):
        with open(tmp_path / name, "wb") as fh:  # sparse: no disk is written, the size is what counts
            fh.truncate(size)
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


@pytest.fixture
def no_launch(monkeypatch):
    """No worker may start: a case that reaches the launcher fails instead."""
    import dpcomm.launch

    def refuse(*args, **kwargs):
        raise AssertionError("started workers although the input was bad")

    monkeypatch.setattr(dpcomm.launch, "launch", refuse)


_SIM = ["simulate", "--trace", "lenet5", "--nodes", "4", "--schedules", "wfbp"]
_BENCH = ["bench", "--nproc", "2", "--algos", "ring", "--ops", "allreduce", "--sizes", "4K", "--json"]
_CAL = ["calibrate", "--nproc", "2", "-o", "net.json"]
_NET = ["netsim", "--topology", "star:4"]
_FSDP = ["train", "--nproc", "2", "--model", "lenet5", "--iters", "2", "--schedule"]

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
    # sizes: beyond int64 or a stated maximum, negative, unreadable (issue 28)
    ([*_NET, "--sizes", "40000000000G", "--alpha-us", "0"], "is more than 1,125,899,906,842,624 bytes"),
    ([*_NET, "--sizes", "9999999999999999999999"], "is more than 1,125,899,906,842,624 bytes"),
    ([*_NET, "--sizes", "2000000G"], "is more than 1,125,899,906,842,624 bytes"),  # netsim's 1 PiB
    ([*_NET, "--sizes", "9" * 5000], "cannot read '99999"),
    ([*_NET, "--sizes=-1M"], "cannot read '-1M'"),
    ([*_NET, "--sizes", "-1M"], "expected one argument, or a value that starts with '-'"),
    ([*_NET, "--block-bytes", "9" * 5000], "--block-bytes: cannot read"),
    ([*_NET, "--alpha-us", "9" * 400], "--alpha-us must be a number from 0 to"),
    ([*_NET, "--mtu", "99999999"], "--mtu must be a number from 0 to 65535"),
    ([*_BENCH[:8], "9999999999999999999999", "--json"], "is more than 9,223,372,036,854,775,807"),
    # topologies: a server limit checked from the spec's numbers, and bounded work
    (["netsim", "--topology", "fattree:1000"], "has 250,000,000 servers, more than the 16,384"),
    (["netsim", "--topology", "fattree:48"], "has 27,648 servers, more than the 16,384"),
    (["netsim", "--topology", "bcube:1000,3"], "more than the 16,384"),
    (["netsim", "--topology", "bcube:2,999999999"], "has more servers, more than the 16,384"),
    (["netsim", "--topology", "star:100000000"], "more than the 16,384"),
    (["netsim", "--topology", "leafspine:1000,1000"], "more than the 16,384"),
    (["netsim", "--topology", "star:" + "9" * 5000], "more than 9 digits"),
    ([*_SIM, "--topology", "fattree:48"], "more than the 16,384"),
    (["netsim", "--topology", "star:16384", "--algorithms", "ring"], "flows over all its steps, more than"),
    (["netsim", "--topology", "fattree:32", "--algorithms", "ps"], "flows in one step, more than"),
    (["netsim", "--topology", "star:4", "--algorithms", "auto"], "'auto' has no flow schedule"),
    # servers of several GPUs (docs/netsim.md "Servers with several accelerators")
    (["netsim", "--topology", "gpus:2,8,nics=3"], "nics=3 must divide the 8 GPUs"),
    (["netsim", "--topology", "gpus:2,8,nvlink=fast"], "nvlink=fast is not a rate"),
    (["netsim", "--topology", "gpus:2,8,intra_eff=2"], "intra_eff=2 must be in (0, 1]"),
    (["netsim", "--topology", "dgx-h100:2,nic_eff=1/0"], "nic_eff=1/0 is not a fraction"),
    (["netsim", "--topology", "dgx-h100:4096"], "has 32,768 servers, more than the 16,384"),
    (["netsim", "--topology", "star:4", "--algorithms", "nccl-tree"], "runs on servers of several GPUs"),
    ([*_SIM, "--algo", "nccl-ring"], "give --topology"),
    # rates
    (["testbed", "up", "--topology", "star:2", "--rate=-1gbit"], "bad rate '-1gbit'"),
    (["testbed", "up", "--topology", "star:2", "--rate", "-1gbit"], "argument --rate: expected one argument"),
    (["testbed", "rate", "--rate", "9" * 400 + "gbit"], "bad rate"),
    (["testbed", "rate", "--rate", "20tbit"], "too high"),
    ([*_NET, "--rate=-1gbit"], "bad rate '-1gbit'"),
    # traces and input files: bounded before they are read
    (["simulate", "--trace", "huge_layer.json", "--nodes", "4"], "more than 10,000,000,000,000 parameters"),
    (["simulate", "--trace", "huge_layer.json", "--nodes", "4", "--topology", "star:4"], "parameters"),
    (["simulate", "--trace", "big_trace.json", "--nodes", "4"], "more than the 67,108,864 bytes"),
    (
        ["profile", "--model", "lenet5", "--from-torch-profiler", "big_profile.json"],
        "more than the 268,435,456",
    ),
    # argparse's own errors: one line with a pointer to the help, not the usage block
    (["netsim", "--topology", "star:4", "--ps-servers", "x"], "unrecognized arguments: --ps-servers x"),
    (["train", "--replan-every", "x"], "invalid int value: 'x' (see dpcomm train --help)"),
    (["train", "--ps-servers", "x"], "(see dpcomm train --help)"),
    (["bench", "--frob"], "(see dpcomm bench --help)"),
    (["frob"], "invalid choice: 'frob'"),
    ([], "the following arguments are required: COMMAND"),
    (["testbed"], "(see dpcomm testbed --help)"),
    (["simulate", *_SIM[1:], "--algo", "nope"], "unknown algorithm 'nope'"),
    # output folders that do not exist are an error, not created
    ([*_SIM, "--plot", "nodir/x.png"], "no folder"),
    ([*_SIM, "--timeline", "nodir/x.png"], "no folder"),
    ([*_SIM, "--chrome-trace", "nodir/x.json"], "no folder"),
    ([*_NET, "--plot", "nodir/deeper/x.png"], "no folder"),
    ([*_BENCH, "--fit", "nodir/net.json"], "no folder"),
    (["calibrate", "--nproc", "2", "-o", "nodir/net.json"], "no folder"),
    (
        ["profile", "--model", "lenet5", "--batch-size", "2", "--analytic", "k80", "-o", "nodir/t.json"],
        "no folder",
    ),
    # issue 41: an FSDP budget no plan meets (below the largest parameter), known before any worker starts
    (
        [*_FSDP[:5], "--data", "digits", *_FSDP[5:], "fsdp:per-block", "--memory", "1KB"],
        "no plan fits a budget of 1,024 bytes; lenet5's largest parameter, fc1.weight, alone holds",
    ),
    ([*_FSDP, "fsdp:per-block", "--memory", "0"], "no plan fits a budget of 0 bytes"),
    ([*_FSDP, "fsdp:optimal,memory=0"], "fc1.weight, alone holds 12,845,056 bytes"),
    ([*_FSDP, "fsdp:per-layer", "--memory", "6MB", "--dtype", "bf16"], "alone holds 6,422,528 bytes"),
    ([*_FSDP, "fsdp:whole", "--memory", "12MB"], "whole (one unit) holds all 13,098,536 bytes"),
    ([*_FSDP, "fsdp:per-block", "--memory", "1.5"], "--memory: '1.5' is not a whole number of bytes"),
    ([*_FSDP, "fsdp:whole,memory=2.5"], "memory: '2.5' is not a whole number of bytes"),
    # issue 37: --compile runs the ddp and fsdp: kinds only, with a backend name, without re-planning
    ([*_FSDP, "mgwfbp", "--compile"], "--compile runs PyTorch's DDP or FSDP2 compiled: use ddp[:PLANNER]"),
    ([*_FSDP, "ddp:mgwfbp", "--compile", "Bad-Name!"], "--compile takes a torch.compile backend name"),
    ([*_FSDP, "ddp:mgwfbp", "--compile", "--replan-every", "2"], "--compile with --replan-every"),
    # --compiled-autograd: ddp kinds, --compile inductor (only it fuses the all-reduces), native, one plan
    ([*_FSDP, "ddp:wfbp", "--compiled-autograd"], "--compiled-autograd needs --compile inductor: only"),
    ([*_FSDP, "ddp", "--compile", "aot_eager", "--compiled-autograd"], "got --compile aot_eager"),
    ([*_FSDP, "fsdp:per-block", "--compile", "--compiled-autograd"], "use ddp or ddp:PLANNER, not fsdp:"),
    ([*_FSDP, "mgwfbp", "--compile", "--compiled-autograd"], "--compile runs PyTorch's DDP or FSDP2"),
    ([*_FSDP, "ddp", "--probe-overlap"], "--probe-overlap measures for ddp:PLANNER's prediction; no ddp:"),
    ([*_FSDP, "ddp:wfbp", "--compile", "--compiled-autograd", "--replan-every", "2"], "the backward"),
    ([*_FSDP, "ddp:wfbp", "--compile", "--compiled-autograd", "--collective", "ring"], "ring cannot run"),
    ([*_FSDP, "ddp", "--compile", "--compiled-autograd", "--collective", "ring"], "needs a dpcomm schedule"),
    # issue 41: the figure's format, node counts, size lists and trace files
    (["validate", "--no-run", "--out", "adir", "--plot", "x.nosuchsuffix"], "cannot draw a '.nosuchsuffix'"),
    (["plan", "--trace", "lenet5", "--nodes", "99999999999999999999"], "more than the 16,384 nodes"),
    (["plan", "--trace", "lenet5", "--nodes", "9" * 5000], "more than the 16,384 nodes"),
    ([*_SIM[:4], "4,16385", *_SIM[5:]], "--nodes: 16385 is more than the 16,384 nodes"),
    ([*_SIM[:4], "99999999999999999999"], "more than the 16,384 nodes"),
    ([*_NET, "--sizes", "1M,,"], "--sizes: '1M,,' has an empty size"),
    ([*_CAL, "--sizes", "4K,", "1M"], "has an empty size"),
    (["simulate", "--trace", "dup_names.json", "--nodes", "4"], "repeats the name 'fc' of layers[0]"),
    (["simulate", "--trace", "v2_no_names.json", "--nodes", "4"], "'layers[1].param_names' is missing or"),
    (["simulate", "--trace", "v2_empty_names.json", "--nodes", "4"], "'layers[0].param_names' is missing"),
    (["simulate", "--trace", "neg_backward.json", "--nodes", "4"], "'iteration_backward_s' must be a finite"),
    (["simulate", "--trace", "neg_batch.json", "--nodes", "4"], "'batch_size' must be from 1 to 2,147,"),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_bad_input_is_one_line_and_exit_2(files, no_ip, no_launch, capsys, argv, words):
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("dpcomm: error: "), err
    assert words in err, err
    assert (files / "victim.json").exists()
    assert not (files / "nodir").exists()  # an output's missing folder is never created


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


def stop_one(timeout_s: float) -> int:
    """Worker: rank 1 stops itself (SIGSTOP); rank 0's all-reduce times out and fails the run."""
    import signal

    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker

    rank, _ = init_worker(timeout_s=timeout_s)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.zeros(4))
    return rank


@pytest.mark.slow
def test_a_stopped_rank_ends_the_run_near_its_timeout_and_leaves_no_error_files():
    """A stopped rank held a failed run for --timeout + 30 s (torch's fixed grace before SIGKILL), and each
    failed run left a ``pytorch-errorfile-*`` in the temporary directory."""
    from dpcomm.launch import WorkerFailure, launch

    pattern = os.path.join(tempfile.gettempdir(), "pytorch-errorfile-*")
    before = set(glob.glob(pattern))
    timeout_s = 3.0
    t0 = time.monotonic()
    with pytest.raises(WorkerFailure, match="rank 0"):
        launch(stop_one, 2, timeout_s)
    # start-up (two workers importing torch on a loaded 2-core VM) + timeout + ~2 s of SIGTERM, SIGKILL
    assert time.monotonic() - t0 < 25 + timeout_s
    assert set(glob.glob(pattern)) <= before
