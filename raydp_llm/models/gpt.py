"""The GPT decoder (nanoGPT's, with sinusoidal or learned positions, packed sequences and a KV
cache for generation).

Shapes: B batch, T time (≤ block_size), C n_embd, H n_head, V vocab_size.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from raydp_llm.core.model_config import GPTConfig
from raydp_llm.models.base import (
    LanguageModel,
    kept,
    packed_mask,
    padded_mask,
    padded_positions,
)


class KVCache:
    """The keys and values (B, H, t, C/H) of the tokens a block has seen, one pair per layer."""

    def __init__(self, n_layer: int):
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layer
        self.length = 0  # tokens seen

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append this layer's new keys and values; returns all of them."""
        past = self.kv[layer]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                mask: torch.Tensor | None = None):
        """``x`` (B, T, C) → (B, T, C). With ``cache``: ``x`` holds the tokens after the cached
        ones, all of them (an empty cache) or one. With ``mask`` (B, 1, T, T, ``packed_mask``)
        attention stays within each packed sequence."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
        )  # (B, H, T, C/H)
        causal = True
        if cache is not None:
            causal = cache.length == 0  # one new token attends to every cached one
            k, v = cache.extend(layer, k, v)  # (B, H, t + T, C/H)
        if mask is not None:
            causal = False  # the mask is causal itself
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.approximate = "tanh" if cfg.activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                mask: torch.Tensor | None = None):
        x = x + self.attn(self.ln_1(x), cache, layer, mask)
        return x + self.mlp(self.ln_2(x))


class SinusoidalPositions(nn.Module):
    """The Transformer paper's fixed sin/cos position table, a buffer (not saved, not trained): pos
    (T,) → (T, C)."""

    def __init__(self, block_size: int, n_embd: int):
        super().__init__()
        pos = torch.arange(block_size, dtype=torch.float32)[:, None]  # (T, 1)
        freq = torch.exp(
            torch.arange(0, n_embd, 2, dtype=torch.float32) * (-math.log(10000.0) / n_embd)
        )  # (⌈C/2⌉,)
        table = torch.zeros(block_size, n_embd)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq[: n_embd // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self.table[pos]


class GPT(LanguageModel):
    """A GPT decoder (nanoGPT-style): token + positional embeddings, causal self-attention blocks,
    output head."""

    kind = "gpt"
    pads_prompts = True

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.wpe = (nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_embedding == "learned"
                    else SinusoidalPositions(cfg.block_size, cfg.n_embd))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, cache: KVCache | None = None,
                pads: torch.Tensor | None = None, keep: int | None = None,
                temperature: float = 1.0):
        """Logits (B, T, V) for token ids ``idx`` (B, T) and None; with ``targets`` (B, T) None
        and their scores (``token_scores``, logits divided by ``temperature``). ``positions``
        (B, T) restarting at 0 mark packed sequences (chat data): each has its own positions and
        sees only itself. With ``cache``, ``idx`` continues the cached tokens (positions go on
        from ``cache.length``) and the cache grows by T. ``pads`` (B,): each row starts with
        that many padding tokens, which no other token sees. ``keep``: the last ``keep``
        positions alone (B, keep, ·)."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        assert start + T <= self.config.block_size, (
            f"sequence of {start + T} tokens exceeds block_size {self.config.block_size}"
        )
        mask = None
        if pads is not None:
            positions, mask = padded_positions(pads, start, T), padded_mask(pads, start, T)
        elif positions is None:
            positions = torch.arange(start, start + T, device=idx.device)
        else:
            mask = packed_mask(positions)
        x = self.drop(self.wte(idx) + self.wpe(positions))  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, mask)
        if cache is not None:
            cache.length += T
        return self._head(kept(self.ln_f(x), keep), targets, temperature)

    def next_logits(self, idx: torch.Tensor, state: KVCache | None = None,
                    pads: torch.Tensor | None = None):
        """With a KV cache: while the window still starts at token 0 each new token costs one
        position; once it slides, every position changes (positions count from the window's
        start), so the window is recomputed, as without a cache. ``pads`` (B,): left padding
        (the window never slides past it)."""
        block = self.config.block_size
        if state is None or state.length != idx.size(1) - 1 or state.length == block:
            assert pads is None or idx.size(1) <= block, "left-padded rows longer than the block"
            state = KVCache(len(self.blocks))  # the window from scratch
            logits, _ = self(idx[:, -block:], cache=state, pads=pads)
        else:
            logits, _ = self(idx[:, -1:], cache=state, pads=pads)
        return logits[:, -1, :], state

    def flops_per_token(self) -> float:
        """6N + 12·L·H·Q·T (PaLM's estimate, as nanoGPT): L layers, H heads, Q head size, T
        context."""
        c = self.config
        return (
            super().flops_per_token()
            + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size
        )

