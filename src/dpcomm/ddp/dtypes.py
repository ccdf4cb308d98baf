"""A plan as DDP buckets for a model whose parameters mix dtypes (bf16 linears and fp32 norms, say).

DDP's reducer holds one flat gradient tensor per bucket, so a bucket has one dtype: torch 2.13's
``compute_bucket_assignment_by_size`` (``torch/csrc/distributed/c10d/reducer.cpp``, which both the
construction-time assignment and the rebuild after the first backward call) keeps one open bucket *per
(dtype, device)* as it walks the parameters, and one position in ``bucket_cap_mb_list`` per dtype: the
``k``-th bucket of every dtype closes as soon as it holds ``>=`` cap ``k`` (the last cap repeats), whatever
the other dtypes did. What is still open at the end of the walk becomes a bucket each.

So a plan's group becomes one bucket per dtype it holds (those parameters of the group), and DDP forms
them when, for every ``k``, one cap lies in every dtype's window for its ``k``-th bucket: above the bytes
the bucket holds before its last parameter in DDP's walk, at most the bytes it holds in all (a last bucket,
closed by the walk's end, has no upper bound). Where two dtypes' windows at one ``k`` do not meet, the cut
that closes the later of them is dropped (the group merges with the next one) and the caps are fitted
again; with no cut left every dtype's buckets are its last and fit, so the search ends.

A DDP that never rebuilds (``find_unused_parameters=True``, built by :func:`dpcomm.ddp.buckets.build_ddp`)
is handed the buckets themselves: no cap, no cut dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from dpcomm.plan import Plan

__all__ = ["WHY", "DtypeSplit", "split_by_dtype", "split_plan"]


WHY = (
    "the parameters mix dtypes: DDP keeps a bucket per dtype and gives the k-th bucket of every dtype "
    "the same cap, and no one cap closes each dtype's bucket there"
)


def split_plan(
    model: nn.Module,
    runs: Plan,
    groups: tuple[tuple[str, ...], ...],
    walk: str,
    walked: list[str],
    exact: bool,
) -> tuple[Plan, tuple[int, ...], tuple[tuple[str, ...], ...], list[float]]:
    """``runs`` (its groups' parameter names ``groups``) as one-dtype buckets (module docstring): the plan
    DDP runs, the cuts dropped for the caps (as :attr:`dpcomm.ddp.BucketCaps.dropped`: the unit after each),
    the buckets' parameter names (communication order) and the caps in MiB (``bucket_cap_mb_list``).
    ``walk`` and ``walked``: :func:`dpcomm.ddp.buckets.ddp_walk`'s, by name; ``exact``: ``walked``'s order
    inside a unit is DDP's."""
    params = dict(model.named_parameters())
    dtype = {n: str(params[n].dtype).removeprefix("torch.") for g in groups for n in g}
    nbytes = {n: params[n].numel() * params[n].element_size() for g in groups for n in g}
    order = None if walk == "assigned" else walked[::-1] if walk == "registration" else walked
    split = split_by_dtype([list(g) for g in groups], dtype, nbytes, order, exact_order=exact)
    if split.dropped:
        sizes, at = [], 0
        for n in split.sizes:
            sizes.append(sum(len(g) for g in runs.groups[at : at + n]))
            at += n
        meta = {**runs.meta, "ddp_from": runs.meta.get("ddp_from", runs.schedule)}
        dropped = tuple(runs.groups[i][0] for i in split.dropped)
        runs = Plan.from_sizes(runs.schedule, sizes, runs.num_layers, **meta)
    else:
        dropped = ()
    return runs, dropped, split.buckets, [b / 2**20 for b in split.caps]  # exact: int(mb * 2**20) is b


@dataclass(frozen=True, slots=True, kw_only=True)
class DtypeSplit:
    """A plan's groups as one-dtype DDP buckets."""

    sizes: list[int]
    """Requested groups per kept group, communication order."""
    dropped: tuple[int, ...]
    """Cuts dropped for the caps, each as the index of the requested group before it (communication
    order)."""
    buckets: tuple[tuple[str, ...], ...]
    """Parameter names per bucket, communication order: each kept group's, one bucket per dtype."""
    caps: list[int]
    """``bucket_cap_mb_list`` in bytes: cap ``k`` for the ``k``-th bucket of every dtype in DDP's walk."""


def split_by_dtype(
    groups: list[list[str]],
    dtype: dict[str, str],
    nbytes: dict[str, int],
    walk: list[str] | None,
    *,
    exact_order: bool = True,
) -> DtypeSplit:
    """``groups`` (parameter names per group, communication order, each group contiguous in ``walk``) as
    one-dtype buckets and the caps that make DDP form them (module docstring). ``walk``: the parameters in
    the order DDP's reducer walks them (``None``: DDP is handed the buckets, no caps needed).
    ``exact_order``: ``walk``'s order inside a group is the one DDP will see; if not, every parameter of a
    bucket is taken as possibly its last (the window narrows to what holds for any order)."""
    sizes = [1] * len(groups)
    dropped: list[int] = []
    while True:
        merged = _merge(groups, sizes)
        if walk is None:
            caps = [sum(nbytes[n] for n in b) for g in merged for b in _by_dtype(g, dtype)]
            break
        position = {n: i for i, n in enumerate(walk)}
        met = sorted(range(len(merged)), key=lambda j: min(position[n] for n in merged[j]))  # walk order
        fitted = _fit([sorted(merged[j], key=position.__getitem__) for j in met], dtype, nbytes, exact_order)
        if isinstance(fitted, list):
            caps = fitted
            break
        other = fitted + 1 if fitted + 1 < len(met) else fitted - 1  # the walk's last run: the one before
        k = min(met[fitted], met[other])  # walk neighbours are neighbours in communication order
        dropped.append(sum(sizes[: k + 1]) - 1)  # the requested group before the cut
        sizes[k : k + 2] = [sizes[k] + sizes[k + 1]]
    buckets = [_by_dtype(g, dtype) for g in _merge(groups, sizes)]
    if walk is not None:  # a group's buckets in the order DDP closes them: at each one's last parameter
        position = {n: i for i, n in enumerate(walk)}
        buckets = [sorted(g, key=lambda b: max(position[n] for n in b)) for g in buckets]
    return DtypeSplit(
        sizes=sizes, dropped=tuple(sorted(dropped)), buckets=tuple(b for g in buckets for b in g), caps=caps
    )


def _merge(groups: list[list[str]], sizes: list[int]) -> list[list[str]]:
    out, at = [], 0
    for n in sizes:
        out.append([p for g in groups[at : at + n] for p in g])
        at += n
    return out


def _by_dtype(names: list[str], dtype: dict[str, str]) -> list[tuple[str, ...]]:
    """``names`` split by dtype, in order of each dtype's first parameter."""
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(dtype[n], []).append(n)
    return [tuple(v) for v in out.values()]


def _fit(
    runs: list[list[str]], dtype: dict[str, str], nbytes: dict[str, int], exact: bool
) -> list[int] | int:
    """Caps (bytes, DDP's walk order) under which DDP's per-dtype walk closes each of ``runs`` (groups in walk
    order, names in walk order) at its end, or the index of the first run whose cut no cap can make."""
    lo: list[float] = []  # per cap k: every window's lower (open) bound ...
    hi: list[float] = []  # ... and upper (closed) bound
    top: list[int] = []  # the largest bucket at k (a cap for windows without upper bound)
    count: dict[str, int] = {}
    for j, run in enumerate(runs):
        per: dict[str, list[int]] = {}
        for n in run:
            per.setdefault(dtype[n], []).append(nbytes[n])
        windows = []
        for d, bs in per.items():
            k, total = count.get(d, 0), sum(bs)
            last = bs[-1] if exact else min(bs)
            windows.append((k, total - last, math.inf if j == len(runs) - 1 else total, total))
        trial = {}
        for k, a, b, total in windows:
            have = trial.get(k) or ((lo[k], hi[k], top[k]) if k < len(lo) else (-1.0, math.inf, 0))
            trial[k] = (max(have[0], a), min(have[1], b), max(have[2], total))
            if trial[k][0] >= trial[k][1] or (total == 0 and j < len(runs) - 1):  # no cap, or an empty
                return j  # bucket (a zero cap closes nothing): no cut here
        for k, window in trial.items():
            if k == len(lo):
                lo.append(0.0), hi.append(0.0), top.append(0)
            lo[k], hi[k], top[k] = window
        for d in per:
            count[d] = count.get(d, 0) + 1
    caps = []
    for a, b, t in zip(lo, hi, top, strict=True):
        cap = int(b) if math.isfinite(b) else t  # a finite window closes at its upper bound, exact bytes
        if not a < cap:
            cap = int(a) + 1
        caps.append(cap)
    return caps
