"""Mixed precision in FSDP plans and runs: FSDP2's ``MixedPrecisionPolicy`` priced and applied.

Fast tier: the prices follow the dtypes (a unit's gather in ``param_dtype`` bytes, its reduce-scatter and
HSDP all-reduce in ``reduce_dtype`` bytes, the unsharded peak in ``param_dtype``) through
:func:`plan_fsdp`, :func:`plan_hsdp`, :func:`dpcomm.sim.fsdp.plan_row` and ``dpcomm plan --fsdp``; bad
dtypes are one line. ``shard(..., mp_policy=MixedPrecisionPolicy(bf16, fp32))`` against plain
``fully_shard`` with the same policy over the same modules runs in ``tests/test_hsdp.py``'s launch (the
slow tier: one launch of workers for both).
"""

from __future__ import annotations

import json

import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.planner.fsdp import Modules, Precision, plan_fsdp
from dpcomm.planner.hsdp import plan_hsdp
from dpcomm.trace.format import Layer, Trace


def _trace(dtype_bytes: int = 4) -> Trace:
    layers = tuple(
        Layer(name=f"h.{i}.fc", params=1000 * (i + 1), forward_s=1e-3, backward_s=2e-3) for i in range(4)
    )
    return Trace(model="toy", batch_size=1, device="cpu", dtype_bytes=dtype_bytes, layers=layers)


BETA = LinearCost(0.0, 1e-9)  # 1 ns/B, no start-up: times are bytes


def test_a_units_gather_costs_half_in_bf16_and_its_reduction_stays_fp32():
    tr = _trace()
    B = sum(x.params for x in tr.layers) * 4  # fp32 bytes of the one unit
    kw = dict(depth=0, reshard=False, overlap="streams")
    plain = plan_fsdp("whole", tr, BETA, LinearCost(0.0, 2e-9), **kw)
    mixed = plan_fsdp("whole", tr, BETA, LinearCost(0.0, 2e-9), precision=Precision(param_dtype="bf16",
                      reduce_dtype="fp32"), **kw)  # fmt: skip
    compute = tr.t_f + tr.t_b
    # one unit, no prefetch: gather, forward, backward, reduce-scatter in a row
    assert plain.time_s == pytest.approx(compute + 1e-9 * B + 2e-9 * B, rel=1e-12)
    assert mixed.time_s == pytest.approx(compute + 1e-9 * B / 2 + 2e-9 * B, rel=1e-12)
    assert plain.peak_bytes == B and mixed.peak_bytes == B // 2
    assert mixed.meta["precision"] == {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    # reduce_dtype defaults to param_dtype, as FSDP2's does: both collectives halve
    both = plan_fsdp("whole", tr, BETA, LinearCost(0.0, 2e-9), precision=Precision(param_dtype="bf16"), **kw)
    assert both.time_s == pytest.approx(compute + 3e-9 * B / 2, rel=1e-12)


def test_modules_under_a_policy_and_non_linear_costs():
    mods, k = Modules.from_trace(_trace(2)).under(Precision(param_dtype="fp32", reduce_dtype="bf16"))
    assert mods.param_bytes == tuple(4000 * (i + 1) for i in range(4)) and mods.dtype_bytes == 4
    assert k == 0.5
    assert Modules.from_trace(_trace()).under(None)[1] == 1.0
    with pytest.raises(UserError, match="element size"):  # bare bytes: nothing to rescale
        Modules(forward_s=(0.0,), backward_s=(0.0,), param_bytes=(8,)).under(Precision(param_dtype="bf16"))
    with pytest.raises(UserError, match="param dtype must be one of"):
        Precision(param_dtype="int8")
    # a cost that is not a line is called at the reduction's bytes
    seen = []

    def cost(nbytes):
        seen.append(nbytes)
        return 0.0

    plan_fsdp("whole", _trace(), BETA, cost, depth=0, reshard=False, precision=Precision(param_dtype="bf16",
              reduce_dtype="fp32"))  # fmt: skip
    assert seen and all(b == 40_000 for b in seen), seen  # fp32 bytes, while gathers move 20,000


def test_optimal_and_hsdp_plan_the_policys_bytes():
    tr = _trace()
    p = Precision(param_dtype="bf16", reduce_dtype="fp32")
    ag, rs = LinearCost(1e-4, 1e-9), LinearCost(1e-4, 2e-9)
    fit = 10_000  # bytes: only the bf16 units fit
    with pytest.raises(UserError, match="no optimal plan fits"):
        plan_fsdp("optimal", tr, ag, rs, memory=fit // 2, max_depth=1)
    mixed = plan_fsdp("optimal", tr, ag, rs, memory=fit, max_depth=1, precision=p)
    assert mixed.peak_bytes <= fit
    from dpcomm.costmodel import PRESETS

    h = plan_hsdp("whole", tr, PRESETS["10gbe"], world=4, shards=[2], depth=0, reshard=False, precision=p)
    h0 = plan_hsdp("whole", tr, PRESETS["10gbe"], world=4, shards=[2], depth=0, reshard=False)
    assert h.peak_bytes * 2 == h0.peak_bytes and h.time_s < h0.time_s


def test_plan_row_prices_reductions_in_reduce_dtype():
    from dpcomm.sim.fsdp import plan_row

    tr = _trace()

    def costs(G):
        return BETA, BETA, BETA

    kw = dict(max_depth=0)
    plain = plan_row("fsdp:whole", tr, costs, 4, **kw)
    half = plan_row("fsdp:whole", tr, costs, 4, precision=Precision(param_dtype="bf16"), **kw)
    mixed = plan_row("fsdp:whole", tr, costs, 4, precision=Precision(param_dtype="bf16", reduce_dtype="fp32"),
                     **kw)  # fmt: skip
    B = 40_000
    comm = plain.t_iter_s - (tr.t_f + tr.t_b)
    assert comm == pytest.approx(2e-9 * B, rel=1e-9)
    assert half.t_iter_s - (tr.t_f + tr.t_b) == pytest.approx(1e-9 * B, rel=1e-9)
    assert mixed.t_iter_s - (tr.t_f + tr.t_b) == pytest.approx(1.5e-9 * B, rel=1e-9)
    assert mixed.memory_bytes * 2 == plain.memory_bytes


def test_plan_fsdp_cli_takes_the_dtypes(capsys):
    args = ["plan", "--trace", "gpt2-tiny-cpu-b16", "--nodes", "8", "--network", "10gbe", "--fsdp",
            "per-block", "--max-depth", "0", "--json"]  # fmt: skip
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--param-dtype", "bf16", "--reduce-dtype", "fp32"]) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert mixed["precision"] == {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    assert plain["precision"] == {"param_dtype": None, "reduce_dtype": None}
    assert mixed["peak_bytes"] * 2 == plain["peak_bytes"]
    assert mixed["t_iter_s"] < plain["t_iter_s"]
    assert main([*args, "--param-dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert "param dtype must be one of" in err and "Traceback" not in err


def test_simulate_fsdp_and_hsdp_rows_take_the_dtypes(capsys):
    args = ["simulate", "--trace", "gpt2-tiny-cpu-b16", "--nodes", "8", "--network", "10gbe", "--schedules",
            "fsdp:per-block,hsdp:whole:2", "--max-depth", "0"]  # fmt: skip
    assert main([*args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--json", "--param-dtype", "bf16", "--reduce-dtype", "fp32"]) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert [r["schedule"] for r in mixed] == ["fsdp:per-block", "hsdp:whole:2"]
    for p, m in zip(plain, mixed, strict=True):
        assert m["memory_bytes"] * 2 == p["memory_bytes"] > 0  # gathered and held in bf16
        assert m["t_iter_s"] < p["t_iter_s"]  # gathers of half the bytes, reductions of all of them
    assert main([*args, "--param-dtype", "bf16"]) == 0
    assert "FSDP2 mixed precision: param_dtype bf16" in capsys.readouterr().out
    bad_ones = [
        (["--param-dtype", "int8"], "param dtype must be one of"),
        (["--schedules", "mgwfbp", "--param-dtype", "bf16"], "name an fsdp: or hsdp: schedule"),
    ]
    for bad, said in bad_ones:
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


def test_shards_bound_counts_the_gathered_bytes_in_param_dtype():
    """``as_run`` (``shard``'s plan as FSDP2 runs it, and its peak bound) under a bf16 policy: the bound,
    the tied unit FSDP2 keeps unsharded included, is half the fp32 one."""
    import torch

    from dpcomm.fsdp.bound import as_run
    from dpcomm.fsdp.groups import shard_groups
    from dpcomm.models import get_model
    from dpcomm.trace.units import gradient_units

    torch.manual_seed(0)
    model = get_model("gpt2-tiny")
    units = gradient_units(model, torch.randint(0, 256, (2, 16)))
    layers = [u.param_names for u in units]
    size = {n: p.numel() for n, p in model.named_parameters()}
    tr = Trace(model="gpt2-tiny", batch_size=2, device="cpu", dtype_bytes=4, layers=tuple(
        Layer(name=u.name, params=sum(size[n] for n in u.param_names), forward_s=1e-4, backward_s=2e-4,
              param_names=tuple(u.param_names)) for u in units
    ))  # fmt: skip
    cost = LinearCost(1e-4, 8e-9)
    bf16 = Precision(param_dtype="bf16", reduce_dtype="fp32")
    plan = plan_fsdp("per-block", tr, cost, cost, depth=1, reshard=True, overlap="gathers", precision=bf16)
    groups = shard_groups(model, plan, layers)
    assert groups.spanning  # the embedding's unit, tied to lm_head
    bound = as_run(model, plan, groups, layers, tr, cost, cost, None, bf16)[1]
    bound32 = as_run(model, plan, groups, layers, tr, cost, cost)[1]
    assert 2 * bound == bound32 > 2 * plan.peak_bytes  # the bf16 peak and the tied unit, in bf16
