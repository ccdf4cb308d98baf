"""Vision Transformer (Dosovitskiy et al., 2021): an image cut into patches, a class token, learned positions,
pre-LN encoder blocks (the GPT-2 block of :mod:`dpcomm.models.gpt` without the causal mask), a linear head on
the class token.

- ``vit-b16``: ViT-B/16 at 224x224 with 1000 classes (12 layers, 12 heads, width 768, MLP 3072, 197
  tokens), 86,567,656 parameters as torchvision's ``vit_b_16``; 76 learnable layers (``embed`` with the class
  token and positions, ``embed.proj`` the patch convolution, 6 per block, the final norm, the head).
- ``vit-cifar``: a small ViT for 3x32x32 inputs (patch 4: 64 patches, 4 layers, 4 heads, width 128),
  10 classes, 809,354 parameters; trains on two cores and takes ``--data digits`` as ResNet-20 does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpcomm.models.gpt import Block

__all__ = ["ViTConfig", "ViT", "VIT_B16", "VIT_CIFAR"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ViTConfig:
    """Sizes of a ViT."""

    image_size: int = 224
    """Input height and width (square, 3 channels)."""
    patch_size: int = 16
    """Side of a patch; ``image_size`` must be a multiple."""
    layers: int = 12
    """Encoder blocks."""
    heads: int = 12
    """Attention heads per block."""
    dim: int = 768
    """Width (divisible by ``heads``); the MLP is 4x wider."""

    def __post_init__(self) -> None:
        if min(self.image_size, self.patch_size, self.layers, self.heads, self.dim) < 1:
            raise ValueError(f"ViT config: every size must be >= 1, got {self}")
        if self.image_size % self.patch_size or self.dim % self.heads:
            raise ValueError(f"ViT config: patch must divide the image and heads the width, got {self}")

    @property
    def tokens(self) -> int:
        """Patches plus the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1


VIT_B16 = ViTConfig()
"""ViT-B/16 at 224x224."""
VIT_CIFAR = ViTConfig(image_size=32, patch_size=4, layers=4, heads=4, dim=128)
"""A small ViT for 32x32 images."""


class Embed(nn.Module):
    """Patch convolution, class token prepended, learned positions added: ``(B, 3, H, W) -> (B, N+1, D)``."""

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, c.tokens, c.dim).normal_(std=0.02))
        self.proj = nn.Conv2d(3, c.dim, kernel_size=c.patch_size, stride=c.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding


class ViT(nn.Module):
    """ViT classifier: embed, ``layers`` encoder blocks, LayerNorm, head on the class token."""

    def __init__(self, config: ViTConfig = VIT_B16, num_classes: int = 1000) -> None:
        super().__init__()
        self.config = config
        self.embed = Embed(config)
        self.blocks = nn.ModuleList(
            Block(config.dim, config.heads, causal=False, eps=1e-6, gelu="none") for _ in range(config.layers)
        )
        self.ln = nn.LayerNorm(config.dim, eps=1e-6)
        self.head = nn.Linear(config.dim, num_classes)
        nn.init.zeros_(self.head.weight)  # torchvision starts the head at zero
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x)[:, 0])
