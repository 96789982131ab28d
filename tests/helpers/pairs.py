"""Preference pairs as the ETL stores them, made without Spark, for the worker's DPO tests (unit:
test_dpo_worker, test_fsdp): each pair two flagged records (data/chat/tokens.py) of a planted
preference, and a tiny GPT's DPO spec on them."""

from __future__ import annotations

import functools

import numpy as np

from helpers.chunks import chunked
from raydp_llm.core.config import DpoSettings, GPTConfig, OptimSettings, TrainSettings
from raydp_llm.core.tokenizer import IdsTokenizer
from raydp_llm.data import windows
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.stream import Sampling, SplitChunks, steps_per_epoch
from raydp_llm.training.spec import TrainSpec

VOCAB, PAD, BLOCK, PROMPT, ANSWER = 16, 15, 8, 3, 4
RECORD = BLOCK + 1  # a record; a pair is two
TRAIN_PAIRS, VAL_PAIRS, BATCH = 96, 32, 8


def record(prompt: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """A record as the ETL writes it: the prompt, the answer (the loss counts it), padding."""
    ids = np.concatenate([prompt, answer, np.full(RECORD - PROMPT - ANSWER, PAD)])
    train = np.zeros(RECORD, bool)
    train[PROMPT:PROMPT + ANSWER] = True
    start = np.zeros(RECORD, bool)
    start[[0, PROMPT + ANSWER]] = True
    return chat_tokens.pack(ids, train, start)


def planted_pairs(n: int, seed: int) -> np.ndarray:
    """``n`` pairs of a planted preference: the chosen answer repeats the prompt's first token,
    the rejected one is another token, repeated."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, 14, (n, PROMPT))
    chosen = np.repeat(prompts[:, :1], ANSWER, axis=1)
    rejected = (chosen + rng.integers(1, 14, (n, 1))) % 14
    return np.concatenate([np.concatenate([record(p, c), record(p, r)])
                           for p, c, r in zip(prompts, chosen, rejected)])


def pair_data() -> dict:
    """Each split's chunks of a stream of planted-preference pairs."""
    stream = np.concatenate([planted_pairs(TRAIN_PAIRS, 0), planted_pairs(VAL_PAIRS, 1)])
    n = len(stream)
    segments_of = functools.partial(windows.segments, n=n, split="tail",
                                    val_fraction=VAL_PAIRS / (TRAIN_PAIRS + VAL_PAIRS), seed=0,
                                    segment_tokens=8192)
    index, sources = chunked(stream, [n // 2, n - n // 2], segments_of, 8 * 2 * RECORD,
                             2 * RECORD)
    return {name: SplitChunks(sources[name], index[name]) for name in index}


def pair_spec(data, max_steps: int = 80, beta: float = 0.5, **train) -> TrainSpec:
    """A one-layer GPT (its dropout, off for DPO) tuned with DPO on ``pair_data``: 80 steps, an
    evaluation every 40."""
    sampling = {name: Sampling(2 * RECORD - 1, 2 * RECORD) for name in ("train", "val")}
    return TrainSpec(
        model=GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=1, n_head=2, n_embd=32,
                        dropout=0.2),
        optim=OptimSettings(lr=1e-2, warmup_steps=2),
        train=TrainSettings(**{"batch_size": BATCH, "max_steps": max_steps, "eval_interval": 40,
                                "eval_batches": None, "checkpoint_interval": 0,
                                "cpus_per_worker": 1, "objective": "dpo", **train}),
        seed=3, tokenizer_json=IdsTokenizer(VOCAB).to_json(), token_dtype="uint32",
        chars_per_token=None, sampling=sampling,
        steps_per_epoch=steps_per_epoch(sampling["train"].windows(data["train"].index), BATCH),
        max_steps=max_steps, fingerprint="d" * 20, dpo=DpoSettings(beta=beta))
