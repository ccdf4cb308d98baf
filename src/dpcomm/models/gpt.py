"""GPT-2 (Radford et al., 2019), after nanoGPT's ``model.py``: a decoder-only transformer with learned
positions, pre-LayerNorm blocks and the output projection tied to the token embedding.

- ``gpt2``: the 124M model (12 layers, 12 heads, width 768, context 1024, vocabulary 50,257),
  124,439,808 parameters counted once each (the tied ``lm_head.weight`` *is* ``wte.weight``; nanoGPT prints
  124.44M with positions, 123.65M without), 75 learnable layers (wte, wpe, 6 per block, ln_f).
- ``gpt2-tiny``: the same class at a size that trains on two cores: 4 layers, 4 heads, width 128,
  context 64, byte-level vocabulary 256; 834,304 parameters.

The forward takes int64 token ids ``(B, T)`` and returns next-token logits ``(B, T, vocab)``. There is no
dropout (dpcomm measures communication; replicas stay bitwise comparable). :class:`Block` (pre-LN attention
and MLP) is shared with the ViT encoder, which is the same block without the causal mask.

Tied weights and learnable layers: :func:`dpcomm.models.learnable_layers` gives a shared parameter to the
first module that owns it, here ``wte`` (``lm_head`` owns nothing of its own, so it is no layer). Its gradient
is complete only when the embedding's backward has run, at the very end of backward, although the output
projection's half of it is computed first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "GPT2", "GPT2_TINY", "Block", "SelfAttention", "MLP"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GPTConfig:
    """Sizes of a GPT-2-style decoder."""

    vocab_size: int = 50257
    """Tokens (input and output: the projections are tied)."""
    block_size: int = 1024
    """Context length: positions of the learned position embedding."""
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads per block."""
    n_embd: int = 768
    """Model width (divisible by ``n_head``); the MLP is 4x wider."""

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd) < 1:
            raise ValueError(f"GPT config: every size must be >= 1, got {self}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT config: n_embd {self.n_embd} is not divisible by n_head {self.n_head}")


GPT2 = GPTConfig()
"""GPT-2 small, the 124M model."""
GPT2_TINY = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
"""Byte-level, 4 layers of width 128, context 64: trains on two CPU cores."""


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection (``c_attn``) and an output projection."""

    def __init__(self, dim: int, heads: int, *, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = d // self.heads  # head size
        q, k, v = (z.view(b, t, self.heads, h).transpose(1, 2) for z in self.c_attn(x).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """``c_fc`` to 4x the width, GELU, ``c_proj`` back."""

    def __init__(self, dim: int, *, gelu: str) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU(approximate=gelu)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, dim: int, heads: int, *, causal: bool, eps: float = 1e-5, gelu: str = "tanh") -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, heads, causal=causal)
        self.ln_2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, gelu=gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: token + position embeddings, ``n_layer`` causal blocks, final LayerNorm, tied output."""

    def __init__(self, config: GPTConfig = GPT2) -> None:
        super().__init__()
        self.config = config
        c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(Block(c.n_embd, c.n_head, causal=True) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (Press and Wolf, 2017), as GPT-2 does
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's residual projections: std 0.02 / sqrt(2 L)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds the context of {self.config.block_size}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))
