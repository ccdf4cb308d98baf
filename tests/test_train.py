"""``dpcomm train`` end to end: JSON schema, replicas agree, resume equals uninterrupted, digits accuracy,
bad flags, corrupt checkpoints, and a killed worker that makes the others fail fast instead of hanging.

Four worker launches, three of 2 workers (the digits run; a killed run, then one launch for the
uninterrupted run, the one resumed from the killed run's checkpoint, LeNet-5 on tiny synthetic batches, and
the bf16 comparison on digits) and one two-"node" run on loopback, plus process-free checks of flags,
checkpoints and data order.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import dpcomm.launch
from dpcomm.cli.main import main
from dpcomm.errors import UserError
from dpcomm.models import get_model
from dpcomm.runtime.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from dpcomm.runtime.data import TrainData

JSON_KEYS = {"nproc", "schedule", "collective", "t_iter_s", "throughput_samples_s", "exposed_comm_s",
             "loss_final", "params_sha256"}  # fmt: skip
TINY = ["train", "--model", "lenet5", "--batch-size", "4", "--schedule", "wfbp", "--profile-iters", "2"]


def _run_json(capsys, argv: list[str]) -> dict:
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out.strip()
    return json.loads(out)  # stdout is exactly one JSON object


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("dpcomm: error: ")
    return err


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if anything tries to start workers (bad flags must be caught before)."""

    def refuse(*_a, **_k):
        raise AssertionError("workers were launched for a bad flag")

    monkeypatch.setattr(dpcomm.launch, "launch", refuse)


# ----------------------------------------------------------------------------- no processes


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--model", "nosuchnet"], "unknown model"),
        (["--schedule", "fastest"], "unknown schedule"),
        (["--nproc", "0"], "--nproc must be an integer >= 1"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--batch-size", "-5"], "--batch-size must be positive"),
        (["--collective", "carrier-pigeon"], "unknown algorithm"),
        (["--nproc", "3", "--collective", "bml"], "bcube needs a world size of n^k"),
        (["--chrome-trace", "/no/such/dir/t.json"], "no folder"),
        (["--mode", "lp-alg9"], "unknown mode"),
        (["--data", "mnist"], "unknown data"),
        (["--data", "digits", "--batch-size", "4096", "--nproc", "2"], "exceeds"),
        (["--epochs", "2"], "synthetic data has no epochs"),
        (["--resume"], "--resume needs --checkpoint"),
        (["--schedule", "ddp", "--mode", "lp-alg2"], "needs a dpcomm schedule"),
        (["--schedule", "ddp", "--collective", "ring"], "needs a dpcomm schedule"),
        (["--verify-iters", "-1"], "--verify-iters must be >= 0"),
        (["--threads", "0"], "threads must be >= 1"),
        (["--dtype", "float16"], "--dtype must be one of"),
        (["--schedule", "fsdp:optimal", "--memory", "abc"], "cannot read 'abc' as a size"),
        (["--schedule", "mgwfbp", "--memory", "1MB"], "--memory is the budget of fsdp:PLANNER"),
        (["--ps", "--dtype", "bf16"], "moves float32 parameters"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_any_worker(capsys, no_launch, flags, needle):
    assert main(["train", *flags]) == 2
    assert needle in _error_line(capsys)


def test_checkpoint_dir_not_writable_is_exit_2(capsys, no_launch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["train", "--checkpoint", str(blocker / "ckpt")]) == 2  # parent is a regular file
    assert "not writable" in _error_line(capsys)
    assert main(["train", "--checkpoint", str(blocker)]) == 2
    assert "not a directory" in _error_line(capsys)


def test_resume_without_a_checkpoint_is_exit_2(capsys, no_launch, tmp_path):
    assert main(["train", "--checkpoint", str(tmp_path), "--resume"]) == 2
    assert "no checkpoint" in _error_line(capsys)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_checkpoint_is_rejected_and_left_alone(capsys, no_launch, tmp_path, damage):
    save_checkpoint(tmp_path, {"iteration": 2, "config": {}, "model": {"w": torch.arange(1000.0)}})
    path = checkpoint_path(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"hello, not a checkpoint")
    path.write_bytes(bytes(data))
    assert main(["train", "--checkpoint", str(tmp_path), "--resume", "--iters", "5"]) == 2
    assert "corrupt checkpoint" in _error_line(capsys)
    assert path.read_bytes() == bytes(data)  # not rewritten, not removed
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no stray temporary files


def test_a_state_that_does_not_read_back_never_replaces_a_good_checkpoint(tmp_path):
    save_checkpoint(tmp_path, {"iteration": 7, "model": {"w": torch.ones(3)}})
    good = checkpoint_path(tmp_path).read_bytes()
    with pytest.raises(UserError, match="not a training state"):
        save_checkpoint(tmp_path, {"model": {"w": torch.zeros(3)}})  # no iteration: would not resume
    assert checkpoint_path(tmp_path).read_bytes() == good
    assert load_checkpoint(tmp_path)["iteration"] == 7


def test_resume_with_a_different_model_is_exit_2(capsys, no_launch, tmp_path):
    cfg = {"model": "resnet20", "data": "synthetic", "seed": 0, "batch_size": 32, "world_size": 1}
    save_checkpoint(tmp_path, {"iteration": 1, "config": cfg})
    assert main(["train", "--checkpoint", str(tmp_path), "--resume", "--iters", "5"]) == 2
    assert "model='resnet20'" in _error_line(capsys)


@pytest.mark.parametrize(("saved", "argv", "said"), [
    ({}, ["--param-dtype", "bf16"], "param_dtype=None, this run has 'bf16'"),
    ({"param_dtype": "bf16", "reduce_dtype": "fp32"}, [], "param_dtype='bf16', this run has None"),
    ({"param_dtype": "bf16", "reduce_dtype": "fp32"}, ["--param-dtype", "bfloat16"],
     "reduce_dtype='fp32', this run has 'bf16'"),
    ({"param_dtype": "bf16", "reduce_dtype": "fp32", "at": 5}, ["--param-dtype", "bfloat16", "--reduce-dtype",
     "float32"], "already at iteration 5"),  # the same policy, spelled otherwise: past the check
])  # fmt: skip
def test_resume_with_another_fsdp_precision_policy_is_exit_2(capsys, no_launch, tmp_path, saved, argv, said):
    saved = dict(saved)
    at = saved.pop("at", 1)
    cfg = {"model": "lenet5", "data": "synthetic", "seed": 0, "batch_size": 32, "world_size": 2,
           "dtype": "float32", **saved}  # fmt: skip
    save_checkpoint(tmp_path, {"iteration": at, "config": cfg})
    argv = ["train", "--schedule", "fsdp:per-block", "--nproc", "2", *argv]
    assert main([*argv, "--checkpoint", str(tmp_path), "--resume", "--iters", "5"]) == 2
    assert said in _error_line(capsys)


def test_digits_order_is_a_function_of_seed_epoch_iteration():
    def data(rank: int, seed: int = 3) -> TrainData:
        return TrainData("digits", input_shape=(1, 28, 28), num_classes=10, batch_size=16, world_size=4,
                         rank=rank, seed=seed)  # fmt: skip

    ranks = [data(r) for r in range(4)]
    bpe = ranks[0].batches_per_epoch
    assert bpe == (1437 // 4) // 16  # 1,797 digits, 20% held out, DistributedSampler(drop_last=True)
    epoch = [i for d in ranks for it in range(bpe) for i in d.indices(it)]
    assert len(epoch) == len(set(epoch)) == 4 * 16 * bpe  # ranks and iterations never overlap in an epoch
    again = data(2)
    for it in (bpe + 3, 5, 2 * bpe):  # out of order, across epochs: same batch as a fresh reader
        assert again.indices(it) == ranks[2].indices(it)
        assert torch.equal(again.batch(it)[0], ranks[2].batch(it)[0])
    assert ranks[0].indices(0) != ranks[0].indices(bpe)  # reshuffled next epoch
    assert data(0, seed=4).indices(0) != ranks[0].indices(0)
    x, y = ranks[0].batch(0)
    assert x.shape == (16, 1, 28, 28) and y.dtype == torch.int64 and abs(float(x.mean())) < 0.5


def test_digits_read_from_scikit_learns_file_are_load_digits(monkeypatch):
    """The bundled file read without importing scikit-learn gives ``load_digits``'s arrays, bit for bit and
    in the same dtypes; where the file is not found, ``load_digits`` itself answers."""
    import importlib.util

    import numpy as np
    from sklearn.datasets import load_digits

    from dpcomm.runtime import data

    want = load_digits()
    for found in (True, False):
        if not found:
            monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
        images, target = data._digits_arrays()
        assert images.dtype == want.images.dtype and target.dtype == want.target.dtype
        assert np.array_equal(images, want.images) and np.array_equal(target, want.target)


def test_every_config_field_is_a_flag_and_the_cli_copies_them_all():
    import argparse
    import dataclasses

    from dpcomm.cli.train import PS_FLAGS, _config, add_arguments
    from dpcomm.train.config import TrainConfig

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {d for d in vars(parser.parse_args([])) if not d.startswith("_")}  # "_": argparse-internal marks
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    # library-only fields (the CLI shows a bar on a terminal; momentum is the recipe's 0.9); any other
    # field without a flag would be silently unsettable from the command line
    assert fields - dests == {"progress", "momentum"}
    assert dests - fields == {"json", *PS_FLAGS}  # --ps and co. spell the ps:... schedule
    argv = ["--nproc", "3", "--model", "resnet20", "--schedule", "wfbp", "--collective", "ring",
            "--mode", "lp-alg3", "--iters", "7", "--batch-size", "5", "--lr", "0.1", "--data", "digits",
            "--seed", "4", "--checkpoint", "c", "--checkpoint-every", "2", "--resume", "--chrome-trace", "t",
            "--profile-iters", "2", "--verify-iters", "1", "--threads", "2", "--timeout", "9",
            "--nnodes", "2", "--node-rank", "1", "--master-addr", "h", "--master-port", "5"]  # fmt: skip
    cfg = _config(parser.parse_args(argv))
    assert (cfg.nproc, cfg.model, cfg.schedule, cfg.collective, cfg.mode, cfg.iters) == (
        3, "resnet20", "wfbp", "ring", "lp-alg3", 7)  # fmt: skip
    assert (cfg.batch_size, cfg.lr, cfg.data, cfg.seed, cfg.checkpoint, cfg.checkpoint_every) == (
        5, 0.1, "digits", 4, "c", 2)  # fmt: skip
    assert (cfg.resume, cfg.chrome_trace, cfg.profile_iters, cfg.verify_iters, cfg.threads) == (
        True, "t", 2, 1, 2)  # fmt: skip
    assert (cfg.timeout_s, cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (
        9.0, 2, 1, "h", 5)  # fmt: skip
    assert cfg.progress is True and cfg.momentum == 0.9


def test_a_schedule_name_picks_its_replica_kind_and_a_new_kind_plugs_in():
    from dpcomm.train import replica
    from dpcomm.train.config import TrainConfig
    from dpcomm.train.replica import DEFAULT_KIND, ReplicaKind, check_schedule, kind_of, kinds, register_kind

    assert kind_of("ddp").name == "ddp"
    assert {kind_of(s).name for s in ("wfbp", "bucket:25MB", "mgwfbp", "DDP")} == {DEFAULT_KIND}
    cfg = TrainConfig()
    assert check_schedule(cfg, "bucket:1KB").size_bytes == 1024  # parsed once, in the parent
    with pytest.raises(UserError, match="unknown schedule 'fastest'"):
        check_schedule(cfg, "fastest")  # kinds are case-sensitive: "DDP" is the runtime's planner `ddp`
    seen = []
    fake = ReplicaKind(name="fake", build=lambda ctx: ctx, check=lambda c, s: seen.append(s) or s.upper())
    register_kind(fake)
    try:
        assert kind_of("fake:4").build is fake.build and check_schedule(cfg, "fake:4") == "FAKE:4"
        assert seen == ["fake:4"]
    finally:
        replica._KINDS.pop("fake")  # leave the registry as it was for the other tests
    assert "fake" not in kinds()


def test_a_parsed_schedule_plans_as_the_planner_does():
    from dpcomm.costmodel.base import LinearCost
    from dpcomm.planner import make_plan
    from dpcomm.planner.autoplan import build_trace
    from dpcomm.planner.schedule import PlannerSchedule

    trace = build_trace("m", list("abcdef"), [3000, 100, 90_000, 40, 7000, 500], [1e-3] * 6,
                        [2e-3, 1e-3, 4e-3, 1e-4, 3e-3, 5e-4], 8, 4)  # fmt: skip
    cost = LinearCost(a=5e-4, b=1e-8)
    for text in ("wfbp", "single", "bucket:4KB", "bucket:1MiB", "mgwfbp", "optimal"):
        got = PlannerSchedule.parse(text).plan(trace, cost, 4)
        want = make_plan(text, trace, cost, 4)
        assert (got.schedule, got.groups) == (want.schedule, want.groups), text
    with pytest.raises(UserError, match="one schedule per run"):
        PlannerSchedule.parse("wfbp,single")


def test_steady_iterations_are_the_steady_phase_after_the_first():
    from dpcomm.runtime.records import Phase
    from dpcomm.train.report import steady

    phases = [Phase.PROFILE, Phase.PROFILE, Phase.TRIAL, Phase.STEADY, Phase.STEADY]
    recs = [{"iteration": i, "phase": p} for i, p in enumerate(phases)]
    assert [r["iteration"] for r in steady(recs)] == [3, 4]
    ddp = [{"iteration": i, "phase": Phase.STEADY} for i in range(3)]
    assert [r["iteration"] for r in steady(ddp)] == [1, 2]  # never the very first
    short = recs[:3]  # ended before a plan was kept: every iteration counts
    assert steady(short) == short


# ----------------------------------------------------------------------------- real workers


@pytest.mark.slow
def test_lenet5_on_digits_with_2_workers_reaches_95_percent(capsys):
    # 4 epochs x 22 iterations of a 64-sample global batch (32 per worker): 96.7-98.9 % over seeds 0-11 of
    # this very run (seed 0, the one tested: 98.3 %), so 95 % leaves a margin. More epochs buy no margin at
    # this lr (6 epochs: 95.5-99.2 % over seeds 0-5), fewer lose it (3 epochs: 94.7 % on seed 4).
    # Two workers, not four: the same global batch in half the time on two cores.
    argv = ["train", "--nproc", "2", "--model", "lenet5", "--data", "digits", "--epochs", "4",
            "--batch-size", "32", "--lr", "0.05", "--schedule", "mgwfbp"]  # fmt: skip
    out = _run_json(capsys, argv)
    assert set(out) == JSON_KEYS | {"test_accuracy", "predicted_t_iter_s"}  # a plan made on its profile
    assert out["predicted_t_iter_s"] > 0
    assert out["nproc"] == 2 and out["schedule"] == "mgwfbp" and out["collective"] == "native"
    assert len(out["params_sha256"]) == 2 and len(set(out["params_sha256"])) == 1
    assert out["t_iter_s"] > 0 and out["throughput_samples_s"] == pytest.approx(64 / out["t_iter_s"])
    assert 0 <= out["exposed_comm_s"] < out["t_iter_s"]
    assert out["loss_final"] < 0.5
    assert out["test_accuracy"] >= 0.95


def _cli_config(argv: list[str]):
    """The :class:`TrainConfig` that ``dpcomm train ARGV`` runs, read by the CLI's own parser."""
    import argparse

    from dpcomm.cli.train import _config, add_arguments

    assert argv[0] == "train"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return _config(parser.parse_args(argv[1:]))


@pytest.fixture(scope="module")
def killed_then_shared(tmp_path_factory):
    """A checkpointed run whose rank 1 dies at iteration 5 (a launch of its own: the agent ends it), then one
    launch (tests/_train_workers.py: starting workers costs more than these few iterations) for the
    uninterrupted run and the one resumed from that checkpoint, each the config its command line gives, and
    the bf16 comparison of ``ddp`` and ``mgwfbp`` (digits)."""
    from dpcomm.train import TrainConfig
    from tests._train_workers import train_runs

    tmp_path = tmp_path_factory.mktemp("killed")
    ckpt, trace, err = tmp_path / "ckpt", tmp_path / "trace.json", io.StringIO()
    os.environ["DPCOMM_TEST_KILL"] = "1:5"  # the last checkpoint is then the one of iteration 4
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stderr(err):
            rc = main([*TINY, "--nproc", "2", "--iters", "6", "--checkpoint", str(ckpt), "--checkpoint-every",
                       "2", "--timeout", "30"])  # fmt: skip
    finally:
        del os.environ["DPCOMM_TEST_KILL"]
    killed = {"rc": rc, "s": time.monotonic() - t0, "err": err.getvalue(), "at": load_checkpoint(ckpt)}
    argv = [*TINY, "--nproc", "2", "--iters", "6"]
    bf16 = TrainConfig(model="lenet5", nproc=2, data="digits", iters=8, batch_size=16, dtype="bf16",
                       profile_iters=2, verify_iters=1, progress=False)  # fmt: skip
    dear, dear_ckpt = [*argv[:6], "dear", *argv[7:]], tmp_path / "dear"  # issue 56: --schedule dear
    (full,), (resumed,), (ddp, mg), (dear_full,), _, (dear_resumed,) = train_runs(
        [
            (_cli_config([*argv, "--chrome-trace", str(trace)]), None),
            (_cli_config([*argv, "--checkpoint", str(ckpt), "--resume"]), None),
            (bf16, ["ddp", "mgwfbp"]),
            (_cli_config(dear), None),
            (_cli_config([*dear[:-2], "--iters", "4", "--checkpoint", str(dear_ckpt)]), None),
            (_cli_config([*dear, "--checkpoint", str(dear_ckpt), "--resume"]), None),
        ]
    )
    return {
        "killed": killed,
        "full": full,
        "resumed": resumed,
        "trace": trace,
        "ckpt": ckpt,
        "bf16": (ddp, mg),
        "dear": (dear_full, dear_resumed, dear_ckpt),
    }


@pytest.mark.slow
def test_killed_worker_then_resume_equals_uninterrupted(killed_then_shared):
    got = killed_then_shared
    killed = got["killed"]
    assert killed["rc"] == 1 and killed["s"] < 60
    err = killed["err"].strip()
    assert len(err.splitlines()) == 1 and err.startswith("dpcomm: error: "), err
    assert "worker rank 1 failed: exited with code 17" in err
    assert killed["at"]["iteration"] == 4
    assert (got["full"].start_iteration, got["resumed"].start_iteration) == (0, 4)
    full, resumed = got["full"].to_json(), got["resumed"].to_json()  # what --json prints
    assert set(full) == JSON_KEYS and len(set(full["params_sha256"])) == 1
    events = json.loads(got["trace"].read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}  # one process per rank
    assert any(e["ph"] == "X" and e["tid"] == 1 for e in events)  # communication rows
    assert resumed["params_sha256"] == full["params_sha256"]
    assert resumed["loss_final"] == full["loss_final"]
    assert load_checkpoint(got["ckpt"])["iteration"] == 6


@pytest.mark.slow
def test_dear_resumes_from_its_gathered_optimizer_state_bitwise(killed_then_shared):
    """``--schedule dear``: its optimizer state lives in shards; the checkpoint holds it whole (every rank
    gathers before rank 0 saves), and the resumed run ends bitwise as the uninterrupted one."""
    full, resumed, ckpt = killed_then_shared["dear"]
    assert (full.start_iteration, resumed.start_iteration) == (0, 4)
    assert full.plan["schedule"] == "dear" and len(set(full.params_sha256)) == 1
    saved = load_checkpoint(ckpt)
    momentum = [s["momentum_buffer"] for s in saved["optimizer"]["state"].values()]
    assert saved["plan"]["schedule"] == "dear" and len(momentum) == len(
        saved["optimizer"]["param_groups"][0]["params"]
    )
    assert all(m.abs().sum() > 0 for m in momentum)  # whole tensors, every element gathered
    assert resumed.params_sha256 == full.params_sha256 and resumed.loss_final == full.loss_final


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_dead_peer_on_another_node_fails_the_survivors_fast(tmp_path):
    # Two "machines" on loopback (static rendezvous, as torchrun --nnodes 2): the survivor is not killed by
    # its own agent, so it must notice the lost peer itself (gloo) and exit with one clear line.
    port = str(_free_port())
    env = {**os.environ, "DPCOMM_TEST_KILL": "1:3"}
    argv = [sys.executable, "-m", "dpcomm", *TINY, "--nproc", "1", "--nnodes", "2", "--master-port", port,
            "--iters", "50", "--timeout", "30"]  # fmt: skip
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [*argv, "--node-rank", str(r)],
            env=env,
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    elapsed = time.monotonic() - t0
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 1, (out, err)
        assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "rank 0 of 2 stopped at iteration 3" in outs[0][1]
    assert "Connection" in outs[0][1] or "timed out" in outs[0][1].lower()
    assert "worker rank 1 failed: exited with code 17" in outs[1][1]
    assert elapsed < 90  # well inside the 30 s collective timeout plus start-up, not a hang


def test_worker_threads_flag_then_omp_num_threads_then_cores_per_worker(monkeypatch):
    from dpcomm.train.config import TrainConfig
    from dpcomm.train.loop import _threads

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = TrainConfig(model="lenet5", nproc=4)
    assert _threads(cfg, 4) == 2 and _threads(cfg, 16) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # torchrun / testbed launch: workers share the cores
    assert _threads(cfg, 4) == 3
    assert _threads(TrainConfig(model="lenet5", nproc=4, threads=5), 4) == 5


@pytest.mark.slow
def test_bf16_trains_alike_and_the_plan_prices_two_byte_gradients(killed_then_shared):
    ddp, mg = killed_then_shared["bf16"]  # compared side by side on the same batches, in one run
    for r in (ddp, mg):
        assert len(set(r.params_sha256)) == 1 and r.loss_final < math.log(10)  # identical, and learning
    assert mg.params_sha256 == ddp.params_sha256  # two ranks: one bf16 sum per element either way
    assert mg.trace["dtype_bytes"] == 2  # the planner priced the bytes that travel
    assert mg.grad_bytes == sum(p.numel() for p in get_model("lenet5", 10).parameters()) * 2
