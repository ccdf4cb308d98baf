"""The runs of a trace's layers that one ``fully_shard`` call must take whole, for ``dpcomm plan --fsdp``.

``dpcomm profile`` records per layer its ``fsdp_modules`` (:func:`dpcomm.fsdp.groups.layer_holders`): the
modules ``dpcomm.fsdp.shard`` gives the layer's parameters to (the nearest module whose forward runs and
returns no view: a block's ``nn.Linear`` on a 3-D input hands its parameters to the block). FSDP2 shards
whole modules, so a unit may not split one of them (an ALBERT-style block applied N times, its children
split across units, is no ``fully_shard`` call). The CLI plans over the *atoms* instead
(:mod:`dpcomm.planner.fsdp_atoms`, as ``shard`` does): the layers of one such module, and of the modules it
contains, are one layer.
"""

from __future__ import annotations

from dpcomm.trace.format import Trace

__all__ = ["fsdp_atoms", "holders", "on_atoms", "planned_on"]


def holders(trace: Trace) -> list[list[str]] | None:
    """Each layer's ``fsdp_modules`` (``dpcomm profile`` of a model), None where a layer lacks them."""
    held = [x.extra.get("fsdp_modules") for x in trace.layers]
    ok = all(isinstance(h, list) and h and all(isinstance(m, str) for m in h) for h in held)
    return held if ok else None


def fsdp_atoms(trace: Trace) -> list[tuple[int, int]] | None:
    """The runs of consecutive layers one ``fully_shard`` call must take whole
    (:func:`dpcomm.planner.fsdp_atoms.holder_atoms` of the layers' ``fsdp_modules``: the rule ``shard``
    plans by; without them, of the modules their ``param_names`` belong to, which cannot know a module
    whose output is a view). None when the trace records neither, or when no run joins two layers."""
    from dpcomm.planner.fsdp_atoms import holder_atoms

    held = holders(trace)
    if held is None and trace.layers and all(x.param_names for x in trace.layers):
        held = [list(dict.fromkeys(n.rpartition(".")[0] for n in x.param_names)) for x in trace.layers]
    atoms = None if held is None else holder_atoms(held)
    return None if atoms is None or len(atoms) == trace.num_layers else atoms


def on_atoms(trace: Trace, atoms: list[tuple[int, int]]) -> Trace:
    """``trace`` with each atom's layers as one layer (times, parameters and names summed in order)."""
    from dataclasses import replace

    layers = []
    for a, z in atoms:
        run = trace.layers[a : z + 1]
        held = list(dict.fromkeys(m for x in run for m in x.extra.get("fsdp_modules", [])))
        layers.append(replace(
            run[0], params=sum(x.params for x in run), forward_s=sum(x.forward_s for x in run),
            backward_s=sum(x.backward_s for x in run),
            param_names=tuple(n for x in run for n in x.param_names), unused=all(x.unused for x in run),
            extra={"fsdp_modules": held} if held else {},
        ))  # fmt: skip
    return replace(trace, layers=tuple(layers))


def planned_on(trace: Trace) -> tuple[Trace, list[tuple[int, int]] | None]:
    """The trace the CLI plans FSDP units on (``trace`` with each atom one layer) and the atoms (None:
    every layer is its own, and the trace is ``trace``)."""
    atoms = fsdp_atoms(trace)
    return (trace if atoms is None else on_atoms(trace, atoms)), atoms
