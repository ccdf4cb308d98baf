"""Gradient units (``dpcomm.trace.units``), the ``dpcomm-trace/2`` format that carries them, and how
``bucket_caps`` walks them for DDP: one process, no workers (the DDP runs are in ``tests/test_ddp.py``).

Budget: ~5 s.
"""

from __future__ import annotations

import pytest
import torch

from dpcomm.ddp import bucket_caps
from dpcomm.ddp.buckets import ddp_walk, model_units
from dpcomm.errors import UserError
from dpcomm.models import example_input, get_model, learnable_layers
from dpcomm.plan import Plan
from dpcomm.trace import load_trace, save_trace
from dpcomm.trace.format import TRACE_FORMAT, Layer, Trace, trace_from_dict
from dpcomm.trace.profiler import profile
from dpcomm.trace.units import gradient_units, ready_sequence, unit_params, units_from_ready
from tests._ddp_workers import HandGPT, SplitUse


@pytest.fixture(scope="module")
def hand():
    torch.manual_seed(0)
    return HandGPT(), torch.randint(0, 32, (2, 8))


def test_units_of_a_hand_written_gpt(hand):
    model, x = hand
    units = gradient_units(model, x)
    assert [u.name for u in units] == [
        "tok", "pos", "attn", "attn.out_proj", "ln_2", "mlp.0", "mlp.2", "ln_f", "cls_head"
    ]  # fmt: skip
    # the tied weight once, by its first name, at its last ready point (unit 0: ready last, after the
    # embedding's backward, though lm_head's half of its gradient is the first one computed)
    assert units[0].param_names == ("tok.weight",)
    names = [n for u in units for n in u.param_names]
    assert "lm_head.weight" not in names and len(names) == len(set(names))
    assert not any(n.startswith("ln_1.") for n in names)  # frozen: left out
    assert [u.unused for u in units] == [False] * 8 + [True]  # unused: its own unit, ready first
    assert sorted(units[-1].param_names) == ["cls_head.bias", "cls_head.weight"]
    # nn.MultiheadAttention owns in_proj_*, its child out_proj is ready before it: two units, ready order
    assert set(units[2].param_names) == {"attn.in_proj_weight", "attn.in_proj_bias"}
    ready = ready_sequence(model, x)
    at = {pid: k for k, pid in enumerate(ready)}
    for u in range(1, 8):  # every parameter of a unit is ready before every parameter of an earlier unit
        later = [at[id(p)] for p in unit_params(model, [units[u]])[0]]
        earlier = [at[id(p)] for v in range(u) for p in unit_params(model, [units[v]])[0]]
        assert max(later) < min(earlier)


def test_a_module_ready_at_two_times_is_two_units():
    model = SplitUse()
    units = gradient_units(model, torch.randn(2, 8))
    assert [u.name for u in units] == ["SplitUse[pre]", "a", "b", "SplitUse[post]", "c"]
    assert {u.module for u in units} == {"SplitUse", "a", "b", "c"}


def test_the_units_of_cnns_are_their_learnable_layers():
    for name in ("resnet20",):  # residual adds: ready order still the reverse layer order
        model, x = get_model(name), example_input(name, 2)
        assert [u.name for u in gradient_units(model, x)] == [n for n, _ in learnable_layers(model, x)]


def test_units_from_a_given_ready_order_are_runs_of_one_owner(hand):
    model, _ = hand
    p = dict(model.named_parameters())
    ready = [id(p[n]) for n in ("mlp.2.weight", "ln_f.bias", "mlp.2.bias", "tok.weight")]  # mlp.2 split
    units = units_from_ready(model, ready)
    used = [u.name for u in units if not u.unused]
    assert used == ["tok", "mlp.2[bias]", "ln_f[bias]", "mlp.2[weight]"]
    assert all(u.unused for u in units[len(used) :])


def test_profile_writes_a_v2_trace_of_units(tmp_path, hand):
    model, x = hand
    trace = profile(model, x, iters=2, warmup=1, timer="thread")
    assert trace.has_units and trace.num_layers == 9
    assert trace.layers[-1].unused and trace.layers[-1].backward_s == 0.0
    assert all(layer.backward_s > 0 for layer in trace.layers[:-1])
    assert trace.total_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trace.to_dict()["format"] == TRACE_FORMAT == "dpcomm-trace/2"
    path = save_trace(trace, tmp_path / "t.json")
    assert load_trace(path) == trace
    assert model_units(model, trace=trace) == [
        type(u)(name=u.name, module=u.name, param_names=u.param_names, unused=u.unused)
        for u in gradient_units(model, x)
    ]


def test_v1_traces_are_read_and_written_as_they_were():
    v1 = {
        "format": "dpcomm-trace/1", "model": "m", "batch_size": 2, "device": "cpu", "dtype_bytes": 4,
        "layers": [{"name": "a", "params": 3, "forward_s": 0.1, "backward_s": 0.2, "param_names": "kept"}],
    }  # fmt: skip
    trace = trace_from_dict(v1)
    assert not trace.has_units and trace.layers[0].extra == {"param_names": "kept"}  # /1: an extra field
    assert trace.to_dict() == v1


@pytest.mark.parametrize(
    ("layers", "field"),
    [
        ([{"param_names": ["w"]}, {"param_names": ["w"]}], "repeats"),
        ([{"param_names": "w"}, {}], "param_names"),
        ([{"param_names": [""]}, {}], "param_names"),
        ([{"unused": 1}, {}], "unused"),
    ],
)
def test_v2_fields_are_checked(layers, field):
    rows = [
        {"name": f"l{i}", "params": 1, "forward_s": 0, "backward_s": 0, **x} for i, x in enumerate(layers)
    ]
    obj = {"format": "dpcomm-trace/2", "model": "m", "batch_size": 1, "device": "cpu", "dtype_bytes": 4}
    with pytest.raises(UserError, match=field):
        trace_from_dict({**obj, "layers": rows})


def test_bucket_caps_follow_the_walk_ddp_cuts_in(hand):
    model, x = hand
    units = gradient_units(model, x)
    nbytes = [4 * sum(p.numel() for p in ps) for ps in unit_params(model, units)]
    plan = Plan.from_sizes("x", [1, 2, 3, 3], len(units))
    expect = [sum(nbytes[u] for u in g) / 2**20 for g in plan.groups]
    reg = bucket_caps(plan, model, example=x, find_unused_parameters=True)
    assert reg.walk == "registration" and reg.exact and reg.bucket_cap_mb_list == expect[::-1]
    walk, order = ddp_walk(model, units, find_unused_parameters=True)
    assert walk == "registration" and order[0] == 8 and order[-1] == 0  # cls_head registered last, tok first
    with pytest.warns(UserWarning, match="static_graph=True: DDP's rebuilt buckets put the unused"):
        static = bucket_caps(plan, model, example=x, static_graph=True)  # unused last: all groups merge
    assert static.walk == "static" and static.plan.groups == (tuple(range(9)),)


def test_registration_walk_drops_cuts_and_says_why():
    model, x = SplitUse(), torch.randn(2, 8)
    plan = Plan.from_sizes("wfbp", [1] * 5, 5)
    ready = bucket_caps(plan, model, example=x)  # the rebuilt buckets follow the ready order
    expect = [b / 2**20 for b in (144, 32, 288, 288, 32)]  # bytes of c, post, b, a, pre
    assert ready.walk == "ready" and ready.exact and ready.bucket_cap_mb_list == expect
    with pytest.warns(UserWarning, match="find_unused_parameters=True without static_graph"):
        caps = bucket_caps(plan, model, example=x, find_unused_parameters=True)
    assert caps.plan.groups == ((4,), (1, 2, 3), (0,)) and caps.dropped == (3, 2)


def test_a_trace_of_another_model_is_refused(hand):
    model, _ = hand
    other = Trace(
        model="m", batch_size=1, device="cpu", dtype_bytes=4,
        layers=(Layer(name="x", params=1, forward_s=0, backward_s=0, param_names=("nope",)),),
    )  # fmt: skip
    with pytest.raises(UserError, match="units do not match"):
        bucket_caps(Plan.from_sizes("x", [1], 1), model, trace=other)


def _counting_derivations(monkeypatch) -> dict[str, int]:
    """Count every local pass that finds the gradient-ready order (``ready_sequence``) and every list of
    units made from the model (``units_from_ready``, ``layer_units``), wherever dpcomm imported them."""
    import sys

    import dpcomm.trace.units as U

    counts = {"ready_sequence": 0, "units_from_ready": 0, "layer_units": 0}
    for name in counts:
        real = getattr(U, name)

        def spy(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)

        for module in [m for k, m in sys.modules.items() if k.startswith("dpcomm")]:
            for attr, value in list(vars(module).items()):
                if value is real:
                    monkeypatch.setattr(module, attr, spy)
    return counts


def test_one_wrap_and_one_shard_derive_the_models_units_once(one_rank, monkeypatch):
    """Issue 54, finding 8: the units are made once per ``wrap`` (three candidates timed) and once per
    ``shard``, by the one analysis every rank agrees on; profiling, every candidate's buckets, the trial
    and construction read it (before, the profiler ran its own pass and made its own units)."""
    import dpcomm.fsdp
    from dpcomm.ddp import wrap
    from tests._corpus import CORPUS
    from tests._user_workers import _three_candidates

    build, batch_of, _ = CORPUS["sdpa-gpt"]
    for door in ("wrap", "shard"):
        torch.manual_seed(0)
        model, x = build(), batch_of(0)[0]
        with monkeypatch.context() as m:
            counts = _counting_derivations(m)
            if door == "wrap":
                with _three_candidates(True):
                    ddp = wrap(model, "optimal", example=x, profile_iters=1, verify_iters=1,
                               find_unused_parameters=True)  # fmt: skip
                assert ddp.dpcomm.trial and len(ddp.dpcomm.trial) >= 3, ddp.dpcomm.trial
                del ddp
            else:
                dpcomm.fsdp.shard(model, "optimal", example=x, profile_iters=1, verify_iters=1)
        assert counts == {"ready_sequence": 1, "units_from_ready": 1, "layer_units": 0}, (door, counts)
