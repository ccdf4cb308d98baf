"""The training loss of a zoo model: cross-entropy on the logits, plus the auxiliary heads where there are.

GoogLeNet and Inception-V3 return ``(logits, aux...)`` in training mode (their aux heads are trained, so
their gradients are communicated, as in the papers' runs). Each aux head's cross-entropy is added with
weight ``AUX_WEIGHT`` = 0.3, GoogLeNet's (Szegedy et al. 2015, sec. 5: "weighted by 0.3"); eval mode
returns the logits alone and the loss is plain cross-entropy.

A decoder's logits are ``(B, T, V)`` against next-token targets ``(B, T)``: they are flattened to ``(B*T, V)``
and ``(B*T,)``, so the loss is the mean cross-entropy per token (the training loop needs no other change).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["AUX_WEIGHT", "classification_loss", "logits"]

AUX_WEIGHT = 0.3
"""Weight of each auxiliary head's cross-entropy (GoogLeNet's)."""


def logits(out: Any) -> torch.Tensor:
    """The main head's output of a zoo model's forward (the first of a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dim() == 3:  # (B, T, V) per-token logits against (B, T) targets
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


def classification_loss(out: Any, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the main head plus ``AUX_WEIGHT`` times each aux head's (``None`` heads skipped);
    per token, averaged over every position, for ``(B, T, V)`` logits."""
    if not isinstance(out, tuple):
        return _cross_entropy(out, y)
    loss = _cross_entropy(out[0], y)
    for aux in out[1:]:
        if aux is not None:
            loss = loss + AUX_WEIGHT * _cross_entropy(aux, y)
    return loss
