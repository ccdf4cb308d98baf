"""``dpcomm plan --export`` (:mod:`dpcomm.integrations.export`, :mod:`dpcomm.cli.plan_export`, issue 55): the
fragments carry ``bucket:auto``'s size in each framework's unit, an FSDP plan's prefetch, live parameters
and reshard choice in ZeRO-3's and torchtitan's terms, and what no form can take is refused in one line.
Pure functions and the CLI; the frameworks' own config classes read the fragments in the frameworks tier
(tests/test_export_frameworks.py)."""

from __future__ import annotations

import json
import tomllib

import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.integrations.export import export_ddp, export_fsdp
from dpcomm.plan import Plan
from dpcomm.planner.bucket_auto import plan_bucket_auto
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.trace import save_trace
from tests._sim_ref import make_trace

PARAMS = [1000, 200_000, 50_000, 4_000_000, 3000]
COST = LinearCost(0.001, 1e-9)


def _trace(dtype_bytes: int = 4):
    return make_trace([0.002, 0.001, 0.003, 0.002, 0.001], [0.001] * 5, PARAMS, dtype_bytes=dtype_bytes)


@pytest.mark.parametrize("dtype_bytes", [2, 4])
def test_ddp_forms_carry_bucket_auto_size_in_each_frameworks_unit(dtype_bytes):
    trace = _trace(dtype_bytes)
    plan = plan_bucket_auto(trace, COST, 8)
    size, mb = plan.meta["bucket_bytes"], plan.meta["bucket_cap_mb"]
    assert size % dtype_bytes == 0  # a sum of whole layers' gradients
    assert export_ddp("trainer", plan, trace).fragment == {"ddp_bucket_cap_mb": mb}
    assert export_ddp("accelerate", plan, trace).fragment == {
        "DistributedDataParallelKwargs": {"bucket_cap_mb": mb}
    }
    assert export_ddp("lightning", plan, trace).fragment == {"DDPStrategy": {"bucket_cap_mb": mb}}
    assert int(mb * 2**20) == size  # DDP's own conversion gives back the bytes exactly
    meg = export_ddp("megatron", plan, trace).fragment
    assert meg == {"bucket_size": size // dtype_bytes, "overlap_grad_reduce": True}
    for stage in (None, 1, 2):
        zero = export_ddp("deepspeed", plan, trace, zero_stage=stage).fragment["zero_optimization"]
        assert zero["stage"] == (stage or 2) and zero["overlap_comm"] is True
        assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == size // dtype_bytes


def _fsdp_plan(depth: int, reshard: bool, group: int | None = None) -> FsdpPlan:
    return FsdpPlan(
        method="optimal", num_modules=5, units=((0, 1), (2, 2), (3, 4)), depth=depth,
        reshard_after_forward=reshard, shard_group=group, peak_bytes=4 * 4_300_000,
    )  # fmt: skip


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("reshard", [True, False])
def test_zero3_takes_the_plans_prefetch_live_parameters_and_reshard(depth, reshard):
    trace = _trace()
    zero = export_fsdp("deepspeed", _fsdp_plan(depth, reshard), trace, 8).fragment["zero_optimization"]
    units = [201_000, 50_000, 4_003_000]
    ahead = max(sum(units[k + 1 : k + 1 + depth]) for k in range(3))
    assert zero["stage"] == 3 and zero["stage3_prefetch_bucket_size"] == ahead
    assert zero["stage3_max_live_parameters"] == 4_300_000
    assert zero["stage3_max_reuse_distance"] == (0 if reshard else sum(units))
    assert zero["stage3_param_persistence_threshold"] == 0 and zero["reduce_bucket_size"] == max(units)


def test_torchtitan_takes_the_degrees_and_reshard_as_toml():
    out = export_fsdp("torchtitan", _fsdp_plan(1, False, group=4), _trace(), 16)
    par = tomllib.loads(out.text())["parallelism"]
    assert par == out.fragment["parallelism"]
    assert par == {
        "data_parallel_shard_degree": 4,
        "data_parallel_replicate_degree": 4,
        "fsdp_reshard_after_forward": "never",
    }
    assert any("cannot be expressed" in n for n in out.notes)


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "t.json"
    save_trace(_trace(), path)
    return str(path)


def _plan(trace_file: str, *args: str) -> list[str]:
    return ["plan", "--trace", trace_file, "--nodes", "8", "--linear-cost", "0.001,1e-9", *args]


def test_the_cli_prints_the_fragment_alone_and_the_times_apart(trace_file, capsys):
    assert main(_plan(trace_file, "--export", "deepspeed")) == 0
    out = capsys.readouterr()
    zero = json.loads(out.out)["zero_optimization"]
    plan = plan_bucket_auto(_trace(), COST, 8)
    assert zero["reduce_bucket_size"] == plan.meta["bucket_bytes"] // 4
    assert "DDP's default" in out.err and "per-bucket optimum" in out.err
    fsdp = ["plan", "--trace", trace_file, "--nodes", "8", "--network", "10gbe", "--fsdp", "optimal"]
    assert main([*fsdp, "--export", "torchtitan"]) == 0
    assert "[parallelism]" in capsys.readouterr().out


BAD = {
    "zero3-with-a-ddp-plan": (["--export", "deepspeed", "--zero-stage", "3"], "ZeRO stage 3 shards"),
    "zero2-with-an-fsdp-plan": (
        ["--fsdp", "optimal", "--export", "deepspeed", "--zero-stage", "2"],
        "stage 3,",
    ),
    "zero-stage-0": (["--export", "deepspeed", "--zero-stage", "0"], "stage 0"),
    "zero-stage-elsewhere": (["--export", "megatron", "--zero-stage", "2"], "--zero-stage is DeepSpeed's"),
    "zero-stage-alone": (["--zero-stage", "2"], "--zero-stage is DeepSpeed's"),
    "per-bucket-plan": (["--export", "trainer", "--schedule", "optimal"], "takes one bucket size"),
    "fsdp-for-megatron": (["--fsdp", "optimal", "--export", "megatron"], "takes a DDP plan"),
    "ddp-for-torchtitan": (["--export", "torchtitan"], "takes an FSDP plan"),
    "unknown": (["--export", "jax"], "unknown --export"),
    "with-json": (["--export", "trainer", "--json"], "not with --pull, --json"),
}


@pytest.mark.parametrize("name", BAD)
def test_what_no_form_can_take_is_refused_in_one_line(name, trace_file, capsys):
    args, words = BAD[name]
    assert main(_plan(trace_file, *args)) == 2
    out = capsys.readouterr()
    assert out.out == "" and words in out.err and out.err.count("\n") == 1, out.err


def test_the_library_refuses_alike():
    with pytest.raises(UserError, match="takes one bucket size"):
        export_ddp("trainer", Plan(schedule="optimal", num_layers=5, groups=((0, 1, 2, 3, 4),)), _trace())
