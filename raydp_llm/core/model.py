"""The language models: a GPT decoder and an LSTM baseline, one interface, built from their config
(the model group of the configuration, raydp_llm/core/config.py) by ``build_model``.

Shapes: B batch, T time (≤ block_size), C n_embd, H n_head, V vocab_size.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from raydp_llm.core.errors import InputError
from raydp_llm.core.model_config import GPTConfig, LSTMConfig, ModelConfig

IGNORE = -100  # a target the loss skips: a chat token outside data.train_on, or padding


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``logits`` (B, T, V) over the ``targets`` (B, T) it counts (those
    not ``IGNORE``); 0 with a gradient of 0 when it counts none (not NaN)."""
    counted = (targets != IGNORE).sum().clamp(min=1)
    nats = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")
    return nats / counted


def packed_mask(positions: torch.Tensor) -> torch.Tensor:
    """The attention mask (B, 1, T, T) of packed sequences: a token sees the tokens before it in
    its own sequence, which starts where ``positions`` (B, T) restart at 0 (block-diagonal and
    causal; True = attend)."""
    seq = (positions == 0).cumsum(dim=1)  # (B, T) the sequence each token is in
    same = seq[:, :, None] == seq[:, None, :]  # (B, T, T)
    T = positions.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]


class LanguageModel(nn.Module):
    """What every model here has: token embeddings ``wte``, an output head ``lm_head`` (tied to
    ``wte`` with ``tie_weights``), the loss, sampling and the parameter count. Subclasses set
    ``kind``."""

    kind: str

    def __init__(self, cfg: ModelConfig, embeddings: bool = True):
        super().__init__()
        self.config = cfg
        if not embeddings:  # a transformers model brings its own (core/pretrained.py)
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

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward): 6 per parameter, plus attention for the
        GPT."""
        return 6 * self.num_params()

    def _head(self, x: torch.Tensor, targets: torch.Tensor | None):
        """Logits (B, T, V) from hidden states ``x`` (B, T, C); with ``targets`` (B, T) also the
        mean cross-entropy (``token_loss``)."""
        logits = self.lm_head(x)
        if targets is None:
            return logits, None
        return logits, token_loss(logits, targets)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        stop=None,
    ) -> torch.Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled tokens; ``temperature`` 0 means
        greedy; ``stop(idx)`` true ends it early (a chat turn's end). Each token sees the last
        block_size tokens (positions 0.. from the window's start), as in training;
        ``next_logits`` carries what it can from one token to the next."""
        state = None
        for _ in range(max_new_tokens):
            if stop is not None and stop(idx):
                break
            logits, state = self.next_logits(idx, state)  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx

    def next_logits(self, idx: torch.Tensor, state=None):
        """The logits (B, V) of the token after ``idx`` (B, T) seen through its last block_size
        tokens, and the state to pass with ``idx`` one token longer. This one recomputes the
        window every time; the models carry their state while the window still starts at token
        0."""
        logits, _ = self(idx[:, -self.config.block_size:])
        return logits[:, -1, :], None


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
                positions: torch.Tensor | None = None, cache: KVCache | None = None):
        """Logits (B, T, V) for token ids ``idx`` (B, T); with ``targets`` (B, T) also the mean
        cross-entropy. ``positions`` (B, T) restarting at 0 mark packed sequences (chat data):
        each has its own positions and sees only itself. With ``cache``, ``idx`` continues the
        cached tokens (positions go on from ``cache.length``) and the cache grows by T."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        assert start + T <= self.config.block_size, (
            f"sequence of {start + T} tokens exceeds block_size {self.config.block_size}"
        )
        mask = None
        if positions is None:
            positions = torch.arange(start, start + T, device=idx.device)
        else:
            mask = packed_mask(positions)
        x = self.drop(self.wte(idx) + self.wpe(positions))  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, mask)
        if cache is not None:
            cache.length += T
        return self._head(self.ln_f(x), targets)

    def next_logits(self, idx: torch.Tensor, state: KVCache | None = None):
        """With a KV cache: while the window still starts at token 0 each new token costs one
        position; once it slides, every position changes (positions count from the window's
        start), so the window is recomputed, as without a cache."""
        block = self.config.block_size
        if state is None or state.length != idx.size(1) - 1 or state.length == block:
            state = KVCache(len(self.blocks))  # the window from scratch
            logits, _ = self(idx[:, -block:], cache=state)
        else:
            logits, _ = self(idx[:, -1:], cache=state)
        return logits[:, -1, :], state

    def flops_per_token(self) -> float:
        """6N + 12·L·H·Q·T (PaLM's estimate, as nanoGPT): L layers, H heads, Q head size, T
        context."""
        c = self.config
        return (
            super().flops_per_token()
            + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size
        )


class LSTMLM(LanguageModel):
    """A stacked LSTM language model: the architecture of the Spark+DL4J projects (GravesLSTM
    layers, softmax output), kept as a baseline for the GPT. It reads any length; ``generate``
    reads the last block_size tokens, as the GPT does."""

    kind = "lstm"

    def __init__(self, cfg: LSTMConfig):
        super().__init__(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(
            cfg.n_embd,
            cfg.n_embd,
            cfg.n_layer,
            batch_first=True,
            dropout=cfg.dropout if cfg.n_layer > 1 else 0.0,
        )  # dropout between LSTM layers
        self.apply(self._init_weights)  # the LSTM keeps PyTorch's uniform init

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None):
        """Logits (B, T, V) for token ids ``idx`` (B, T); with ``targets`` (B, T) also the mean
        cross-entropy. ``positions`` mean nothing to a recurrence: packed sequences are refused
        for the LSTM (core/checks.py); one padded sequence per window needs none."""
        h, _ = self.lstm(self.drop(self.wte(idx)))  # (B, T, C)
        return self._head(self.drop(h), targets)

    def next_logits(self, idx: torch.Tensor, state: LSTMState | None = None):
        """Carried (h, c) while the window holds every token so far; once it slides, the window
        is re-read from a zero state, as without carried state."""
        T = idx.size(1)
        if state is None or state.tokens != T - 1 or T > self.config.block_size:
            h, (h_n, c_n) = self.lstm(self.drop(self.wte(idx[:, -self.config.block_size:])))
        else:  # one token on from the carried state
            h, (h_n, c_n) = self.lstm(self.drop(self.wte(idx[:, -1:])), (state.h, state.c))
        logits, _ = self._head(self.drop(h[:, -1:]), None)  # (B, 1, V)
        return logits[:, -1, :], LSTMState(h_n, c_n, T)


@dataclass
class LSTMState:
    """What the LSTM carries between generated tokens: its layers' (h, c), each (L, B, C), after
    reading ``tokens`` tokens."""

    h: torch.Tensor
    c: torch.Tensor
    tokens: int


MODELS = {cls.kind: cls for cls in (GPT, LSTMLM)}


def build_model(cfg: ModelConfig, s3=None) -> LanguageModel:
    """The model ``cfg`` describes (``vocab_size`` set; a transformers family from
    core/pretrained.py, ``s3`` (S3Options) reaching an s3:// ``model.path``), its token embeddings
    from ``cfg.init_embeddings`` when given (``read_embeddings``; ids the file lacks keep their
    random init) and frozen with ``cfg.freeze_embeddings`` (no gradient for wte, nor for the head
    when tied)."""
    if cfg.kind in MODELS:
        model = MODELS[cfg.kind](cfg)
    else:
        from raydp_llm.core.pretrained import build_pretrained  # transformers: only for them

        model = build_pretrained(cfg, s3)
    if getattr(cfg, "init_embeddings", None) is not None:
        if not Path(cfg.init_embeddings).is_file():
            raise _embeddings_error(
                cfg.init_embeddings, "no such file", "give a CSV or .npy file of token vectors"
            )
        ids, vectors = read_embeddings(cfg.init_embeddings, cfg.vocab_size, cfg.n_embd)
        with torch.no_grad():
            model.wte.weight[ids] = vectors.to(model.wte.weight)
    if getattr(cfg, "freeze_embeddings", False):
        model.wte.weight.requires_grad_(False)
    return model


def read_embeddings(
    path: str, vocab_size: int | None, n_embd: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N,) and their vectors (N, n_embd) from ``path``, checked against the model.

    A ``.npy`` file holds an array (vocab_size, n_embd), row i for id i, or (rows, 1 + n_embd), the
    id first. Any other file is a CSV, one token per line: the id, then n_embd numbers; the first
    line may be a header. With ``vocab_size`` None (not known before the ETL) only the widths and
    the values are checked.
    """
    npy = str(path).endswith(".npy")
    if npy:
        fix = ("save an array of shape (vocab_size, n_embd) or (rows, 1 + n_embd) with "
               "numpy.save")
    else:
        fix = "write one token per line: id,v1,...,vn (a header line first is allowed)"
    table = _read_table(path, npy, fix)
    ids, vectors = _split_ids(table, path, npy, vocab_size, n_embd, fix)
    _check_ids(ids, path, vocab_size)
    if not np.isfinite(vectors).all():
        raise _embeddings_error(path, "vectors hold NaN or infinite values", "give finite numbers")
    return torch.from_numpy(ids.astype(np.int64)), torch.as_tensor(vectors, dtype=torch.float32)


def _read_table(path: str, npy: bool, fix: str) -> np.ndarray:
    """The numbers in ``path`` (a .npy array, else a CSV with an optional header line)."""
    try:
        if npy:
            table = np.load(path, allow_pickle=False)
            if not np.issubdtype(table.dtype, np.number):
                raise ValueError(f"dtype {table.dtype}")
        else:
            with open(path) as f:
                header = not all(_is_number(cell) for cell in f.readline().split(","))
            with warnings.catch_warnings():
                # an empty file: reported below as "no rows"
                warnings.simplefilter("ignore", UserWarning)
                table = np.loadtxt(path, delimiter=",", skiprows=int(header), ndmin=2)
    except ValueError as err:
        problem = f"not a table of numbers ({str(err).split(';')[0]})"
        raise _embeddings_error(path, problem, fix) from None
    if table.size == 0:
        raise _embeddings_error(path, "no rows", fix)
    return table


def _split_ids(table: np.ndarray, path: str, npy: bool, vocab_size: int | None, n_embd: int,
               fix: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors): row i for id i (a full .npy table), else the first column holds the id."""
    width = table.shape[1] if table.ndim == 2 else None
    if npy and width == n_embd and vocab_size in (None, table.shape[0]):
        return np.arange(table.shape[0]), table
    if width == n_embd + 1:
        return table[:, 0], table[:, 1:]
    if npy:
        full = f"({vocab_size or 'vocab_size'}, {n_embd})"
        raise _embeddings_error(path, f"an array of shape {table.shape} is neither (vocab_size, "
                                      f"n_embd) = {full} nor (rows, 1 + n_embd) = (rows, "
                                      f"{n_embd + 1})", fix)
    raise _embeddings_error(path, f"rows hold {width - 1} vector values but model.n_embd={n_embd}",
                            "give vectors of n_embd values or change model.n_embd")


def _check_ids(ids: np.ndarray, path: str, vocab_size: int | None) -> None:
    """Integer ids, each once, inside the vocabulary (when its size is known)."""
    if not np.array_equal(ids, np.round(ids)):
        raise _embeddings_error(path, f"ids are not integers (e.g. {ids[ids != np.round(ids)][0]})",
                                "put integer token ids in the first column")
    whole = ids.astype(np.int64)
    outside = whole[(whole < 0) | (whole >= (vocab_size or np.iinfo(np.int64).max))]
    if outside.size:
        raise _embeddings_error(path, f"ids {outside[:5].tolist()} lie outside [0, "
                                      f"vocab_size={vocab_size})",
                                "use the ids of this run's tokenizer")
    if len(np.unique(whole)) != len(whole):
        raise _embeddings_error(
            path, "an id appears on more than one row", "give each token one vector"
        )


def _embeddings_error(path: str, problem: str, fix: str) -> InputError:
    return InputError(f"model.init_embeddings={path}: {problem}; {fix}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
