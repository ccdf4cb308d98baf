"""The model zoo (built from torch.nn: CNNs, and GPT-2, BERT, ViT and Llama-style transformers) and the
definition of a learnable layer."""

from dpcomm.models.layers import layer_params, learnable_layers
from dpcomm.models.zoo import (
    MODELS,
    ModelSpec,
    count_params,
    describe_input,
    example_input,
    get_model,
    input_shape,
    input_vocab,
    model_info,
    model_names,
    num_classes,
    per_token_targets,
)

__all__ = [
    "layer_params",
    "learnable_layers",
    "MODELS",
    "ModelSpec",
    "count_params",
    "describe_input",
    "example_input",
    "get_model",
    "input_shape",
    "input_vocab",
    "model_info",
    "model_names",
    "num_classes",
    "per_token_targets",
]
