"""The optimizer and its learning-rate schedule (nanoGPT's): AdamW with weight decay on matrices
only, linear warmup then cosine decay."""

from __future__ import annotations

import math

import torch

from raydp_llm.training.spec import TrainSpec


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` (``end_lr``) at ``max_steps``."""
    if step < spec.optim.warmup_steps:
        return spec.optim.lr * (step + 1) / spec.optim.warmup_steps
    progress = min(
        1.0, (step - spec.optim.warmup_steps) / max(1, spec.max_steps - spec.optim.warmup_steps)
    )
    end = spec.optim.end_lr
    return end + 0.5 * (1 + math.cos(math.pi * progress)) * (spec.optim.lr - end)


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, LayerNorm gains); frozen parameters
    left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.optim.lr, betas=(spec.optim.beta1, spec.optim.beta2))
