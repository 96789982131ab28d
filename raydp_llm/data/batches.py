"""Windows as the model reads them: raw window bytes (``block_size + 1`` ids each, as the ETL writes
them) into (inputs, targets) tensors, and a dataset's windows read back from its Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.dataset as pads
import torch


class WindowBatch:
    """Raw window bytes (an array of ``block_size + 1`` ids each) → (inputs, targets), each (B, T)
    int64."""

    def __init__(self, dtype: str, block_size: int, device: torch.device):
        self.dtype, self.width, self.device = np.dtype(dtype), block_size + 1, device

    def __call__(self, windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = np.frombuffer(b"".join(windows), dtype=self.dtype).reshape(-1, self.width)
        w = torch.from_numpy(w.astype(np.int64)).to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]


def read_windows(split_dir: Path, batch_size: int) -> Iterator[np.ndarray]:
    """The raw windows (bytes) of one split of an ETL dataset, at most ``batch_size`` at a time."""
    for batch in pads.dataset(split_dir, format="parquet").to_batches(
        columns=["tokens"], batch_size=batch_size
    ):
        if batch.num_rows:
            yield np.array(batch.column("tokens").to_pylist(), dtype=object)
