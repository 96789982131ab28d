"""The worker's loop in plain torch on a tiny in-memory corpus (tests/unit/test_loop.py; test_fsdp
and test_lora run the same run on other models): one CPU process of world size 1, a one-layer GPT,
token i = i mod 16."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import torch

from helpers.chunks import chunked
from raydp_llm.core.config import GPTConfig, OptimSettings, TrainSettings
from raydp_llm.core.tokenizer import IdsTokenizer
from raydp_llm.data import windows
from raydp_llm.data.stream import Sampling, SplitChunks, steps_per_epoch
from raydp_llm.training.objectives import Placement
from raydp_llm.training.spec import TrainSpec

N, VOCAB, BLOCK, BATCH = 200, 16, 8, 4  # 160 training tokens: 19 windows, 4 steps an epoch
CPU = Placement(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def tiny_data() -> dict:
    """Token i = i mod 16 (a pattern a model learns in a few steps), in two pieces: each split's
    chunk source and index, as a module-scoped ``data`` fixture gives them to ``Worker``."""
    segments_of = functools.partial(windows.segments, n=N, split="tail", val_fraction=40 / N,
                                    seed=0, segment_tokens=8192)
    stream = (np.arange(N) % VOCAB).astype(np.uint16)
    index, sources = chunked(stream, [120, 80], segments_of, 64, 16)
    return {name: SplitChunks(sources[name], index[name]) for name in index}


def spec(data, max_steps: int = 6) -> TrainSpec:
    """A one-layer GPT; an evaluation every 2 steps, a checkpoint every 4 and at the end."""
    sampling = {"train": Sampling(BLOCK, BLOCK), "val": Sampling(BLOCK, BLOCK)}
    return TrainSpec(
        model=GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=1, n_head=2, n_embd=16),
        optim=OptimSettings(lr=1e-2, min_lr=1e-3, warmup_steps=2),
        train=TrainSettings(batch_size=BATCH, grad_accum=2, max_steps=max_steps, eval_interval=2,
                            eval_batches=2, checkpoint_interval=4, cpus_per_worker=1),
        seed=3,
        tokenizer_json=IdsTokenizer(VOCAB).to_json(),
        token_dtype="uint16",
        chars_per_token=2.0,
        sampling=sampling,
        steps_per_epoch=steps_per_epoch(sampling["train"].windows(data["train"].index), BATCH),
        max_steps=max_steps,
        fingerprint="f" * 20,
    )


class Reports:
    """What the loop reports, as Ray Train would get it; each checkpoint copied to ``keep``."""

    def __init__(self, keep: Path):
        self.rows, self.checkpoints, self.keep = [], {}, keep

    def __call__(self, metrics: dict, checkpoint: Path | None = None) -> None:
        self.rows.append(metrics)
        if checkpoint is not None:
            target = self.keep / f"checkpoint_{metrics['step']}"
            shutil.copytree(checkpoint, target)
            self.checkpoints[metrics["step"]] = target
