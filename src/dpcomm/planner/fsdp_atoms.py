"""The atoms of an FSDP plan: runs of consecutive layers that one ``fully_shard`` call must take whole.

FSDP2 shards *modules*: a ``fully_shard`` call manages every parameter under its module that no earlier
call took. So a module whose parameters (those :mod:`dpcomm.fsdp.groups` gives it: its own, and those of
children that cannot be a unit, a ``nn.Linear`` whose output is a view) lie in layers ``i < j`` puts
``i..j`` in one unit, and so does a module holding parameters that *contains* such a module (the call on
the parent would run inside the child's layers). :func:`holder_atoms` joins those runs, before planning:
every planner then plans over atoms (:func:`dpcomm.planner.fsdp.plan_fsdp`'s ``atoms``), so each unit it
returns is one ``fully_shard`` call over modules that run, and ``optimal`` is the optimum over the plans
FSDP2 runs as planned. The holders come from the model (:func:`dpcomm.fsdp.groups.layer_atoms`, in
``dpcomm.fsdp.shard``) or from a trace's ``fsdp_modules`` (``dpcomm plan --fsdp``): the same rule, so the
code the CLI prints is what ``shard`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

__all__ = ["check_atoms", "holder_atoms", "in_modules", "merge_units"]


def merge_units(units: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``units`` with every cut inside a span of unit indices ``(i, j)`` removed (``i..j`` become one)."""
    cut = [True] * max(0, len(units) - 1)  # cut[k]: between unit k and k+1
    for i, j in spans:
        for k in range(min(i, j), max(i, j)):
            cut[k] = False
    out = [units[0]] if units else []
    for k in range(1, len(units)):
        out[-1:] = [out[-1], units[k]] if cut[k - 1] else [(out[-1][0], units[k][1])]
    return out


def _prefixes(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def holder_atoms(held: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """The atoms of layers whose parameters go to the modules ``held[i]`` (module paths, ``""`` the root):
    a module holding parameters of layers ``i < j``, or containing (non-root) such a holder, joins
    ``i..j`` (module docstring). The root joins the layers of its own parameters (those no shardable module
    below it holds) like any module, but not those of the modules it contains: its call is made last and
    takes only what no other call took."""
    every = {m for hs in held for m in hs}
    span: dict[str, list[int]] = {}
    for i, hs in enumerate(held):
        for h in hs:  # the module, and every non-root module above it that holds parameters too
            for p in [""] if not h else [q for q in _prefixes(h) if q in every]:
                span.setdefault(p, [i, i])[1] = i
    singles = [(i, i) for i in range(len(held))]
    return merge_units(singles, [(a, z) for a, z in span.values()])


def check_atoms(atoms: Sequence[tuple[int, int]], L: int) -> list[tuple[int, int]]:
    """``atoms`` as ``(first, last)`` pairs, or a one-line :class:`~dpcomm.errors.UserError` unless they
    cover modules ``0..L-1`` in order, each non-empty."""
    from dpcomm.errors import UserError

    out = [(int(a), int(z)) for a, z in atoms]
    starts = [0, *(z + 1 for _, z in out)]  # where each atom must start, and L after the last
    if not out or [a for a, _ in out] != starts[:-1] or starts[-1] != L or any(z < a for a, z in out):
        raise UserError(f"FSDP atoms {out} do not cover modules 0..{L - 1} in order")
    return out


def in_modules(plan: Any, atoms: Sequence[tuple[int, int]]) -> Any:
    """A plan made over ``atoms`` (one module each) with its units in the modules they are runs of (the
    atoms kept in ``meta["atoms"]``, ``[first, last]`` each)."""
    units = tuple((atoms[a][0], atoms[z][1]) for a, z in plan.units)
    meta = {**plan.meta, "atoms": [[a, z] for a, z in atoms]}
    return replace(plan, num_modules=atoms[-1][1] + 1, units=units, meta=meta)
