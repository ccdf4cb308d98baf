"""A Llama-style decoder (Touvron et al., 2023), after torchtitan's ``models/llama``: RMSNorm before attention
and feed-forward, rotary position embeddings, grouped-query attention (``n_kv_heads`` key/value heads shared
by groups of query heads), a SwiGLU feed-forward, no biases, an untied output projection.

- ``tinyllama-1.1b``: TinyLlama-1.1B (Zhang et al., 2024: vocabulary 32,000, width 2048, 22 layers, 32
  heads, 4 KV heads, FFN 5632, context 2048), 1,100,048,384 parameters, 201 learnable layers (the embedding,
  9 per layer: two norms, wq, wk, wv, wo, w1, w3, w2; the final norm, the output).
- ``llama-tiny``: byte-level vocabulary 256, width 128, 4 layers, 4 heads, 2 KV heads, FFN 352, context
  64; 803,968 parameters, trains on two cores.

The forward takes int64 token ids ``(B, T)`` and returns next-token logits ``(B, T, vocab)``. Rotary angles
are computed in the forward from the positions (no buffers: a model built on the ``meta`` device needs no
re-initialisation to run elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LLAMA3_70B",
    "LLAMA3_8B",
    "LLAMA_TINY",
    "SHAPES",
    "TINYLLAMA_1_1B",
    "Llama",
    "LlamaConfig",
    "llama",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaConfig:
    """Sizes of a Llama-style decoder."""

    vocab_size: int = 32000
    """Tokens (input embedding and output projection, untied)."""
    dim: int = 2048
    """Model width (divisible by ``n_heads``)."""
    n_layers: int = 22
    """Transformer blocks."""
    n_heads: int = 32
    """Query heads."""
    n_kv_heads: int = 4
    """Key/value heads (divides ``n_heads``; ``n_heads`` is multi-head attention, 1 multi-query)."""
    ffn_dim: int = 5632
    """Hidden width of the SwiGLU feed-forward (w1 and w3 map to it, w2 back)."""
    max_seq_len: int = 2048
    """Context length."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies."""

    def __post_init__(self) -> None:
        sizes = (self.vocab_size, self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.ffn_dim)
        if min(*sizes, self.max_seq_len) < 1:
            raise ValueError(f"Llama config: every size must be >= 1, got {self}")
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"Llama config: heads must divide dim (even head size), KV heads heads: {self}")


TINYLLAMA_1_1B = LlamaConfig()
"""TinyLlama-1.1B."""
LLAMA_TINY = LlamaConfig(
    vocab_size=256, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352, max_seq_len=64
)
"""Byte-level, 4 layers of width 128, context 64."""
LLAMA3_8B = LlamaConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                        max_seq_len=8192, rope_theta=500000.0)  # fmt: skip
"""Llama-3-8B's shape (Meta's model card and ``params.json``: width, layers, heads, KV heads, FFN width,
128,256 tokens, context 8,192, rope theta 500,000)."""
LLAMA3_70B = LlamaConfig(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                         max_seq_len=8192, rope_theta=500000.0)  # fmt: skip
"""Llama-3-70B's shape (as :data:`LLAMA3_8B`)."""
SHAPES = {"tinyllama-1.1b": TINYLLAMA_1_1B, "llama-tiny": LLAMA_TINY, "llama3-8b": LLAMA3_8B,
          "llama3-70b": LLAMA3_70B}  # fmt: skip
"""The named shapes :func:`llama` builds."""


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al., RoFormer) on ``(B, H, T, D)``: dimension ``i`` pairs with ``i + D/2``."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.dim // c.n_heads
        self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        group = self.n_heads // self.n_kv_heads  # each KV head serves `group` query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU (Shazeer, 2020): ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.feed_forward = FeedForward(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token embedding, ``n_layers`` blocks, RMSNorm, output projection."""

    def __init__(self, config: LlamaConfig = TINYLLAMA_1_1B) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def _rope(self, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.config.dim // self.config.n_heads // 2
        freqs = self.config.rope_theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
        angles = torch.outer(torch.arange(t, device=device, dtype=torch.float32), freqs)  # (T, D/2)
        return angles.cos(), angles.sin()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds the context of {self.config.max_seq_len}")
        x = self.tok_embeddings(tokens)
        cos, sin = (c.to(x.dtype) for c in self._rope(t, tokens.device))  # bf16 models stay bf16
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def llama(shape: str = "tinyllama-1.1b", **fields) -> Llama:
    """A :class:`Llama` of a named shape (:data:`SHAPES`), ``fields`` overriding its config: the command
    line's way in, ``dpcomm profile --model dpcomm.models.llama:llama --model-args '{"shape":
    "llama3-8b"}' --input 'long[1,8192]:vocab=128256'``. Build it under ``torch.device("meta")`` (as
    ``--analytic`` does) to count a large one without memory."""
    from dataclasses import replace

    if shape not in SHAPES:
        raise ValueError(f"unknown Llama shape {shape!r}: one of {', '.join(SHAPES)}")
    return Llama(replace(SHAPES[shape], **fields))
