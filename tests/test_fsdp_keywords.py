"""FSDP2's own keywords as ``dpcomm.fsdp.shard`` takes them (:mod:`dpcomm.fsdp.keywords`), without workers.

What shard refuses is one line before anything is planned; ignored parameters are held out of planning
and given back; a mixed-precision profile runs the model as FSDP2 will (parameters and floating inputs
cast, buffers not) and leaves it as it was. ``shard`` itself with these keywords on 4 gloo ranks, against
plain ``fully_shard``: tests/test_hsdp.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from dpcomm.errors import UserError
from dpcomm.fsdp import keywords as K


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4), nn.BatchNorm1d(3), nn.Linear(4, 2))


def test_the_keywords_fully_shard_takes_pass():
    m = _model()
    K.check_fsdp_keywords(m, {})
    K.check_fsdp_keywords(
        m,
        {
            "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            "offload_policy": CPUOffloadPolicy(pin_memory=False),
            "ignored_params": {m[3].weight},
            "shard_placement_fn": None,
        },
    )
    K.check_fsdp_keywords(m, {"offload_policy": OffloadPolicy(), "ignored_params": frozenset()})


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"bogus": 1}, "fully_shard takes no keyword 'bogus'; it takes shard_placement_fn, mp_policy"),
        ({"reshard_after_forward": True}, "reshard_after_forward is the plan's choice, not a keyword"),
        (
            {"mp_policy": "bf16"},
            "mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy, got 'bf16'",
        ),
        ({"mp_policy": torch.bfloat16}, "mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy"),
        ({"mp_policy": None}, "mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy, got None"),
        ({"offload_policy": None}, "offload_policy must be an OffloadPolicy, got None"),
        ({"offload_policy": "cpu"}, "offload_policy must be an OffloadPolicy, got 'cpu'"),
        ({"ignored_params": ["w"]}, "ignored_params must be a set of the model's parameters"),
        ({"ignored_params": {nn.Parameter(torch.ones(1))}}, "holds a parameter that is not the model's"),
    ],
)
def test_what_fully_shard_would_refuse_is_one_line(kw, said):
    with pytest.raises(UserError) as err:
        K.check_fsdp_keywords(_model(), kw)
    assert said in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf"), "1ms", True, None])
def test_a_bad_unit_cost_is_one_line(bad):
    with pytest.raises(UserError) as err:
        K.check_unit_s(bad, "optimal")
    assert "unit_s is seconds a unit per pass, a finite number >= 0" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_unit_cost_prices_only_plans_shard_makes():
    from dpcomm.planner.fsdp_model import FsdpPlan

    assert K.check_unit_s(0, "per-layer") == 0.0 and K.check_unit_s(2e-4, "optimal") == 2e-4
    given = FsdpPlan(method="given", num_modules=2, units=((0, 1),), depth=1, reshard_after_forward=True)
    with pytest.raises(UserError, match="a given FsdpPlan runs as it is"):
        K.check_unit_s(1e-4, given)


def test_pinned_offload_without_an_accelerator_is_one_line(monkeypatch):
    """FSDP2 pins the offloaded shards (``CPUOffloadPolicy()``'s default), which raises "Cannot access
    accelerator device" from inside ``fully_shard`` on a machine without one: refused first, with the fix."""
    monkeypatch.setattr(K, "_accelerator", lambda: False)
    with pytest.raises(
        UserError, match=r"pins the offloaded shards.*pass CPUOffloadPolicy\(pin_memory=False\)$"
    ):
        K.check_fsdp_keywords(_model(), {"offload_policy": CPUOffloadPolicy()})
    K.check_fsdp_keywords(_model(), {"offload_policy": CPUOffloadPolicy(pin_memory=False)})
    monkeypatch.setattr(K, "_accelerator", lambda: True)
    K.check_fsdp_keywords(_model(), {"offload_policy": CPUOffloadPolicy()})


def test_ignored_parameters_are_planned_without_and_given_back():
    m = _model()
    m[1].bias.requires_grad_(False)  # the user's own frozen one stays frozen
    ignored = {m[1].weight, m[1].bias}
    with K.planned_without({"ignored_params": ignored}):
        assert not m[1].weight.requires_grad and not m[1].bias.requires_grad
        assert m[3].weight.requires_grad
    assert m[1].weight.requires_grad and not m[1].bias.requires_grad
    with pytest.raises(RuntimeError), K.planned_without({"ignored_params": ignored}):
        raise RuntimeError("planning failed")
    assert m[1].weight.requires_grad
    with K.planned_without({}):
        assert all(p.requires_grad for p in m[3].parameters())


def test_a_profile_under_a_policy_runs_as_fsdp2_and_leaves_the_model_as_it_was():
    """Parameters and floating inputs (the model's and each module's) in bf16, integer inputs and buffers
    as they are (FSDP2 casts neither); after: the same parameter storage and values, the same gradients
    (the tensors themselves), no hook left."""
    m = _model()
    m[3].weight.grad = torch.ones_like(m[3].weight)
    data = [(p.data_ptr(), p.detach().clone()) for p in m.parameters()]
    grads = [p.grad for p in m.parameters()]
    example = {"idx": torch.tensor([1, 2]), "x": torch.ones(2, 4)}
    with K.as_fsdp2_computes(m, example, torch.bfloat16) as cast:
        assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
        assert all(p.grad is None for p in m.parameters())
        assert cast["idx"].dtype == torch.int64 and cast["x"].dtype == torch.bfloat16
        assert m[2].running_mean.dtype == torch.float32
        m[1](cast["x"]).sum().backward()  # a bf16 gradient, as under FSDP2's gathered parameters
        assert m[3](torch.ones(2, 4)).dtype == torch.bfloat16  # a module's fp32 input cast, as a unit's
    kept = [
        p.data_ptr() == ptr and torch.equal(p, d) for p, (ptr, d) in zip(m.parameters(), data, strict=True)
    ]
    assert all(kept)
    assert all(p.grad is g for p, g in zip(m.parameters(), grads, strict=True))
    assert {p.dtype for p in m.parameters()} == {torch.float32}
    assert m[3](torch.ones(2, 4)).dtype == torch.float32  # the hooks gone
    with K.as_fsdp2_computes(m, example, None) as same:
        assert same is example and {p.dtype for p in m.parameters()} == {torch.float32}


class _SelfCasting(nn.Module):
    """A router that casts its classifier in its own forward, as Hugging Face's Switch and NLLB-MoE routers
    do (``self.classifier = self.classifier.to(router_dtype)``), beside a float32 layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.classifier = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(torch.bfloat16)
        return self.classifier(torch.relu(self.inp(x)).bfloat16()).float()


def test_a_model_that_casts_itself_in_forward_is_given_back_as_it_was(one_rank):
    """``shard`` runs the model before sharding it; a module that casts its own parameters in forward must
    not leave them cast (the user's model would change dtype, and a unit mix two: issue 54's tier), and
    its sharded parameters are in the dtype the user built."""
    import dpcomm.fsdp
    from dpcomm.utils.user_run import untouched

    torch.manual_seed(0)
    m = _SelfCasting()
    with untouched(m) as as_given:
        m(torch.ones(2, 4))
        assert m.classifier.weight.dtype == torch.bfloat16
        as_given()
        assert m.classifier.weight.dtype == torch.float32
        m(torch.ones(2, 4))
    assert {p.dtype for p in m.parameters()} == {torch.float32}
    dpcomm.fsdp.shard(m, "per-layer", example=torch.ones(2, 4), profile_iters=1)
    assert {p.dtype for p in m.parameters()} == {torch.float32}


def test_a_plan_fsdp2_cannot_compute_under_the_policy_is_one_line(one_rank):
    """Under ``mp_policy`` FSDP2 casts floating inputs only where a unit starts: a float32 buffer added to a
    bf16 activation inside one unit, then a bf16 norm, fails there though every module ran in the profile
    (where each module holding parameters was cast). ``shard`` runs the model as FSDP2 will and refuses in
    one line; with a unit of its own the norm gets its input cast, and it passes."""
    from dpcomm.fsdp.groups import ROOT

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.norm = nn.Embedding(8, 4), nn.LayerNorm(4)
            self.register_buffer("pos", torch.arange(4.0))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.norm(self.embed(idx) + self.pos)

    torch.manual_seed(0)
    m, idx = Positions(), torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(UserError, match="its inputs cast only where a unit starts") as caught:
        K.check_runs_as_planned(m, idx, torch.bfloat16, [[ROOT]], None, None)
    assert "\n" not in str(caught.value)
    K.check_runs_as_planned(m, idx, torch.bfloat16, [["norm"], [ROOT]], None, None)
    assert {p.dtype for p in m.parameters()} == {torch.float32}
