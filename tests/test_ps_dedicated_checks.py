"""Dedicated parameter servers (``--ps --ps-servers S``) get every check the training loop makes, before any
worker or server starts: the same table run for both placements (no processes; ``launch`` refuses)."""

import pytest
import torch

import dpcomm.launch
from dpcomm.cli.main import main
from dpcomm.runtime.checkpoint import checkpoint_path, save_checkpoint

BASE = ["train", "--model", "lenet5", "--data", "digits", "--nproc", "2", "--batch-size", "8", "--ps",
        "--pull", "ibatch"]  # fmt: skip
PLACEMENTS = {"colocated": [], "dedicated": ["--ps-servers", "2"]}


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("processes were started for a run that should have been refused")

    monkeypatch.setattr(dpcomm.launch, "launch", refuse)


def _ckpt(folder, **config) -> bytes:
    cfg = {"model": "lenet5", "data": "digits", "seed": 0, "batch_size": 8, "world_size": 2, **config}
    save_checkpoint(folder, {"iteration": 4, "config": cfg, "model": {"w": torch.ones(3)}})
    return checkpoint_path(folder).read_bytes()


def _ckpt16(folder) -> bytes:
    return _ckpt(folder, batch_size=16)


def _ckpt3(folder) -> bytes:
    return _ckpt(folder, world_size=3)


def _corrupt(folder) -> bytes:
    _ckpt(folder)
    checkpoint_path(folder).write_bytes(b"not a checkpoint")
    return b"not a checkpoint"


CASES = {
    # name: (make the folder's checkpoint, extra flags, the error's words)
    "existing checkpoint, no --resume/--overwrite": (_ckpt, ["--iters", "8"], "exists: continue it"),
    "corrupt checkpoint, no --resume": (_corrupt, ["--iters", "8"], "exists"),
    "corrupt checkpoint, --resume": (_corrupt, ["--iters", "8", "--resume"], "corrupt checkpoint"),
    "resume under another seed": (_ckpt, ["--iters", "8", "--resume", "--seed", "3"], "seed=0"),
    "resume under another batch size": (_ckpt16, ["--iters", "8", "--resume"], "batch_size=16"),
    "resume under another --nproc": (_ckpt3, ["--iters", "8", "--resume"], "world_size=3"),
    "resume of a finished run": (_ckpt, ["--iters", "4", "--resume"], "already at iteration 4"),
    "resume with no checkpoint": (None, ["--iters", "8", "--resume"], "no checkpoint"),
}  # fmt: skip


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line_before_any_process_and_nothing_overwritten(
    capsys, no_launch, tmp_path, placement, case
):
    make, flags, words = CASES[case]
    before = make(tmp_path) if make else None
    argv = [*BASE, *PLACEMENTS[placement], "--checkpoint", str(tmp_path), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dpcomm: error: ") and words in err, err
    if before is not None:
        assert checkpoint_path(tmp_path).read_bytes() == before  # never written over unasked


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_an_unwritable_checkpoint_folder_is_refused_first(capsys, no_launch, tmp_path, placement):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main([*BASE, *PLACEMENTS[placement], "--checkpoint", str(blocker / "ck")]) == 2
    assert "not writable" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--pull="], "--pull needs a value"),
        (["--pull-mode="], "--pull-mode needs a value"),
        (["--sparsify="], "--sparsify needs a value"),
        (["--ps-servers", "0"], "--ps-servers must be >= 1"),
    ],
)
def test_empty_or_bad_ps_flags_are_one_line(capsys, no_launch, flags, words):
    assert main([*BASE, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_schedules_compared_in_one_run_need_the_same_server_ranks():
    from dpcomm.errors import UserError
    from dpcomm.train import TrainConfig, compare_schedules

    cfg = TrainConfig(model="lenet5", nproc=2, data="digits", iters=2, batch_size=8)
    with pytest.raises(UserError, match="same number of server ranks"):
        compare_schedules(cfg, ["ps:all,servers=2", "mgwfbp"])
