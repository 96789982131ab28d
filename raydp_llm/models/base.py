"""What every language model here is: the interface (``LanguageModel``: embeddings, head, loss,
sampling, sizes), the targets' scores (``scores.token_scores``: never the whole (B, T, V) logits)
and the attention mask of packed sequences.

Shapes: B batch, T time (≤ block_size), C n_embd, V vocab_size.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

from raydp_llm.core.model_config import ModelConfig
from raydp_llm.models.scores import IGNORE, Head, TokenScores, token_scores

__all__ = ["IGNORE", "TokenScores", "LanguageModel", "token_scores"]


def packed_mask(positions: torch.Tensor) -> torch.Tensor:
    """The attention mask (B, 1, T, T) of packed sequences: a token sees the tokens before it in
    its own sequence, which starts where ``positions`` (B, T) restart at 0 (block-diagonal and
    causal; True = attend)."""
    seq = (positions == 0).cumsum(dim=1)  # (B, T) the sequence each token is in
    same = seq[:, :, None] == seq[:, None, :]  # (B, T, T)
    T = positions.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]


def kept(x: torch.Tensor, keep: int | None) -> torch.Tensor:
    """The last ``keep`` positions of hidden states ``x`` (B, T, C) (all of them: None): those
    whose logits are wanted."""
    return x if keep is None else x[:, -keep:]


def padded_mask(pads: torch.Tensor, start: int, T: int) -> torch.Tensor:
    """The attention mask (B, 1, T, start + T) of T tokens after ``start`` cached ones, each row's
    first ``pads`` (B,) tokens left padding: a token sees the tokens before it that are not
    padding (a padding token sees itself alone, so that no row of the mask is empty)."""
    keys = torch.arange(start + T, device=pads.device)  # (K,)
    queries = torch.arange(start, start + T, device=pads.device)  # (T,)
    causal = keys[None, :] <= queries[:, None]  # (T, K)
    kept = keys[None, :] >= pads[:, None]  # (B, K)
    itself = keys[None, :] == queries[:, None]  # (T, K)
    return ((causal[None] & kept[:, None]) | itself[None])[:, None]


def padded_positions(pads: torch.Tensor, start: int, T: int) -> torch.Tensor:
    """The positions (B, T) of T tokens after ``start`` in rows left-padded by ``pads`` (B,): a
    row's first real token is at 0 (padding at 0 too)."""
    steps = torch.arange(start, start + T, device=pads.device)
    return (steps[None, :] - pads[:, None]).clamp(min=0)


class LanguageModel(nn.Module):
    """What every model here has: token embeddings ``wte``, an output head ``lm_head`` (tied to
    ``wte`` with ``tie_weights``), the loss, sampling and the parameter count. Subclasses set
    ``kind``."""

    kind: str
    pads_prompts = False  # whether ``next_logits`` reads left-padded prompts (``pads``)

    def __init__(self, cfg: ModelConfig, embeddings: bool = True):
        super().__init__()
        self.config = cfg
        if not embeddings:  # a transformers model brings its own (models/hf.py)
            return
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embeddings
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights count once

    def longest_window(self) -> int:
        """The most tokens the model reads at once: its block size (the GPT's position table); a
        transformers model's positions."""
        return self.config.block_size

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward): 6 per parameter, plus attention for the
        GPT."""
        return 6 * self.num_params()

    def _head(self, x: torch.Tensor, targets: torch.Tensor | None, temperature: float = 1.0):
        """Logits (B, T, V) from hidden states ``x`` (B, T, C) and None; with ``targets``
        (B, T) None and their scores instead (``token_scores``: no whole logits)."""
        if targets is None:
            return self.lm_head(x), None
        return None, token_scores(Head(self.lm_head.weight), x, targets, temperature)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        stop=None,
        logprobs: list | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled tokens; ``temperature`` 0 means
        greedy; ``stop(idx)`` true ends it early (a chat turn's end). Each token sees the last
        block_size tokens (positions 0.. from the window's start), as in training;
        ``next_logits`` carries what it can from one token to the next. ``logprobs``, when given,
        gets each new token's log-probability (B,) under the model (at temperature 1)."""
        state = None
        for _ in range(max_new_tokens):
            if stop is not None and stop(idx):
                break
            logits, state = self.next_logits(idx, state)  # (B, V)
            raw = logits
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)  # (B, 1)
            if logprobs is not None:
                logprobs.append(F.log_softmax(raw.float(), dim=-1).gather(1, nxt)[:, 0])
            idx = torch.cat([idx, nxt], dim=1)
        return idx

    def next_logits(self, idx: torch.Tensor, state=None, pads: torch.Tensor | None = None):
        """The logits (B, V) of the token after ``idx`` (B, T) seen through its last block_size
        tokens, and the state to pass with ``idx`` one token longer. This one recomputes the
        window every time; the models carry their state while the window still starts at token
        0. ``pads`` (B,): each row's left padding, for a model that ``pads_prompts``."""
        assert pads is None, f"{type(self).__name__} reads no left-padded prompts"
        logits, _ = self(idx[:, -self.config.block_size:])
        return logits[:, -1, :], None

