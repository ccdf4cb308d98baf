"""dpcomm.compat: what differs between the torch versions dpcomm supports, and the supported minimum said
once (pyproject, the module, the Makefile's compatibility tier agree). ``make test-compat`` runs this file
and the tests that launch workers on the oldest supported torch."""

import dataclasses
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpcomm import compat

ROOT = Path(__file__).resolve().parents[1]


def test_the_supported_minimum_is_said_once_in_three_places():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (bound,) = [d.removeprefix("torch>=") for d in deps if d.startswith("torch>=")]
    tier = re.search(r"^COMPAT_TORCH\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert compat.torch_version(bound) == compat.MIN_TORCH == compat.torch_version(tier)
    assert compat.torch_version() >= compat.MIN_TORCH  # the torch running these tests is supported


def test_versions_read_as_torch_writes_them():
    assert compat.torch_version("2.11.0+cu130") == (2, 11)
    assert compat.torch_version("2.13.0+cpu") == (2, 13)
    assert compat.torch_version("2.16.0.dev20260101") == (2, 16)
    assert compat.torch_version("2.12.0a0+git1234") == (2, 12)


@dataclasses.dataclass
class _OldLaunchConfig:  # torch 2.11's LaunchConfig: no shutdown_timeout
    min_nodes: int
    max_nodes: int
    nproc_per_node: int


@dataclasses.dataclass
class _NewLaunchConfig(_OldLaunchConfig):
    shutdown_timeout: int | None = None


@pytest.mark.parametrize("cls", [_OldLaunchConfig, _NewLaunchConfig])
def test_launch_config_passes_shutdown_timeout_only_where_torch_takes_it(monkeypatch, cls):
    import torch.distributed.launcher.api as api

    monkeypatch.setattr(api, "LaunchConfig", cls)
    cfg = compat.launch_config(min_nodes=1, max_nodes=1, nproc_per_node=2, shutdown_timeout=1)
    assert isinstance(cfg, cls) and cfg.nproc_per_node == 2
    assert getattr(cfg, "shutdown_timeout", None) == (1 if cls is _NewLaunchConfig else None)


def test_launch_config_takes_what_dpcomm_launch_passes_on_this_torch():
    cfg = compat.launch_config(
        min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="x", rdzv_backend="static",
        rdzv_endpoint="127.0.0.1:1", max_restarts=0, monitor_interval=0.05, start_method="spawn",
        shutdown_timeout=1,
    )  # fmt: skip
    assert cfg.nproc_per_node == 2 and cfg.max_restarts == 0


def test_process_group_binds_a_gpu_only_where_init_process_group_takes_device_id(monkeypatch):
    gpu = torch.device("cuda", 1)  # a device object needs no GPU
    assert compat.process_group_kwargs(None) == {}
    assert compat.process_group_kwargs(torch.device("cpu")) == {}
    assert compat.process_group_kwargs(gpu) == {"device_id": gpu}  # every supported torch has it

    def old_init(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None):
        raise AssertionError("not called")

    monkeypatch.setattr(dist, "init_process_group", old_init)
    assert compat.process_group_kwargs(gpu) == {}


@pytest.mark.slow  # a process group in this process
def test_flat_collectives_gather_and_scatter_without_a_deprecation():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the name this torch deprecates is not the one called
            shard = torch.arange(6, dtype=torch.float32)
            full = torch.zeros(6)
            compat.all_gather_single(full, shard)
            assert torch.equal(full, shard)
            out = torch.zeros(6)
            compat.reduce_scatter_single(out, shard * 2, op=dist.ReduceOp.AVG)
            assert torch.equal(out, shard * 2)
            work = compat.all_gather_single(full, shard + 1, async_op=True)
            work.wait()
            assert torch.equal(full, shard + 1)
    finally:
        dist.destroy_process_group()


def test_shard_refuses_rank_dependent_parameters_where_fsdp2_cannot_reduce_them(monkeypatch):
    """torch 2.11's FSDP2 has no ``set_reduce_scatter_unused_params``: a model whose ranks' examples leave
    different parameters without gradients is refused in one line before anything is sharded (else the
    ranks' reduce-scatters would differ)."""
    from types import SimpleNamespace

    import dpcomm.fsdp.agreed as agreed
    from dpcomm.errors import UserError

    monkeypatch.setattr(agreed, "fsdp_reduces_unused", lambda: False)
    analysis = SimpleNamespace(uneven=("experts.0.weight", "experts.1.weight"), units=())
    with pytest.raises(UserError, match="experts.0.weight, experts.1.weight get gradients on some ranks"):
        agreed.agreed_shardable(torch.nn.Linear(2, 2), None, analysis, None)
