"""Plans over shardable atoms (issue 48): every unit of every plan of every corpus model is one
``fully_shard`` call over modules that run, as planned.

Fast tier: each model of :mod:`tests._corpus` (and the zoo's GPT-2) is built in this process, its gradient
units found on one batch, its shardable modules and atoms computed (:func:`dpcomm.fsdp.groups.layer_atoms`),
and every planner's plan over the atoms mapped to ``fully_shard`` calls: the calls' units are the plan's,
nothing merged, each call's modules shardable. The same planners over the layers (as the library planned
before atoms) split a module on most of these models, which FSDP2 cannot run as planned. Slow tier (a
process group in this process): ``shard`` on one gloo rank plans over atoms, with no merge in what it says.
"""

from __future__ import annotations

import pytest
import torch

from dpcomm.costmodel.base import LinearCost
from dpcomm.errors import UserError
from dpcomm.fsdp.groups import ROOT, layer_atoms, shard_groups, shardable_modules
from dpcomm.planner.fsdp import Modules, plan_fsdp
from dpcomm.planner.fsdp_unit import UNIT_S_CPU
from dpcomm.trace.units import gradient_units
from dpcomm.utils.user_run import untouched
from tests._corpus import CORPUS, ZOO, loss_of

MODELS = {**CORPUS, **ZOO}
PLANNERS = ("per-block", "whole", "per-layer", "size:1KB", "optimal")
SPLIT_BY_LAYERS = {"encoder", "decoder", "sdpa-gpt", "moe-top2", "tasks", "shared-4", "gpt2-tiny", "switch"}
"""Models whose per-layer plan over the layers splits a module (measured: the library merged them)."""


def _setup(name):
    build, batch, _ = MODELS[name]
    torch.manual_seed(0)
    model = build()
    x, y = batch(0)
    units = gradient_units(model, x, lambda out: loss_of(out, y))
    layers = [u.param_names for u in units]
    with untouched(model):
        shardable = shardable_modules(model, x)
    named = dict(model.named_parameters())
    mods = Modules(
        forward_s=[1e-4 * (1 + i % 3) for i in range(len(units))],
        backward_s=[2e-4 * (1 + i % 3) for i in range(len(units))],
        param_bytes=[sum(named[n].numel() * named[n].element_size() for n in ps) for ps in layers],
        names=[u.name for u in units],
    )
    return model, layers, shardable, mods


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_corpus_plan_is_one_fully_shard_call_per_unit(name):
    model, layers, shardable, mods = _setup(name)
    atoms = layer_atoms(model, layers, shardable)
    cost = LinearCost(1e-4, 1e-9)  # 100 us + 1 ns/B, both collectives
    best = None
    for method in PLANNERS:
        plan = plan_fsdp(method, mods, cost, cost, unit_s=UNIT_S_CPU, atoms=atoms, overlap="gathers")
        groups = shard_groups(model, plan, layers, shardable)
        assert groups.units == plan.units, (method, plan.units)  # one fully_shard call per planned unit
        assert not any("merged" in n for n in groups.notes), groups.notes
        for mods_k in groups.modules:  # each call over modules whose forward runs, returning no view
            assert all(p == ROOT or p in shardable for p in mods_k), (method, mods_k)
        if method == "optimal":
            best = plan
        elif best is not None:
            assert best.time_s <= plan.time_s * (1 + 1e-9)  # optimal over the runnable plans
    for method in PLANNERS[:-1]:  # per-block, whole, per-layer and size were planned before optimal
        other = plan_fsdp(method, mods, cost, cost, unit_s=UNIT_S_CPU, atoms=atoms, overlap="gathers")
        assert best.time_s <= other.time_s * (1 + 1e-9)
    by_layers = plan_fsdp("per-layer", mods, cost, cost, overlap="gathers")
    if name in SPLIT_BY_LAYERS:  # without atoms the plan splits a module: FSDP2 cannot run it as planned
        assert len(atoms) < len(layers)
        with pytest.raises(UserError, match="FSDP2 shards whole modules"):
            shard_groups(model, by_layers, layers, shardable)
    else:
        assert shard_groups(model, by_layers, layers, shardable).units == by_layers.units


@pytest.mark.slow  # a process group in this process
def test_shard_plans_over_atoms_and_merges_nothing(one_rank):
    """The decoder of PyTorch's own ``nn.TransformerDecoderLayer``: its linears return views (they hand their
    parameters to the layer), so a layer is one atom. ``shard`` used to plan per gradient unit and merge
    ("FSDP2 shards whole modules, so they are merged"); now every unit is planned whole."""
    from dpcomm.fsdp import shard

    build, batch, _ = CORPUS["decoder"]
    torch.manual_seed(0)
    model = build()
    x, y = batch(0)
    shard(model, "per-layer", example=x, loss_fn=lambda out: loss_of(out, y), profile_iters=1)
    d = model.dpcomm
    assert d.groups.units == d.plan.units == d.requested.units
    assert len(d.plan.meta["atoms"]) == 4 and d.plan.meta["unit_s"] > 0  # embed, 2 layers, out
    text = str(d)
    assert "merged" not in text and "shards whole modules" not in text, text
    assert list(d.groups.modules) == [("embed",), ("layers.0",), ("layers.1",), ("",)]  # out: a view


@pytest.mark.slow  # a process group in this process
def test_shard_plans_with_the_unit_cost_it_is_given(one_rank):
    """``shard(..., unit_s=)``: the planner's ``c`` is the user's measured cost, not the device's default.
    Free units let ``optimal`` keep the 4 atoms apart; a unit costing a second a pass makes it keep one."""
    from dpcomm.fsdp import shard
    from dpcomm.planner.fsdp_unit import UNIT_S_CPU

    build, batch, _ = CORPUS["decoder"]
    x, y = batch(0)
    units = {}
    for c in (None, 0.0, 1.0):
        torch.manual_seed(0)
        model = build()
        kw = {} if c is None else {"unit_s": c}
        shard(model, "optimal", example=x, loss_fn=lambda out: loss_of(out, y), profile_iters=1, **kw)
        assert model.dpcomm.plan.meta.get("unit_s", 0.0) == (UNIT_S_CPU if c is None else c)
        units[c] = len(model.dpcomm.plan.units)
    assert units[1.0] == 1 and units[0.0] > 1, units
    assert "1000000 us a unit per pass" in str(model.dpcomm)  # what it planned with, said
    verdict = str(model.dpcomm).splitlines()[1]  # one rank: nothing to communicate, FSDP2's units cost
    assert verdict.startswith("  fastest in the model: DDP with the optimal plan, dear within 0.1%"), verdict
    assert "FSDP2 " in verdict, verdict
