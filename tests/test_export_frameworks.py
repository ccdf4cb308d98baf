"""``dpcomm plan --export`` read by each framework's own config class (issue 55): DeepSpeed's
``DeepSpeedConfig`` (ZeRO 1, 2 and 3, pydantic-validated), Megatron-Core's ``DistributedDataParallelConfig``,
the Trainer's ``TrainingArguments``, Accelerate's ``DistributedDataParallelKwargs``, Lightning's
``DDPStrategy`` and torchtitan's ``ParallelismConfig``; each fragment as ``dpcomm plan`` prints it, on a
shipped trace. The frameworks tier only (``make test-frameworks``; see tests/test_frameworks.py)."""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from dpcomm.cli.main import main

if os.environ.get("DPCOMM_FRAMEWORKS") != "1":
    pytest.skip("the frameworks tier: run it with `make test-frameworks`", allow_module_level=True)

pytestmark = [pytest.mark.frameworks]

DDP = ["plan", "--trace", "resnet50", "--nodes", "16", "--network", "10gbe"]
FSDP = [*DDP, "--fsdp", "optimal"]


def _fragment(capsys, *args: str) -> str:
    capsys.readouterr()  # what importing a framework printed (DeepSpeed logs to standard output)
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("stage", ["1", "2"])
def test_deepspeed_reads_the_ddp_export(capsys, stage):
    from deepspeed.runtime.config import DeepSpeedConfig

    frag = json.loads(_fragment(capsys, *DDP, "--export", "deepspeed", "--zero-stage", stage))
    cfg = DeepSpeedConfig({"train_batch_size": 16, **frag})
    assert cfg.zero_optimization_stage == int(stage)
    assert cfg.zero_config.reduce_bucket_size == frag["zero_optimization"]["reduce_bucket_size"] > 0


def test_deepspeed_reads_the_fsdp_export_as_zero3(capsys):
    from deepspeed.runtime.config import DeepSpeedConfig

    frag = json.loads(_fragment(capsys, *FSDP, "--export", "deepspeed"))
    cfg = DeepSpeedConfig({"train_batch_size": 16, **frag}).zero_config
    zero = frag["zero_optimization"]
    assert cfg.stage == 3 and cfg.prefetch_bucket_size == zero["stage3_prefetch_bucket_size"]
    assert cfg.max_live_parameters == zero["stage3_max_live_parameters"] > 0
    assert cfg.param_persistence_threshold == 0


def test_megatron_reads_its_export(capsys):
    from megatron.core.distributed import DistributedDataParallelConfig

    frag = json.loads(_fragment(capsys, *DDP, "--export", "megatron"))
    cfg = DistributedDataParallelConfig(**frag)
    assert cfg.bucket_size == frag["bucket_size"] > 0 and cfg.overlap_grad_reduce


def test_the_trainer_accelerate_and_lightning_read_theirs(capsys, tmp_path):
    from accelerate.utils import DistributedDataParallelKwargs
    from pytorch_lightning.strategies import DDPStrategy
    from transformers import TrainingArguments

    mb = json.loads(_fragment(capsys, *DDP, "--export", "trainer"))["ddp_bucket_cap_mb"]
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, ddp_bucket_cap_mb=mb, report_to=[])
    assert args.ddp_bucket_cap_mb == mb > 0
    acc = json.loads(_fragment(capsys, *DDP, "--export", "accelerate"))
    assert DistributedDataParallelKwargs(**acc["DistributedDataParallelKwargs"]).to_kwargs() == {
        "bucket_cap_mb": mb
    }
    pl = json.loads(_fragment(capsys, *DDP, "--export", "lightning"))
    assert DDPStrategy(**pl["DDPStrategy"])._ddp_kwargs == {"bucket_cap_mb": mb}


def test_torchtitan_reads_its_export(capsys):
    from torchtitan.config.configs import ParallelismConfig

    text = _fragment(capsys, *FSDP, "--hsdp", "4", "--export", "torchtitan")
    par = ParallelismConfig(**tomllib.loads(text)["parallelism"])
    assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == 16
    assert par.fsdp_reshard_after_forward in ("always", "never")
