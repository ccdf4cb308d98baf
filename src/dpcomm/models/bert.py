"""BERT (Devlin et al., 2019): a bidirectional post-LN transformer encoder with the modules of Hugging Face's
``BertModel`` (three embeddings and a LayerNorm; per layer query, key, value, attention output, LayerNorm,
intermediate, output, LayerNorm; the pooler), under shorter names.

- ``bert-base``: BERT-Base (12 layers, 12 heads, width 768, FFN 3072, WordPiece vocabulary 30,522, 512
  positions, 2 segment types), ``BertModel`` with its pooler and no task head: 109,482,240 parameters, 101
  learnable layers (4 in the embeddings, 8 per layer, the pooler).
- ``bert-tiny``: Google's BERT-Tiny (Turc et al., 2019: 2 layers, 2 heads, width 128, FFN 512), 4,385,920
  parameters with the pooler; fed 64 tokens in the zoo.

The forward takes int64 token ids ``(B, T)`` (one segment, no padding) and returns the pooler's output
``(B, hidden)``: ``tanh(dense(h[:, 0]))``. How the zoo trains it: with ``num_labels`` (``get_model(name, c)``
for any ``c`` other than the hidden size) a ``classifier`` linear layer on the pooler gives ``(B, c)`` logits,
as ``BertForSequenceClassification`` does; without one (the zoo's default, the published count) the pooler's
``hidden`` outputs are themselves the logits of a ``hidden``-way classification of the batch's labels. Either
way every parameter gets a gradient in each step, so the gradients communicated are exactly BertModel's.
There is no dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BertConfig", "Bert", "BERT_BASE", "BERT_TINY"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BertConfig:
    """Sizes of a BERT encoder."""

    vocab_size: int = 30522
    """WordPiece tokens."""
    hidden: int = 768
    """Width (divisible by ``heads``)."""
    layers: int = 12
    """Encoder layers."""
    heads: int = 12
    """Attention heads per layer."""
    intermediate: int = 3072
    """Width of the feed-forward layer."""
    max_positions: int = 512
    """Positions of the learned position embedding."""
    type_vocab: int = 2
    """Segment types (sentence A / B)."""

    def __post_init__(self) -> None:
        sizes = (self.vocab_size, self.hidden, self.layers, self.heads, self.intermediate, self.max_positions)
        if min(sizes) < 1:
            raise ValueError(f"BERT config: every size must be >= 1, got {self}")
        if self.hidden % self.heads:
            raise ValueError(f"BERT config: hidden {self.hidden} is not divisible by heads {self.heads}")


BERT_BASE = BertConfig()
"""BERT-Base."""
BERT_TINY = BertConfig(hidden=128, layers=2, heads=2, intermediate=512)
"""BERT-Tiny (Turc et al., "Well-Read Students Learn Better", 2019)."""

_EPS = 1e-12  # BERT's LayerNorm epsilon


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden)
        self.position_embeddings = nn.Embedding(c.max_positions, c.hidden)
        self.token_type_embeddings = nn.Embedding(c.type_vocab, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=_EPS)  # noqa: N815 - Hugging Face's name

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(pos)
        x = x + self.token_type_embeddings(torch.zeros_like(pos))  # one segment: type 0 everywhere
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (lin(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))  # fmt: skip
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)


class Layer(nn.Module):
    """Post-LN: ``ln1(x + dense(attn(x)))``, then ``ln2(h + output(gelu(intermediate(h))))``."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(c)
        self.attention_output = nn.Linear(c.hidden, c.hidden)
        self.attention_norm = nn.LayerNorm(c.hidden, eps=_EPS)
        self.intermediate = nn.Linear(c.hidden, c.intermediate)
        self.output = nn.Linear(c.intermediate, c.hidden)
        self.output_norm = nn.LayerNorm(c.hidden, eps=_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x + self.attention_output(self.attention(x)))
        return self.output_norm(h + self.output(F.gelu(self.intermediate(h))))


class Bert(nn.Module):
    """BertModel with pooler; with ``num_labels``, a classification head on the pooler."""

    def __init__(self, config: BertConfig = BERT_BASE, num_labels: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.layers))
        self.pooler = nn.Linear(config.hidden, config.hidden)
        self.classifier = None if num_labels is None else nn.Linear(config.hidden, num_labels)
        for m in self.modules():  # BERT's initialiser: N(0, 0.02) weights, zero biases
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.config.max_positions:
            raise ValueError(f"sequence of {t} tokens exceeds {self.config.max_positions} positions")
        x = self.embeddings(ids)
        for layer in self.layer:
            x = layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return pooled if self.classifier is None else self.classifier(pooled)
