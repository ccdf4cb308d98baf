"""The training loss of a zoo model: cross-entropy on the logits, plus the auxiliary heads where there are.

GoogLeNet and Inception-V3 return ``(logits, aux...)`` in training mode (their aux heads are trained, so
their gradients are communicated, as in the papers' runs). Each aux head's cross-entropy is added with
weight ``AUX_WEIGHT`` = 0.3, GoogLeNet's (Szegedy et al. 2015, sec. 5: "weighted by 0.3"); eval mode
returns the logits alone and the loss is plain cross-entropy.
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


def classification_loss(out: Any, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the main head plus ``AUX_WEIGHT`` times each aux head's (``None`` heads skipped)."""
    if not isinstance(out, tuple):
        return F.cross_entropy(out, y)
    loss = F.cross_entropy(out[0], y)
    for aux in out[1:]:
        if aux is not None:
            loss = loss + AUX_WEIGHT * F.cross_entropy(aux, y)
    return loss
