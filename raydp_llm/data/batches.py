"""Windows as the model reads them: (n, block_size + 1) stored tokens into a ``Batch`` of inputs,
targets and, for chat data, the positions of its packed conversations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.models.base import IGNORE


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor  # (B, T) int64 token ids
    targets: torch.Tensor  # (B, T) the next ids; IGNORE where the loss skips one
    positions: torch.Tensor | None  # (B, T) restarting at each conversation; None = 0..T-1

    def model_args(self) -> dict:
        """The keyword arguments of the model's forward for this batch."""
        return {"targets": self.targets, "positions": self.positions}

    @property
    def counted(self) -> torch.Tensor:
        """(B, T) bool: the targets the loss counts."""
        return self.targets != IGNORE


class WindowBatch:
    """Windows, (B, block_size + 1) stored tokens → a ``Batch`` on ``device``. A chat stream's
    words carry flags (data/chat/tokens.py): a target counts only where its token is trained,
    and positions restart where a conversation starts. A preference stream's window is a pair,
    two such records, the chosen answer's then the rejected one's (``pairs``): the batch holds
    the B chosen records' rows, then the B rejected ones' (2B rows), as
    training/objectives/dpo_loss.py reads
    them."""

    def __init__(self, device: torch.device, chat: bool = False, pairs: bool = False):
        self.device, self.chat, self.pairs = device, chat or pairs, pairs

    def __call__(self, windows: np.ndarray, lengths: np.ndarray | None = None) -> Batch:
        """``lengths`` (a plain stream's, evaluation's): each window's own tokens; the targets past
        them are padding, left out."""
        if self.pairs:  # (B, 2R) → (2B, R)
            windows = np.concatenate(np.split(windows, 2, axis=1))
        if not self.chat:
            w = self._tensor(windows)
            targets = w[:, 1:]
            if lengths is not None:
                padding = np.arange(targets.shape[1]) >= (lengths[:, None] - 1)
                targets = targets.masked_fill(self._tensor(padding).bool(), IGNORE)
            return Batch(w[:, :-1], targets, None)
        ids, train, start = chat_tokens.unpack(windows)
        targets = np.where(train[:, 1:], ids[:, 1:], IGNORE)
        # a pair's record is one sequence (its padding after it): plain causal attention
        where = None if self.pairs else self._tensor(positions(start[:, :-1]))
        return Batch(self._tensor(ids[:, :-1]), self._tensor(targets), where)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int64)).to(self.device, non_blocking=True)


def positions(start: np.ndarray) -> np.ndarray:
    """(B, T) each token's position in its conversation, from the conversation-start flags (B, T;
    a window starts with one)."""
    t = np.arange(start.shape[1])
    last_start = np.maximum.accumulate(np.where(start, t, 0), axis=1)
    return t - last_start
