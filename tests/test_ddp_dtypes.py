"""A plan over parameters of mixed dtypes as DDP buckets (:mod:`dpcomm.ddp.dtypes`), checked against the
bucket assignment torch's reducer itself computes (``torch.distributed._compute_bucket_assignment_by_size``,
the C++ function DDP calls at construction and when it rebuilds its buckets)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.ddp.dtypes import split_by_dtype

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _ddp_buckets(
    walk: list[str], dtype: dict[str, str], numel: dict[str, int], caps: list[int], rebuild: bool
):
    """The buckets DDP forms with ``caps`` (bytes): walking ``walk`` as its rebuild does (gradient-ready
    order, buckets in the order they close), or at construction (``walk`` is registration order; buckets
    sorted by their first parameter, then reversed into communication order)."""
    tensors = [torch.zeros(numel[n], dtype=DTYPES[dtype[n]]) for n in walk]
    if rebuild:
        indices, _ = dist._compute_bucket_assignment_by_size(tensors, caps, [], list(range(len(walk))))
    else:
        indices, _ = dist._compute_bucket_assignment_by_size(tensors, caps)
        indices = indices[::-1]
    return [frozenset(walk[i] for i in b) for b in indices]


@st.composite
def _models(draw):
    """Groups of parameters (communication order), each parameter a dtype and a size, and the walk: the
    groups in order, the parameters inside each in any order."""
    n_groups = draw(st.integers(1, 6))
    groups, dtype, numel = [], {}, {}
    for g in range(n_groups):
        names = [f"g{g}.p{i}" for i in range(draw(st.integers(1, 4)))]
        for n in names:
            dtype[n] = draw(st.sampled_from(sorted(DTYPES)))
            numel[n] = draw(st.integers(1, 40))
        groups.append(names)
    walk = [n for g in groups for n in draw(st.permutations(g))]
    return groups, dtype, numel, walk


@settings(max_examples=150, deadline=None)
@given(_models(), st.booleans(), st.booleans())
def test_ddp_forms_exactly_the_buckets_the_split_says(model, rebuild, exact):
    """Whatever the dtypes, sizes and order: DDP's own assignment under the caps is the split's buckets,
    each one dtype, each kept group the union of its buckets. Not ``exact``: the split is given the
    groups' own order inside each group, DDP walks another."""
    groups, dtype, numel, walk = model
    nbytes = {n: numel[n] * DTYPES[dtype[n]].itemsize for n in numel}
    order = walk if rebuild else walk[::-1]  # construction walks registration order: communication reversed
    told = order if exact else [n for g in (groups if rebuild else groups[::-1]) for n in g]
    split = split_by_dtype(groups, dtype, nbytes, told, exact_order=exact)
    got = _ddp_buckets(order, dtype, numel, split.caps, rebuild)
    assert sorted(got, key=sorted) == sorted(map(frozenset, split.buckets), key=sorted)
    assert all(len({dtype[n] for n in b}) == 1 for b in split.buckets)
    assert sum(split.sizes) == len(groups) and len(split.sizes) + len(split.dropped) == len(groups)
    kept, at = [], 0
    for k in split.sizes:
        kept.append({n for g in groups[at : at + k] for n in g})
        at += k
    by_group = [frozenset().union(*(set(b) for b in split.buckets if set(b) <= g)) for g in kept]
    assert by_group == [frozenset(g) for g in kept]


def test_one_dtype_keeps_every_cut_with_its_exact_bytes():
    groups = [["a.w", "a.b"], ["b.w"], ["c.w", "c.b"]]
    dtype = dict.fromkeys(["a.w", "a.b", "b.w", "c.w", "c.b"], "float32")
    nbytes = {"a.w": 64, "a.b": 16, "b.w": 32, "c.w": 128, "c.b": 8}
    split = split_by_dtype(groups, dtype, nbytes, [n for g in groups for n in g])
    assert split.sizes == [1, 1, 1] and split.dropped == () and split.caps == [80, 32, 136]


def test_a_cut_no_cap_can_make_is_dropped_and_said():
    """bf16 ``a`` closes bf16's bucket 0 only under a cap in (60, 100] bytes; fp32 ``b``, fp32's bucket 0,
    only under one in (0, 40]: no cap does both, so ``b`` joins the next group, and again (``c`` is bf16),
    until the walk's end closes fp32's bucket 0 whatever its cap."""
    groups = [["a1", "a2"], ["b"], ["c"], ["d"]]
    dtype = {"a1": "bfloat16", "a2": "bfloat16", "b": "float32", "c": "bfloat16", "d": "float32"}
    nbytes = {"a1": 60, "a2": 40, "b": 40, "c": 60, "d": 200}
    walk = ["a1", "a2", "b", "c", "d"]
    split = split_by_dtype(groups, dtype, nbytes, walk)
    assert split.dropped == (1, 2) and split.sizes == [1, 3] and split.caps == [100, 60]
    assert split.buckets == (("a1", "a2"), ("c",), ("b", "d"))
    numel = {n: b // DTYPES[dtype[n]].itemsize for n, b in nbytes.items()}
    assert _ddp_buckets(walk, dtype, numel, split.caps, True) == [{"a1", "a2"}, {"c"}, {"b", "d"}]


def test_handed_buckets_need_no_cap():
    """A DDP that never rebuilds is handed the buckets (walk ``None``): every cut is kept."""
    groups = [["a"], ["b"], ["c", "d"]]
    dtype = {"a": "bfloat16", "b": "float32", "c": "bfloat16", "d": "float32"}
    split = split_by_dtype(groups, dtype, {"a": 100, "b": 40, "c": 60, "d": 200}, None)
    assert split.dropped == () and split.buckets == (("a",), ("b",), ("c",), ("d",))


def test_the_planner_sees_each_units_gradient_bytes_in_its_own_dtype():
    """bf16 linears and fp32 norms: each unit is priced at its gradients' bytes (DDP all-reduces bf16
    gradients as bf16), not at the first parameter's element size times the parameter count."""
    from dpcomm.ddp.planning import sizes_trace
    from dpcomm.trace.units import gradient_units, unit_params
    from tests._corpus import MixedDtypes, _vectors

    torch.manual_seed(0)
    model = MixedDtypes()
    units = gradient_units(model, _vectors(0)[0])
    trace = sizes_trace(model, units, "mixed")
    want = [sum(p.numel() * p.element_size() for p in ps) for ps in unit_params(model, units)]
    assert [trace.layer_bytes(i) for i in range(len(units))] == want
    assert len({p.dtype for p in model.parameters()}) == 2


def test_bucket_caps_drops_a_cut_no_cap_can_make_and_says_why():
    """A bf16 linear after a fp32 norm, no example (the units' own order assumed, so any parameter may be a
    bucket's last): bf16's bucket 0 (``out``, 8,320 bytes) needs a cap above 8,192, fp32's (``norm``, 512)
    one of at most 512. The cut between them is dropped in one line naming dtypes; DDP's own assignment
    under the caps, walking in any order inside the units, forms the buckets the caps say."""
    from torch import nn

    from dpcomm.ddp import bucket_caps
    from dpcomm.plan import Plan

    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 64))
    model[0].bfloat16(), model[2].bfloat16()
    caps = bucket_caps(Plan.from_sizes("wfbp", [1, 1, 1], 3), model, warn=False)
    assert caps.plan.groups == ((2,), (0, 1)) and caps.dropped == (1,)
    assert "mix dtypes" in caps.note and "running 2 buckets instead of 3" in caps.note, caps.note
    assert caps.param_groups == (("2.weight", "2.bias"), ("1.weight", "1.bias"), ("0.weight", "0.bias"))
    params = dict(model.named_parameters())
    walk = ["2.bias", "2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]  # another order inside each
    tensors = [torch.zeros_like(params[n]).flatten() for n in walk]
    limits = [round(c * 2**20) for c in caps.bucket_cap_mb_list]
    got, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [], list(range(len(walk))))
    assert sorted(sorted(walk[i] for i in b) for b in got) == sorted(map(sorted, caps.param_groups))
