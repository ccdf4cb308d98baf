"""``--device cuda`` without a GPU: the argument handling, and the plumbing a GPU worker goes through (one
process per GPU: ``LOCAL_RANK``'s GPU made current before the process group, NCCL, ``device_id=``), with
torch's CUDA and process-group calls replaced by recorders. The GPU run itself is ``benchmarks/gpu_check.py``
and ``dpcomm train --device cuda`` on a machine that has one (docs/gpu.md)."""

import pytest
import torch
import torch.distributed as dist

from dpcomm.devices import check_device, worker_device
from dpcomm.errors import UserError
from dpcomm.launch import init_worker

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with two (pretend) GPUs: what the CUDA and process-group calls were, in order."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", torch.device(d))))

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           device_id=None):  # fmt: skip
        calls.append(("init_process_group", backend, device_id, rank, world_size))

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: ("store", a))
    monkeypatch.setattr(dist, "PrefixStore", lambda prefix, store: ("prefix", prefix))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    return calls


@pytest.mark.parametrize("store", [None, "127.0.0.1:29500"])
def test_a_gpu_worker_takes_its_local_ranks_gpu_before_the_nccl_group(two_gpus, monkeypatch, store):
    if store is None:
        monkeypatch.delenv("DPCOMM_STORE", raising=False)  # torchrun's environment
    else:
        monkeypatch.setenv("DPCOMM_STORE", store)  # dpcomm.launch's store
    assert init_worker(timeout_s=5, device="cuda") == (1, 2)
    gpu = torch.device("cuda", 1)
    expected_rank = (-1, -1) if store is None else (1, 2)
    assert two_gpus == [("set_device", gpu), ("init_process_group", "nccl", gpu, *expected_rank)]


def test_a_cpu_worker_joins_gloo_and_touches_no_gpu(two_gpus, monkeypatch):
    monkeypatch.delenv("DPCOMM_STORE", raising=False)
    init_worker(timeout_s=5)
    assert two_gpus == [("init_process_group", "gloo", None, -1, -1)]


def test_a_worker_device_is_its_local_rank(two_gpus, monkeypatch):
    assert worker_device("cpu") == torch.device("cpu")
    assert worker_device("cuda") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(UserError, match="local rank 2 has no GPU"):
        worker_device("cuda")


def test_one_process_per_gpu_is_checked_in_one_line(two_gpus):
    check_device("cuda", 2)
    with pytest.raises(UserError, match="--nproc 3 needs 3 GPUs, this machine has 2"):
        check_device("cuda", 3)
    with pytest.raises(UserError, match="must be one of cpu, cuda"):
        check_device("gpu")


@NO_GPU
def test_no_gpu_is_one_line():
    with pytest.raises(UserError, match=r"no CUDA GPU here \(torch.cuda.is_available\(\) is False\)"):
        check_device("cuda")


@pytest.mark.parametrize("schedule", ["ddp", "ddp:optimal", "ddp:mgwfbp", "fsdp:per-block", "fsdp:optimal"])
def test_train_on_gpus_takes_the_ddp_and_fsdp_kinds(two_gpus, schedule):
    from dpcomm.train.config import TrainConfig

    cfg = TrainConfig(device="cuda", nproc=2, schedule=schedule, autocast="bf16")
    assert (cfg.device, cfg.autocast) == ("cuda", "bf16")


@pytest.mark.parametrize("schedule", ["mgwfbp", "wfbp", "ps:all"])
def test_train_on_gpus_refuses_dpcomms_cpu_runtime(two_gpus, schedule):
    from dpcomm.train.config import TrainConfig

    with pytest.raises(UserError, match="--device cuda runs ddp, ddp:PLANNER and fsdp:PLANNER"):
        TrainConfig(device="cuda", nproc=1, schedule=schedule)


def test_a_replicas_model_is_built_on_the_workers_device(two_gpus, monkeypatch):
    import dpcomm.devices
    from dpcomm.train.config import TrainConfig
    from dpcomm.train.replica import ReplicaContext
    from dpcomm.train.setup import build_model

    monkeypatch.setattr(dpcomm.devices, "worker_device", lambda device: torch.device("meta"))  # GPU stand-in
    cfg = TrainConfig(device="cuda", nproc=2, schedule="ddp", dtype="bf16")
    ctx = ReplicaContext(cfg=cfg, schedule="ddp", parsed=None, rank=1, world=2, state=None)
    model = build_model(ctx).model
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("meta", torch.bfloat16)}


def test_autocast_in_train_context(two_gpus):
    from dpcomm.train.config import TrainConfig, autocast_context

    with autocast_context(TrainConfig(autocast="bf16")):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with autocast_context(TrainConfig()):
        assert not torch.is_autocast_enabled("cpu")


def _dpcomm(capsys, *args: str) -> tuple[int, list[str]]:
    from dpcomm.cli.main import main

    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


@NO_GPU
@pytest.mark.parametrize(
    "args",
    [
        ("train", "--device", "cuda", "--schedule", "ddp"),
        ("train", "--device", "cuda", "--schedule", "fsdp:per-block", "--autocast", "bf16"),
        ("bench", "--nproc", "2", "--device", "cuda"),
    ],
)
def test_the_cli_without_a_gpu_is_one_line_and_exit_2(capsys, args):
    assert _dpcomm(capsys, *args) == (
        2, ["dpcomm: error: --device cuda: no CUDA GPU here (torch.cuda.is_available() is False)"]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("train", "--device", "tpu"), "--device must be one of cpu, cuda"),
        (("bench", "--nproc", "2", "--device", "gpu"), "--device must be one of cpu, cuda"),
        (("train", "--autocast", "fp8"), "--autocast must be one of"),
    ],
)
def test_bad_device_flags_are_one_line(capsys, args, needle):
    code, err = _dpcomm(capsys, *args)
    assert code == 2 and len(err) == 1 and needle in err[0]
