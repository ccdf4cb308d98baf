"""The model zoo (built from torch.nn) and the definition of a learnable layer."""

from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.models.zoo import (
    MODELS,
    ModelSpec,
    count_params,
    example_input,
    get_model,
    input_shape,
    model_info,
    model_names,
    num_classes,
)

__all__ = [
    "layer_params",
    "learnable_layers",
    "MODELS",
    "ModelSpec",
    "count_params",
    "example_input",
    "get_model",
    "input_shape",
    "model_info",
    "model_names",
    "num_classes",
]
