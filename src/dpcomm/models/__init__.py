"""The model zoo (built from torch.nn) and the definition of a learnable layer."""

from dpcomm.models.layers import layer_params, learnable_layers

__all__ = ["layer_params", "learnable_layers"]
