"""The language models: a GPT decoder and an LSTM baseline, one interface, built from a config dict by ``build_model``.

Shapes: B batch, T time (≤ block_size), C n_embd, H n_head, V vocab_size.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from raydp_llm.errors import InputError

POS_EMBEDDINGS = ("learned", "sinusoidal")


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 64  # longest context, tokens
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False  # bias in Linear and LayerNorm layers
    pos_embedding: str = "learned"  # "learned" (a trained table) | "sinusoidal" (fixed sin/cos, no parameters)
    tie_weights: bool = True  # the output head shares the token embedding table

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise InputError(f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; "
                             "pick a divisor")
        if self.pos_embedding not in POS_EMBEDDINGS:
            raise InputError(f"model.pos_embedding={self.pos_embedding} is not one of {' | '.join(POS_EMBEDDINGS)}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LSTMConfig:
    vocab_size: int
    block_size: int = 64  # training window length and the longest context generate feeds back, tokens
    n_layer: int = 2
    n_embd: int = 256  # embedding and hidden size
    dropout: float = 0.0
    tie_weights: bool = True  # the output head shares the token embedding table

    def to_dict(self) -> dict:
        return asdict(self)


class LanguageModel(nn.Module):
    """What every model here has: token embeddings ``wte``, an output head ``lm_head`` (tied to ``wte`` with
    ``tie_weights``), the loss, sampling and the parameter count. Subclasses set ``kind`` and ``config_class``."""

    kind: str
    config_class: type

    def __init__(self, cfg: GPTConfig | LSTMConfig):
        super().__init__()
        self.config = cfg
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
        """Training FLOPs per token (forward + backward): 6 per parameter, plus attention for the GPT."""
        return 6 * self.num_params()

    def _head(self, x: torch.Tensor, targets: torch.Tensor | None):
        """Logits (B, T, V) from hidden states ``x`` (B, T, C); with ``targets`` (B, T) also the mean cross-entropy."""
        logits = self.lm_head(x)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled tokens; ``temperature`` 0 means greedy."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :]  # (B, V)
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


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, C/H)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class SinusoidalPositions(nn.Module):
    """The Transformer paper's fixed sin/cos position table, a buffer (not saved, not trained): pos (T,) → (T, C)."""

    def __init__(self, block_size: int, n_embd: int):
        super().__init__()
        pos = torch.arange(block_size, dtype=torch.float32)[:, None]  # (T, 1)
        freq = torch.exp(torch.arange(0, n_embd, 2, dtype=torch.float32) * (-math.log(10000.0) / n_embd))  # (⌈C/2⌉,)
        table = torch.zeros(block_size, n_embd)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq[: n_embd // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self.table[pos]


class GPT(LanguageModel):
    """A GPT decoder (nanoGPT-style): token + positional embeddings, causal self-attention blocks, output head."""

    kind, config_class = "gpt", GPTConfig

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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, V) for token ids ``idx`` (B, T); with ``targets`` (B, T) also the mean cross-entropy."""
        B, T = idx.shape
        assert T <= self.config.block_size, f"sequence of {T} tokens exceeds block_size {self.config.block_size}"
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self._head(self.ln_f(x), targets)

    def flops_per_token(self) -> float:
        """6N + 12·L·H·Q·T (PaLM's estimate, as nanoGPT): L layers, H heads, Q head size, T context."""
        c = self.config
        return super().flops_per_token() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size


class LSTMLM(LanguageModel):
    """A stacked LSTM language model: the architecture of the Spark+DL4J projects (GravesLSTM layers, softmax
    output), kept as a baseline for the GPT. It reads any length; ``generate`` re-reads the last block_size tokens."""

    kind, config_class = "lstm", LSTMConfig

    def __init__(self, cfg: LSTMConfig):
        super().__init__(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(cfg.n_embd, cfg.n_embd, cfg.n_layer, batch_first=True,
                            dropout=cfg.dropout if cfg.n_layer > 1 else 0.0)  # dropout between LSTM layers
        self.apply(self._init_weights)  # the LSTM keeps PyTorch's uniform init

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, V) for token ids ``idx`` (B, T); with ``targets`` (B, T) also the mean cross-entropy."""
        h, _ = self.lstm(self.drop(self.wte(idx)))  # (B, T, C)
        return self._head(self.drop(h), targets)


MODELS = {cls.kind: cls for cls in (GPT, LSTMLM)}


def _parse(spec: dict) -> tuple[type[LanguageModel], GPTConfig | LSTMConfig, str | None, bool]:
    """``spec`` → (model class, config, init_embeddings, freeze_embeddings); InputError for bad settings."""
    spec = dict(spec)
    kind = spec.pop("kind", "gpt")
    init_embeddings, freeze = spec.pop("init_embeddings", None), bool(spec.pop("freeze_embeddings", False))
    if kind not in MODELS:
        raise InputError(f"model.kind={kind} is not one of {' | '.join(MODELS)}; pick a preset, e.g. model=lstm")
    cls = MODELS[kind]
    allowed = [f.name for f in fields(cls.config_class)]
    unknown = [key for key in spec if key not in allowed]
    if unknown:
        raise InputError(f"model.kind={kind} has no setting {', '.join(unknown)} (it has {', '.join(allowed)}); "
                         f"remove it, or pick the preset model={kind} rather than overriding model.kind")
    if init_embeddings is not None and not Path(init_embeddings).is_file():
        raise _embeddings_error(init_embeddings, "no such file", "give a CSV or .npy file of token vectors")
    return cls, cls.config_class(**spec), init_embeddings, freeze


def check_model_spec(spec: dict) -> None:
    """Raise InputError for model settings that are wrong whatever the data; ``vocab_size`` may be absent."""
    _parse({"vocab_size": 1, **spec})


def build_model(spec: dict) -> LanguageModel:
    """The model ``spec`` asks for: ``kind`` ("gpt" | "lstm", default "gpt"), the fields of its config dataclass
    (``vocab_size`` included) and optionally ``init_embeddings`` (a file for ``read_embeddings``; ids it lacks keep
    their random init) and ``freeze_embeddings`` (no gradient for wte, nor for the head when tied)."""
    cls, cfg, init_embeddings, freeze = _parse(spec)
    model = cls(cfg)
    if init_embeddings is not None:
        ids, vectors = read_embeddings(init_embeddings, cfg.vocab_size, cfg.n_embd)
        with torch.no_grad():
            model.wte.weight[ids] = vectors.to(model.wte.weight)
    if freeze:
        model.wte.weight.requires_grad_(False)
    return model


def read_embeddings(path: str, vocab_size: int | None, n_embd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N,) and their vectors (N, n_embd) from ``path``, checked against the model.

    A ``.npy`` file holds an array (vocab_size, n_embd), row i for id i, or (rows, 1 + n_embd), the id first. Any
    other file is a CSV, one token per line: the id, then n_embd numbers; the first line may be a header. With
    ``vocab_size`` None (not known before the ETL) only the widths and the values are checked.
    """
    npy = str(path).endswith(".npy")
    fix = ("save an array of shape (vocab_size, n_embd) or (rows, 1 + n_embd) with numpy.save" if npy
           else "write one token per line: id,v1,...,vn (a header line first is allowed)")
    try:
        if npy:
            table = np.load(path, allow_pickle=False)
            if not np.issubdtype(table.dtype, np.number):
                raise ValueError(f"dtype {table.dtype}")
        else:
            with open(path) as f:
                header = not all(_is_number(cell) for cell in f.readline().split(","))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # an empty file: reported below as "no rows"
                table = np.loadtxt(path, delimiter=",", skiprows=int(header), ndmin=2)
    except ValueError as err:
        raise _embeddings_error(path, f"not a table of numbers ({str(err).split(';')[0]})", fix) from None
    if table.size == 0:
        raise _embeddings_error(path, "no rows", fix)
    if npy and table.ndim == 2 and table.shape[1] == n_embd and vocab_size in (None, table.shape[0]):
        ids, vectors = np.arange(table.shape[0]), table
    elif table.ndim == 2 and table.shape[1] == n_embd + 1:
        ids, vectors = table[:, 0], table[:, 1:]
    elif npy:
        full = f"({vocab_size or 'vocab_size'}, {n_embd})"
        raise _embeddings_error(path, f"an array of shape {table.shape} is neither (vocab_size, n_embd) = {full} "
                                f"nor (rows, 1 + n_embd) = (rows, {n_embd + 1})", fix)
    else:
        raise _embeddings_error(path, f"rows hold {table.shape[1] - 1} vector values but model.n_embd={n_embd}",
                                "give vectors of n_embd values or change model.n_embd")
    if not np.array_equal(ids, np.round(ids)):
        raise _embeddings_error(path, f"ids are not integers (e.g. {ids[ids != np.round(ids)][0]})",
                                "put integer token ids in the first column")
    ids = ids.astype(np.int64)
    outside = ids[(ids < 0) | (ids >= (vocab_size or np.iinfo(np.int64).max))]
    if outside.size:
        raise _embeddings_error(path, f"ids {outside[:5].tolist()} lie outside [0, vocab_size={vocab_size})",
                                "use the ids of this run's tokenizer")
    if len(np.unique(ids)) != len(ids):
        raise _embeddings_error(path, "an id appears on more than one row", "give each token one vector")
    if not np.isfinite(vectors).all():
        raise _embeddings_error(path, "vectors hold NaN or infinite values", "give finite numbers")
    return torch.from_numpy(ids), torch.as_tensor(vectors, dtype=torch.float32)


def _embeddings_error(path: str, problem: str, fix: str) -> InputError:
    return InputError(f"model.init_embeddings={path}: {problem}; {fix}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
