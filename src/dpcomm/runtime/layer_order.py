"""The learnable layers of a module in the order its first forward calls them, found with forward pre-hooks.

MG-WFBP numbers layers in forward order (layer 1 first, layer L ready first in backward); a profiled trace
uses the same order, so plan layer ``l`` is trace layer ``l``. Layers are the papers' learnable layers
(:func:`dpcomm.models.learnable_layers`); a layer the first forward does not call goes last. The same
pre-hooks time each layer's forward start while profiling and serve ``lp-alg1``'s layer-wise broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from dpcomm.models.layers import layer_params, learnable_layers

__all__ = ["LayerOrder"]


class LayerOrder:
    """Learnable layers of ``module``; ``on_call(owner)`` runs before each one's forward (owner: its index in
    registration order) until :meth:`drop_hooks`."""

    def __init__(self, module: nn.Module, on_call: Callable[[int], None]):
        self.module = module
        self.owners = learnable_layers(module)
        """``(name, module)`` per learnable layer in registration order."""
        self.layers: list[tuple[str, nn.Module]] | None = None
        """``(name, module)`` per layer in forward order (None before the first forward)."""
        self.order: list[int] = []
        """Owner index per layer (forward order)."""
        self.layer_of_owner: list[int] = []
        self.params_per_layer: list[list[nn.Parameter]] = []
        """Each layer's parameters (a shared parameter in the first layer that uses it)."""

        self._on_call = on_call
        self._hooks: list[Any] = []
        self.add_hooks()

    def add_hooks(self) -> None:
        """(Re-)register the pre-hooks (after :meth:`drop_hooks`, e.g. to profile again); no-op if present."""
        if self._hooks:
            return

        def hook(owner: int) -> Callable[..., None]:
            return lambda _mod, _inputs: self._on_call(owner)

        self._hooks = [mod.register_forward_pre_hook(hook(i)) for i, (_, mod) in enumerate(self.owners)]

    @property
    def known(self) -> bool:
        return self.layers is not None

    def adopt(self, first_call: dict[int, float]) -> None:
        """After the first forward: layers in the order of ``first_call`` (owner -> its first call time)."""
        called = sorted(first_call, key=first_call.__getitem__)
        self.order = called + [i for i in range(len(self.owners)) if i not in first_call]
        self.layers = [self.owners[i] for i in self.order]
        self.layer_of_owner = [0] * len(self.order)
        for layer, owner in enumerate(self.order):
            self.layer_of_owner[owner] = layer
        self.params_per_layer = layer_params(self.module, self.layers)

    def by_layer(self, per_owner: dict[int, Any]) -> list[Any]:
        """``per_owner`` values listed by layer (forward order), None where an owner has none."""
        return [per_owner.get(owner) for owner in self.order]

    def drop_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
