"""``dpo.reference=precomputed``: the reference's log-probabilities of every pair, computed once by
the workers before the first step (each its contiguous share of both splits, the policy then still
being the starting weights; gathered by all), looked up while training by the pair's tokens, and
kept in each checkpoint (``reference_logps.npz``), so that a resumed run, on any number of workers,
reads them instead of computing them again. No reference model stays in memory.

A pair's key is a digest of its two rows' ids and targets: the same pair read by any worker, in
any epoch, has the same key; two pairs alike in every token share their log-probabilities too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from raydp_llm.core.errors import RunFailure
from raydp_llm.data.batches import Batch
from raydp_llm.models.base import IGNORE
from raydp_llm.training.objectives.dpo_loss import PairLogps

FILE = "reference_logps.npz"  # in a checkpoint of a precomputed run
KEY_BYTES = 16


def starting_stamp(model_config, seed: int) -> str:
    """What names the starting weights: the model's config (its path or checkpoint among it) and
    the seed it was built with."""
    identity = json.dumps({"model": asdict(model_config), "seed": seed}, sort_keys=True,
                          default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def pair_keys(batch: Batch) -> list[bytes]:
    """A key per pair of ``batch`` (its chosen rows first, then its rejected rows)."""
    P = batch.inputs.size(0) // 2
    ids, targets = batch.inputs.cpu().numpy(), batch.targets.cpu().numpy()
    return [hashlib.blake2b(ids[i].tobytes() + ids[P + i].tobytes() + targets[i].tobytes()
                            + targets[P + i].tobytes(), digest_size=KEY_BYTES).digest()
            for i in range(P)]


class PrecomputedReference:
    """The table of every pair's reference log-probabilities (chosen, rejected), by key; a
    function of a batch like the model references (``objectives.reference_of``). ``stamp``
    names the starting weights the table is of: a table of other weights is refused."""

    def __init__(self, stamp: str):
        self.stamp, self.table = stamp, {}

    def __call__(self, batch: Batch) -> PairLogps:
        counted = (batch.targets != IGNORE).sum(dim=1)
        P = counted.numel() // 2
        values = []
        for key, tokens in zip(pair_keys(batch), counted[:P].tolist()):
            if key not in self.table and tokens:  # (an idle batch's pair counts nothing)
                raise RunFailure("dpo.reference=precomputed: a pair the precomputed "
                                 "log-probabilities do not hold (the data changed under the "
                                 "run?); start afresh, or use dpo.reference=model")
            values.append(self.table.get(key, (0.0, 0.0)))
        t = torch.tensor(values, dtype=torch.float32, device=batch.targets.device).view(P, 2)
        return PairLogps(t[:, 0], t[:, 1], counted[:P], counted[P:])

    def fill(self, batches: Iterable[Batch], logps: Callable[[Batch], PairLogps]) -> int:
        """This worker's share: ``logps`` (the starting weights') of every pair of ``batches``;
        returns how many batches that was."""
        ran = 0
        for ran, batch in enumerate(batches, start=1):
            ref = logps(batch)
            for key, c, r in zip(pair_keys(batch), ref.chosen.tolist(), ref.rejected.tolist()):
                self.table[key] = (c, r)
        return ran

    def gather(self) -> None:
        """Every worker's share in every worker's table."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return
        shares = [None] * dist.get_world_size()
        dist.all_gather_object(shares, self.table)
        self.table = {k: v for share in shares for k, v in share.items()}

    def save(self, directory: Path) -> None:
        keys = np.frombuffer(b"".join(self.table), dtype=np.uint8).reshape(-1, KEY_BYTES)
        values = np.array(list(self.table.values()), dtype=np.float32).reshape(-1, 2)
        np.savez(Path(directory) / FILE, keys=keys, values=values, stamp=np.array(self.stamp))

    def load(self, directory: Path) -> bool:
        """The table of a checkpoint, if it holds one (False: it holds none); a table of other
        starting weights is a one-line RunFailure."""
        path = Path(directory) / FILE
        if not path.is_file():
            return False
        with np.load(path) as saved:
            if str(saved["stamp"]) != self.stamp:
                raise RunFailure(f"dpo.reference=precomputed: {path} holds the log-probabilities "
                                 f"of other starting weights ({saved['stamp']}, this run's are "
                                 f"{self.stamp}); resume a checkpoint of this run, or start "
                                 "afresh")
            self.table = {k.tobytes(): (float(c), float(r))
                          for k, (c, r) in zip(saved["keys"], saved["values"])}
        return True
