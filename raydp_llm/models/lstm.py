"""An LSTM language model: the baseline beside the GPT, with its state carried between generated
tokens.

Shapes: B batch, T time, C n_embd, L n_layer, V vocab_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from raydp_llm.core.model_config import LSTMConfig
from raydp_llm.models.base import LanguageModel, kept


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
                positions: torch.Tensor | None = None, keep: int | None = None,
                pads: torch.Tensor | None = None, temperature: float = 1.0):
        """Logits (B, T, V) for token ids ``idx`` (B, T) and None; with ``targets`` (B, T) None
        and their scores (``token_scores``, logits divided by ``temperature``). ``positions``
        mean nothing to a recurrence: packed sequences are refused for the LSTM
        (core/checks.py); one padded sequence per window needs none. ``keep``: the last ``keep``
        positions alone. No left padding (``pads``): the state would read it."""
        assert pads is None, "the LSTM reads no left-padded prompts"
        h, _ = self.lstm(self.drop(self.wte(idx)))  # (B, T, C)
        return self._head(kept(self.drop(h), keep), targets, temperature)

    def next_logits(self, idx: torch.Tensor, state: LSTMState | None = None,
                    pads: torch.Tensor | None = None):
        """Carried (h, c) while the window holds every token so far; once it slides, the window
        is re-read from a zero state, as without carried state. No left padding: the state would
        read it."""
        assert pads is None, "the LSTM reads no left-padded prompts"
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

