"""The model zoo: the networks the papers measure, by name, with their input shapes and class counts.

| name          | paper that uses it                  | input        | parameters   |
| ------------- | ----------------------------------- | ------------ | ------------ |
| ``lenet5``    | BML (MNIST)                         | 1x28x28      | 3,274,634    |
| ``alexnet``   | LP, iBatch                          | 3x224x224    | 61,100,840   |
| ``vgg19``     | BML (ImageNet)                      | 3x224x224    | 143,667,240  |
| ``vgg19-22k`` | iBatch / LP (ImageNet-22K labels)   | 3x224x224    | 229,052,817  |
| ``googlenet`` | MG-WFBP (batch 64), LP              | 3x224x224    | 13,004,888   |
| ``inception-v3`` | iBatch                           | 3x299x299    | 27,161,264   |
| ``resnet50``  | MG-WFBP (batch 32), iBatch          | 3x224x224    | 25,557,032   |
| ``resnet20``  | real local training (CIFAR-10)      | 3x32x32      | 269,722      |

Counts include the auxiliary classifiers of GoogLeNet and Inception-V3 (see their modules). Build a model
on the ``meta`` device (``with torch.device("meta"): get_model(name)``) to count or trace it without memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.models.alexnet import AlexNet
from dpcomm.models.googlenet import GoogLeNet
from dpcomm.models.inception import InceptionV3
from dpcomm.models.lenet import LeNet5
from dpcomm.models.resnet import CifarResNet, ResNet
from dpcomm.models.vgg import VGG

__all__ = [
    "ModelSpec",
    "MODELS",
    "model_names",
    "get_model",
    "input_shape",
    "num_classes",
    "example_input",
    "count_params",
    "model_info",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A zoo entry."""

    name: str
    """Zoo name (``resnet50``)."""
    build: Callable[[int], nn.Module]
    """``build(num_classes) -> nn.Module``."""
    input_shape: tuple[int, ...]
    """Per-sample input shape, channels first."""
    num_classes: int
    """Default number of output classes."""
    params: int
    """Published parameter count at ``num_classes`` (checked by the tests)."""
    description: str
    """One line for ``dpcomm models``."""

    def __post_init__(self) -> None:
        if not self.name or self.num_classes < 1 or self.params < 1 or not self.input_shape:
            raise ValueError(f"model spec {self.name!r}: name, classes, params and input shape are required")


_IMAGENET = (3, 224, 224)

MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(name="lenet5", build=lambda c: LeNet5(c), input_shape=(1, 28, 28), num_classes=10,
                  params=3_274_634, description="LeNet-5, BML's MNIST variant (2 conv + 2 fc)"),
        ModelSpec(name="alexnet", build=lambda c: AlexNet(c), input_shape=_IMAGENET, num_classes=1000,
                  params=61_100_840, description="AlexNet, torchvision layout (5 conv + 3 fc)"),
        ModelSpec(name="vgg19", build=lambda c: VGG(num_classes=c), input_shape=_IMAGENET, num_classes=1000,
                  params=143_667_240, description="VGG-19, configuration E (16 conv + 3 fc)"),
        ModelSpec(name="vgg19-22k", build=lambda c: VGG(num_classes=c), input_shape=_IMAGENET,
                  num_classes=21841, params=229_052_817, description="VGG-19, ImageNet-22K's 21841 classes"),
        ModelSpec(name="googlenet", build=lambda c: GoogLeNet(c), input_shape=_IMAGENET, num_classes=1000,
                  params=13_004_888, description="GoogLeNet (Inception-v1) with BN and both aux heads"),
        ModelSpec(name="inception-v3", build=lambda c: InceptionV3(c), input_shape=(3, 299, 299),
                  num_classes=1000, params=27_161_264, description="Inception-V3 with its aux head"),
        ModelSpec(name="resnet50", build=lambda c: ResNet((3, 4, 6, 3), c), input_shape=_IMAGENET,
                  num_classes=1000, params=25_557_032, description="ResNet-50 v1.5, torchvision layout"),
        ModelSpec(name="resnet20", build=lambda c: CifarResNet(3, c), input_shape=(3, 32, 32), num_classes=10,
                  params=269_722, description="ResNet-20 for CIFAR-10 (option-A shortcuts)"),
    )
}  # fmt: skip


def model_names() -> list[str]:
    """Zoo names, in the order of the table above."""
    return list(MODELS)


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UserError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}") from None


def get_model(name: str, num_classes: int | None = None) -> nn.Module:
    """A freshly initialised zoo model in training mode (on torch's current default device)."""
    spec = _spec(name)
    classes = spec.num_classes if num_classes is None else num_classes
    if classes < 1:
        raise UserError(f"num_classes must be >= 1, got {classes}")
    return spec.build(classes)


def input_shape(name: str) -> tuple[int, ...]:
    """Per-sample input shape, e.g. ``(3, 224, 224)``."""
    return _spec(name).input_shape


def num_classes(name: str) -> int:
    return _spec(name).num_classes


def example_input(name: str, batch_size: int, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """A random float32 batch of ``batch_size`` inputs shaped for ``name``."""
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}")
    return torch.randn(batch_size, *input_shape(name), device=device)


def count_params(name: str, num_classes: int | None = None) -> int:
    """Trainable parameters of a zoo model, counted on the meta device (no memory, no initialisation cost)."""
    with torch.device("meta"):
        model = get_model(name, num_classes)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def model_info(name: str) -> dict[str, object]:
    """One row of ``dpcomm models``: name, input shape, classes, learnable layers, parameters, description."""
    from dpcomm.models.layers import learnable_layers

    spec = _spec(name)
    with torch.device("meta"):
        model = spec.build(spec.num_classes)
    layers = learnable_layers(model)
    return {
        "name": spec.name,
        "input_shape": list(spec.input_shape),
        "num_classes": spec.num_classes,
        "learnable_layers": len(layers),
        "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "description": spec.description,
    }
