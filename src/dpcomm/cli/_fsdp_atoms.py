"""The runs of a trace's layers that one ``fully_shard`` call must take whole, for ``dpcomm plan --fsdp``.

``dpcomm profile`` records per layer its ``fsdp_modules`` (:func:`dpcomm.fsdp.groups.layer_holders`): the
modules ``dpcomm.fsdp.shard`` gives the layer's parameters to (the nearest module whose forward runs and
returns no view: a block's ``nn.Linear`` on a 3-D input hands its parameters to the block). FSDP2 shards
whole modules, so a unit that splits one of them is merged by ``shard``
(:func:`dpcomm.fsdp.groups.shard_groups`, point 2), and a plan printed with it split is code ``shard`` does
not run as planned (an ALBERT-style block applied N times, its children split across units). The CLI plans
over the *atoms* instead: the layers of one such module, and of the modules it contains, are one layer.
"""

from __future__ import annotations

from dpcomm.trace.format import Trace

__all__ = ["fsdp_atoms", "holders", "on_atoms"]


def _prefixes(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def holders(trace: Trace) -> list[list[str]] | None:
    """Each layer's ``fsdp_modules`` (``dpcomm profile`` of a model), None where a layer lacks them."""
    held = [x.extra.get("fsdp_modules") for x in trace.layers]
    ok = all(isinstance(h, list) and h and all(isinstance(m, str) for m in h) for h in held)
    return held if ok else None


def fsdp_atoms(trace: Trace) -> list[tuple[int, int]] | None:
    """The runs of consecutive layers one ``fully_shard`` call must take whole: a module ``shard`` gives
    parameters of layers ``i < j`` (its ``fsdp_modules``), or contains such a module, joins ``i..j`` (FSDP2
    shards whole modules; :func:`dpcomm.fsdp.groups.shard_groups` merges them the same way). None when the
    trace does not record ``fsdp_modules``."""
    from dpcomm.fsdp.groups import merge_units

    held = holders(trace)
    if held is None:
        return None
    every = {m for hs in held for m in hs}
    span: dict[str, list[int]] = {}
    for i, hs in enumerate(held):
        for h in hs:  # the module, and every non-root module above it that holds parameters too
            for p in [""] if not h else [q for q in _prefixes(h)[1:] if q in every]:
                span.setdefault(p, [i, i])[1] = i
    singles = [(i, i) for i in range(trace.num_layers)]
    return merge_units(singles, [tuple(ab) for ab in span.values()])


def on_atoms(trace: Trace, atoms: list[tuple[int, int]]) -> Trace:
    """``trace`` with each atom's layers as one layer (times, parameters and names summed in order)."""
    from dataclasses import replace

    layers = []
    for a, z in atoms:
        run = trace.layers[a : z + 1]
        layers.append(replace(
            run[0], params=sum(x.params for x in run), forward_s=sum(x.forward_s for x in run),
            backward_s=sum(x.backward_s for x in run),
            param_names=tuple(n for x in run for n in x.param_names), unused=all(x.unused for x in run),
            extra={"fsdp_modules": list(dict.fromkeys(m for x in run for m in x.extra["fsdp_modules"]))},
        ))  # fmt: skip
    return replace(trace, layers=tuple(layers))
