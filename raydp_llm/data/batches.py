"""Windows as the model reads them: (n, block_size + 1) token ids into (inputs, targets) tensors."""

from __future__ import annotations

import numpy as np
import torch


class WindowBatch:
    """Windows, (B, block_size + 1) ids → (inputs, targets), each (B, T) int64 on ``device``."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(windows.astype(np.int64)).to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]
