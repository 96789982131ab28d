"""The targets' scores from whole (B, T, V) logits, as the models made them before issue 69's
chunks: the reference the chunked ``token_scores`` is held to, and the way tests that bring
their own logits (transformers' models, hand-made ones) score them."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from raydp_llm.models.base import IGNORE, TokenScores


def whole_scores(logits: torch.Tensor, targets: torch.Tensor) -> TokenScores:
    """``targets`` (B, T) scored by ``logits`` (B, T, V)."""
    B, T, V = logits.shape
    counted = targets != IGNORE
    nats = F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T),
                           ignore_index=IGNORE, reduction="none").view(B, T)
    return TokenScores(nats, (logits.argmax(dim=-1) == targets) & counted, counted)
