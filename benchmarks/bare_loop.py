"""The baseline the training benchmarks compare against: nanoGPT's CPU "baby GPT" trained the usual
way, in one process with all cores, on random windows of the first 90% of a character corpus
(nanoGPT's ``get_batch``)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from raydp_llm.core.config import GPTConfig
from raydp_llm.models.factory import build_model

MODEL = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False)
BATCH, LR, MIN_LR, WARMUP = 12, 1e-3, 1e-4, 100


def char_splits(corpus: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """Train and validation ids (first 90% / last 10%) and the vocabulary size."""
    text = corpus.read_text()
    chars = sorted(set(text))
    ids = np.searchsorted(np.array(chars), np.array(list(text))).astype(np.int64)
    boundary = len(ids) - int(round(len(ids) * 0.1))
    return ids[:boundary], ids[boundary:], len(chars)


def lr_at(step: int, steps: int) -> float:
    """nanoGPT's schedule: linear warmup over WARMUP steps, then cosine from LR to MIN_LR at
    ``steps``."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, steps - WARMUP))
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * progress)) * (LR - MIN_LR)


def make_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (2-D and up) only, as nanoGPT does."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(0.9, 0.99),
    )


def random_batch(train: np.ndarray, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BATCH random windows of ``train`` and their next-token targets (nanoGPT's ``get_batch``)."""
    block = MODEL.block_size
    ix = rng.integers(0, len(train) - block - 1, BATCH)
    x = torch.from_numpy(np.stack([train[i:i + block] for i in ix]))
    y = torch.from_numpy(np.stack([train[i + 1:i + 1 + block] for i in ix]))
    return x, y


def train_step(model, optimizer, x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
    """One optimizer step at ``lr``, gradients clipped to norm 1."""
    for g in optimizer.param_groups:
        g["lr"] = lr
    _, scores = model(x, y)
    loss = scores.mean
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def val_loss(model, val: np.ndarray) -> float:
    """The mean loss on the whole of ``val`` cut into windows of block_size + 1 every block_size
    tokens, evaluated 64 windows at a time."""
    block = MODEL.block_size
    windows = np.lib.stride_tricks.sliding_window_view(val, block + 1)[::block]
    model.eval()
    losses = []
    with torch.no_grad():
        for w in np.array_split(windows, max(1, len(windows) // 64)):
            _, scores = model(torch.from_numpy(w[:, :-1].copy()),
                              torch.from_numpy(w[:, 1:].copy()))
            loss = scores.mean
            losses.append(loss.item() * len(w))
    return sum(losses) / len(windows)


def train_bare(corpus: Path, steps: int, evaluate: bool) -> dict:
    """Train ``steps`` steps (warmup 100, cosine to 1e-4 at ``steps``); tokens/s after the first 10%
    of the steps; with ``evaluate``, the loss on the whole validation split cut into windows of 65
    every 64 tokens."""
    start = time.perf_counter()
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(1337)
    train, val, vocab = char_splits(corpus)
    model = build_model(replace(MODEL, vocab_size=vocab))
    optimizer = make_optimizer(model)
    rng, block = np.random.default_rng(1337), MODEL.block_size
    warm, t = steps // 10, time.perf_counter()
    for step in range(steps):
        if step == warm:
            t = time.perf_counter()
        x, y = random_batch(train, rng)
        train_step(model, optimizer, x, y, lr_at(step, steps))
    result = {"tokens_per_s": (steps - warm) * BATCH * block / (time.perf_counter() - t)}
    if evaluate:
        result["val_loss"] = val_loss(model, val)
    result["wall_s"] = time.perf_counter() - start
    return result
