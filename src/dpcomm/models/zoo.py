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
| ``gpt2``      | GPT-2 124M (tied embeddings)        | T=1024 tokens | 124,439,808 |
| ``bert-base`` | BERT-Base (BertModel with pooler)   | T=512 tokens | 109,482,240  |
| ``vit-b16``   | ViT-B/16                            | 3x224x224    | 86,567,656   |
| ``tinyllama-1.1b`` | Llama-style (GQA, SwiGLU, RoPE) | T=2048 tokens | 1,100,048,384 |
| ``gpt2-tiny`` | real local training (bytes)         | T=64 tokens  | 834,304      |
| ``llama-tiny`` | real local training (bytes)        | T=64 tokens  | 803,968      |
| ``bert-tiny`` | BERT-Tiny                           | T=64 tokens  | 4,385,920    |
| ``vit-cifar`` | real local training (32x32)         | 3x32x32      | 809,354      |

Counts include the auxiliary classifiers of GoogLeNet and Inception-V3 (see their modules) and count a tied
parameter once (GPT-2's output projection is its token embedding). Build a model on the ``meta`` device
(``with torch.device("meta"): get_model(name)``) to count or trace it without memory.

Token models (``vocab`` set) take int64 token ids of shape ``(B, T)``; :func:`example_input` draws them.
Decoders (``per_token``) return logits ``(B, T, vocab)`` for a target per position (the next token), and
their ``num_classes`` is the vocabulary: ``get_model(name, c)`` builds a ``c``-token model. BERT returns one
output per sequence; see :mod:`dpcomm.models.bert` for how it trains without a task head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.models.alexnet import AlexNet
from dpcomm.models.bert import BERT_BASE, BERT_TINY, Bert, BertConfig
from dpcomm.models.googlenet import GoogLeNet
from dpcomm.models.gpt import GPT, GPT2, GPT2_TINY, GPTConfig
from dpcomm.models.inception import InceptionV3
from dpcomm.models.lenet import LeNet5
from dpcomm.models.llama import LLAMA_TINY, TINYLLAMA_1_1B, Llama, LlamaConfig
from dpcomm.models.resnet import CifarResNet, ResNet
from dpcomm.models.vgg import VGG
from dpcomm.models.vit import VIT_B16, VIT_CIFAR, ViT

__all__ = [
    "ModelSpec",
    "MODELS",
    "model_names",
    "get_model",
    "input_shape",
    "num_classes",
    "input_vocab",
    "per_token_targets",
    "describe_input",
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
    """Per-sample input shape: channels first for images, ``(T,)`` for token models."""
    num_classes: int
    """Default number of output classes (a decoder's: its vocabulary)."""
    params: int
    """Published parameter count at ``num_classes`` (checked by the tests)."""
    description: str
    """One line for ``dpcomm models``."""
    vocab: int | None = None
    """Token models: inputs are int64 ids in ``[0, vocab)``; ``None``: float inputs."""
    per_token: bool = False
    """Targets are one class per input position, ``(B, T)`` (a decoder's next tokens), not one per sample."""

    def __post_init__(self) -> None:
        if not self.name or self.num_classes < 1 or self.params < 1 or not self.input_shape:
            raise ValueError(f"model spec {self.name!r}: name, classes, params and input shape are required")
        if self.vocab is not None and (self.vocab < 1 or len(self.input_shape) != 1):
            raise ValueError(f"model spec {self.name!r}: a token model has a vocabulary and input shape (T,)")
        if self.per_token and self.vocab is None:
            raise ValueError(f"model spec {self.name!r}: per-token targets need token inputs")


def _decoder(name: str, make: Callable[[int], nn.Module], vocab: int, context: int, params: int, what: str):
    """A decoder's spec: ``num_classes`` is the vocabulary, the targets are the next tokens."""
    return ModelSpec(name=name, build=make, input_shape=(context,), num_classes=vocab, params=params,
                     description=what, vocab=vocab, per_token=True)  # fmt: skip


def _bert(c: BertConfig, classes: int) -> Bert:
    """BertModel with pooler at ``classes == hidden`` (the pooler's outputs are the logits), else a head."""
    return Bert(c, num_labels=None if classes == c.hidden else classes)


def _gpt(c: GPTConfig) -> Callable[[int], nn.Module]:
    return lambda vocab: GPT(replace(c, vocab_size=vocab))


def _llama(c: LlamaConfig) -> Callable[[int], nn.Module]:
    return lambda vocab: Llama(replace(c, vocab_size=vocab))


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
        _decoder("gpt2", _gpt(GPT2), 50257, 1024, 124_439_808, "GPT-2 124M, tied input/output embeddings"),
        ModelSpec(name="bert-base", build=lambda c: _bert(BERT_BASE, c), input_shape=(512,), num_classes=768,
                  params=109_482_240, vocab=30522,
                  description="BERT-Base, BertModel with pooler (its 768 outputs are the logits)"),
        ModelSpec(name="vit-b16", build=lambda c: ViT(VIT_B16, c), input_shape=_IMAGENET, num_classes=1000,
                  params=86_567_656, description="ViT-B/16 at 224x224, torchvision's vit_b_16 sizes"),
        _decoder("tinyllama-1.1b", _llama(TINYLLAMA_1_1B), 32000, 2048, 1_100_048_384,
                 "TinyLlama-1.1B: Llama decoder, RMSNorm, RoPE, SwiGLU, 4 KV heads, untied output"),
        _decoder("gpt2-tiny", _gpt(GPT2_TINY), 256, 64, 834_304, "GPT-2 layout, 4 layers x 128, bytes"),
        _decoder("llama-tiny", _llama(LLAMA_TINY), 256, 64, 803_968, "Llama layout, 4 layers x 128, bytes"),
        ModelSpec(name="bert-tiny", build=lambda c: _bert(BERT_TINY, c), input_shape=(64,), num_classes=128,
                  params=4_385_920, vocab=30522, description="BERT-Tiny (2 layers x 128) with pooler"),
        ModelSpec(name="vit-cifar", build=lambda c: ViT(VIT_CIFAR, c), input_shape=(3, 32, 32),
                  num_classes=10, params=809_354, description="ViT for 32x32 images, patch 4, 4 x 128"),
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


def input_vocab(name: str) -> int | None:
    """A token model's input vocabulary (its inputs are int64 ids below it); ``None`` for float inputs."""
    return _spec(name).vocab


def per_token_targets(name: str) -> bool:
    """Whether ``name`` is trained on a target per input position (``(B, T)``), as a decoder is."""
    return _spec(name).per_token


def describe_input(name: str) -> str:
    """The input column of ``dpcomm models``: ``3x224x224``, or ``T=1024 tokens``."""
    spec = _spec(name)
    if spec.vocab is not None:
        return f"T={spec.input_shape[0]} tokens"
    return "x".join(str(d) for d in spec.input_shape)


def example_input(
    name: str,
    batch_size: int,
    *,
    device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A random batch of ``batch_size`` inputs for ``name``: float32 normals, or int64 token ids uniform over
    the model's vocabulary for a token model."""
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}")
    spec = _spec(name)
    shape = (batch_size, *spec.input_shape)
    if spec.vocab is not None:
        return torch.randint(0, spec.vocab, shape, device=device, generator=generator)
    return torch.randn(shape, device=device, generator=generator)


def count_params(name: str, num_classes: int | None = None) -> int:
    """Trainable parameters of a zoo model, counted on the meta device (no memory, no initialisation cost)."""
    with torch.device("meta"):
        model = get_model(name, num_classes)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def model_info(name: str) -> dict[str, object]:
    """One row of ``dpcomm models``: name, input shape (and its description, and a token model's
    vocabulary), classes, learnable layers, parameters, description."""
    from dpcomm.models.layers import learnable_layers

    spec = _spec(name)
    with torch.device("meta"):
        model = spec.build(spec.num_classes)
    layers = learnable_layers(model)
    return {
        "name": spec.name,
        "input_shape": list(spec.input_shape),
        "input": describe_input(name),
        "vocab": spec.vocab,
        "num_classes": spec.num_classes,
        "learnable_layers": len(layers),
        "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "description": spec.description,
    }
