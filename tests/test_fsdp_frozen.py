"""Modules holding only frozen parameters are FSDP units (issue 54, item 6).

A frozen stem and backbone (``nn.Linear(64, 64)``: 16,640 bytes each) beside a trained head (520 bytes) used
to stay in the root call, whole on every rank (33,800 bytes unsharded): ``shard(..., memory=20000)``
refused. Now each frozen-only module is a layer of its own (:func:`dpcomm.fsdp.frozen.frozen_holders`,
placed in forward order by :func:`dpcomm.fsdp.frozen.with_frozen`), planned and sharded like the others,
and the bound counts it as FSDP2 runs it: gathered in forward, and in backward only where a prefetch gathers
it (its output needs no gradient: FSDP2 registers no backward hook for it), then kept until backward ends
(:func:`dpcomm.fsdp.bound.peak_as_run`).

Fast tier: the frozen layers, the sweep, and ``shard`` on a one-rank gloo group. On 2 gloo workers, each
rank its own batch, the model (``tests._corpus``'s ``frozen-stem``) trains through ``shard`` (``optimal``
and ``per-block`` under 20,000 bytes) as under plain DDP, and the bytes a forward holds unsharded (frozen
parameters included) are within the bound, within the budget: tests/test_user_models.py.
"""

from __future__ import annotations

import itertools
import random

import torch
from torch import nn

from dpcomm.fsdp import frozen as G
from dpcomm.fsdp.bound import peak_as_run
from dpcomm.planner.fsdp import peak_memory
from tests._corpus import StemBackboneHead

BUDGET = 20000
STEPS = 3
LR = 0.1


class _Adapter(nn.Module):
    """A frozen linear under a module holding a trainable parameter (LoRA's way): not a layer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(4, 4).requires_grad_(False)
        self.a = nn.Parameter(torch.zeros(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a


def test_frozen_only_modules_are_layers_and_the_rest_as_before():
    assert G.frozen_holders(StemBackboneHead()) == [
        (["stem"], ["stem.weight", "stem.bias"]),
        (["backbone"], ["backbone.weight", "backbone.bias"]),
    ]
    m = nn.Sequential(_Adapter(), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).requires_grad_(False))
    assert G.frozen_holders(m) == [
        (["1.0"], ["1.0.weight", "1.0.bias"]),
        (["1.1"], ["1.1.weight", "1.1.bias"]),
    ]
    tied = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)}).requires_grad_(False)
    tied.b.weight = tied.a.weight  # one frozen parameter held by two modules: one layer
    assert G.frozen_holders(tied) == [(["a", "b"], ["a.weight", "a.bias", "b.bias"])]
    model = StemBackboneHead()
    G.HELD_OUT.update({id(model.stem.weight), id(model.stem.bias)})  # FSDP2's ignored_params: in no layer
    try:
        assert [paths for paths, _ in G.frozen_holders(model)] == [["backbone"]]
    finally:
        G.HELD_OUT.clear()


def test_the_sweep_is_the_models_without_frozen_units():
    rng = random.Random(0)
    for _ in range(200):
        L = rng.randint(1, 7)
        cuts = sorted(rng.sample(range(1, L), rng.randint(0, L - 1))) if L > 1 else []
        units = [(a, b - 1) for a, b in itertools.pairwise([0, *cuts, L])]
        held = [float(rng.randint(1, 100)) for _ in range(L)]
        for depth, reshard in itertools.product(range(3), (True, False)):
            want = peak_memory(units, held, depth=depth, reshard=reshard)
            assert peak_as_run(units, held, depth=depth, reshard=reshard) == want


def test_a_frozen_unit_without_backward_is_held_from_its_prefetch_to_the_end():
    units, held = [(0, 0), (1, 1), (2, 2)], [16640, 16640, 520]
    # depth 0: the head's backward prefetches the backbone (FSDP2's default), which no hook reshards before
    # the end; the backbone runs no backward hook, so nothing gathers the stem
    assert peak_as_run(units, held, depth=0, reshard=True, silent={0, 1}, kept={0, 1}) == 17160
    # unknown (no example): it might prefetch the stem too
    assert peak_as_run(units, held, depth=0, reshard=True, kept={0, 1}) == 33280
    # the stem alone before the backbone and head: the head's unit prefetches it and keeps it
    assert peak_as_run([(0, 0), (1, 2)], held, depth=0, reshard=True, silent={0}, kept={0}) == 33800


def test_shard_plans_frozen_modules_as_units_within_the_budget(one_rank):
    import dpcomm.fsdp

    for planner in ("optimal", "per-block"):
        model = dpcomm.fsdp.shard(StemBackboneHead(), planner, example=torch.randn(8, 64), memory=BUDGET)
        said = model.dpcomm
        assert said.groups.modules == (("stem",), ("backbone",), ("head",)), str(said)
        assert said.peak_bound_bytes == 17160  # the head, and the backbone its backward prefetches
        assert [bool(x.extra.get("frozen")) for x in said.trace.layers] == [True, True, False]
