"""Chat data on the training side: windows of flagged tokens (data/chat/tokens.py) become inputs,
targets the loss counts, and positions that restart at each packed conversation; a packed
conversation sees only itself (the GPT's block-diagonal mask, transformers' packed position ids);
the loss learns only what ``data.train_on`` keeps."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from helpers.chunks import chunked
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.core.config import GPTConfig, OptimSettings, TrainSettings
from raydp_llm.data import windows
from raydp_llm.data.batches import WindowBatch
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.stream import Sampling, SplitChunks, steps_per_epoch
from raydp_llm.models.base import IGNORE
from raydp_llm.models.factory import build_model
from raydp_llm.training.objectives import Placement
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.worker.worker import Worker

CPU = Placement(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_a_window_of_flagged_tokens_becomes_targets_and_restarting_positions():
    ids = np.array([[5, 6, 7, 8, 9, 10, 11, 1]])
    train = np.array([[0, 0, 1, 1, 0, 0, 1, 0]], bool)
    start = np.array([[1, 0, 0, 0, 1, 0, 0, 1]], bool)  # two conversations, then a pad
    batch = WindowBatch(torch.device("cpu"), chat=True)(chat_tokens.pack(ids, train, start))
    assert batch.inputs.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert batch.targets.tolist() == [[IGNORE, 7, 8, IGNORE, IGNORE, 11, IGNORE]]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    plain = WindowBatch(torch.device("cpu"))(ids.astype(np.uint16))
    assert plain.positions is None and plain.targets.tolist() == [[6, 7, 8, 9, 10, 11, 1]]


def packed_equals_alone(model: torch.nn.Module, vocab: int, lengths=(9, 5, 2)) -> None:
    """Logits of sequences packed in one row, each with its own positions, equal each sequence's
    logits alone."""
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, vocab, (1, n), generator=gen) for n in lengths]
    positions = torch.cat([torch.arange(n) for n in lengths])[None, :]
    with torch.no_grad():
        packed, _ = model(torch.cat(seqs, dim=1), positions=positions)
        alone = torch.cat([model(s)[0] for s in seqs], dim=1)
        crossed, _ = model(torch.cat(seqs, dim=1))  # unpacked: the later ones see the first
    assert torch.allclose(packed, alone, atol=1e-5), (packed - alone).abs().max()
    assert not torch.allclose(crossed[:, lengths[0]:], alone[:, lengths[0]:], atol=1e-3)


@pytest.mark.parametrize("pos_embedding", ["learned", "sinusoidal"])
def test_the_gpts_packed_sequences_see_only_themselves(pos_embedding):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16,
                    pos_embedding=pos_embedding)
    packed_equals_alone(build_model(cfg).eval(), 50)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_transformers_packed_sequences_see_only_themselves(hf_families, family):
    model, _ = load_model_dir(hf_families[family])
    packed_equals_alone(model, 300)


# ------------------------------------------------------------- the loss learns what the mask keeps

BLOCK, CONVERSATIONS = 15, 240
HEADER, REPLY = [1, 2], [3, 4, 5, 6, 7, 8]  # every user turn's header; every reply (learnable)


def planted(train_on: str, seed: int = 0) -> np.ndarray:
    """Records of BLOCK + 1 tokens, each one conversation: a header, a user turn of random ids
    (nothing predicts them), and the same assistant reply (everything predicts it)."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(CONVERSATIONS):
        user = rng.integers(10, 60, BLOCK + 1 - len(HEADER) - len(REPLY))
        ids = np.concatenate([HEADER, user, REPLY])
        reply = np.arange(len(ids)) >= len(ids) - len(REPLY)
        train = reply if train_on == "assistant" else np.arange(len(ids)) > 0
        records.append(chat_tokens.pack(ids, train, np.arange(len(ids)) == 0))
    return np.concatenate(records)


def worker_on(stream: np.ndarray, steps: int) -> Worker:
    n = len(stream)
    segments_of = functools.partial(windows.segments, n=n, split="tail", val_fraction=0.25,
                                    seed=0, segment_tokens=8192)
    index, sources = chunked(stream, [n], segments_of, 16 * 20, 16)
    data = {name: SplitChunks(sources[name], index[name]) for name in index}
    sampling = {name: Sampling(BLOCK, BLOCK + 1) for name in index}
    spec = TrainSpec(
        model=GPTConfig(vocab_size=64, block_size=BLOCK, n_layer=2, n_head=2, n_embd=32),
        optim=OptimSettings(lr=3e-3, min_lr=3e-4, warmup_steps=5),
        train=TrainSettings(batch_size=16, max_steps=steps), seed=0, tokenizer_json="",
        token_dtype="uint32", chars_per_token=None, sampling=sampling,
        steps_per_epoch=steps_per_epoch(sampling["train"].windows(index["train"]), 16),
        max_steps=steps, fingerprint="x", chat_template="")
    return Worker(spec, data, CPU)


def trained_loss(train_on: str) -> tuple[float, int]:
    """The validation loss over the tokens ``train_on`` keeps after 150 steps, and their count."""
    worker = worker_on(planted(train_on), 150)
    step = 0
    while step < 150:
        for group in worker.data.steps(step // worker.spec.steps_per_epoch, 0):
            worker.train_step(group, 3e-3)
            step += 1
    loss_sum, _, count = worker.objective.validation_pass(worker.data)
    return loss_sum / count, count


def test_only_the_assistants_turns_are_learned_when_only_they_count():
    """Replies are the same in every conversation, user turns random: counting the replies alone
    the loss falls near zero; counting every token it cannot (the user turns cost ~log 50)."""
    assistant, counted = trained_loss("assistant")
    everything, all_counted = trained_loss("all")
    assert counted == 60 * len(REPLY) and all_counted == 60 * BLOCK  # the validation quarter
    assert assistant < 0.05, assistant
    assert everything > 1.5, everything
