"""Text from a model: a prompt continued (seeded, with temperature and top-k), and the likeliest
next tokens."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.nn import functional as F

from raydp_llm.core.config import SampleSettings
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data.chat.template import ChatTemplate
from raydp_llm.models.base import LanguageModel


def prompt_ids(model: LanguageModel, tokenizer: Tokenizer, prompt: str) -> torch.Tensor:
    """``prompt`` as token ids (1, T) on the model's device; a prompt of no tokens (a newline, to
    some tokenizers) starts a new document: the ids between documents."""
    ids = tokenizer.encode(prompt)
    if len(ids) == 0:
        ids = np.asarray(tokenizer.separator(), dtype=np.int64)
    if len(ids) == 0:
        raise ValueError("the prompt is empty; give at least one token of text")
    return torch.as_tensor(ids.astype("int64"), device=model.wte.weight.device)[None, :]


def sample_text(
    model: LanguageModel,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
) -> str:
    """``prompt`` continued by the model; the same seed gives the same text."""
    idx = prompt_ids(model, tokenizer, prompt)
    gen = torch.Generator(device=idx.device).manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist())


def chat_reply(model: LanguageModel, tokenizer: Tokenizer, chat: ChatTemplate,
               sample: SampleSettings, seed: int) -> str:
    """The model's reply to ``sample.prompt`` as a user turn: the conversation rendered with the
    chat template and its generation prompt, continued (as ``sample`` says) until the model ends
    its turn (the template's end-of-turn text); the reply without the end of its turn."""
    messages = [{"role": "user", "content": sample.prompt}]
    rendered = chat.render(messages, add_generation_prompt=True)
    idx = prompt_ids(model, tokenizer, rendered)
    start = idx.size(1)
    gen = torch.Generator(device=idx.device).manual_seed(seed)
    end = chat.end_of_turn()
    out = model.generate(idx, sample.max_new_tokens, temperature=sample.temperature,
                         top_k=sample.top_k, generator=gen, stop=turn_stop(tokenizer, start, end))
    return tokenizer.decode(out[0, start:].tolist()).split(end, 1)[0]


def turn_stop(tokenizer: Tokenizer, start: int, end: str) -> Callable[[torch.Tensor], bool]:
    """``generate``'s stop for a chat reply: true once the text after the prompt's ``start``
    tokens holds the turn's ``end``."""
    return lambda ids: end in tokenizer.decode(ids[0, start:].tolist())


@torch.no_grad()
def top_next_tokens(
    model: LanguageModel, tokenizer: Tokenizer, prompt: str, k: int
) -> list[tuple[str, float]]:
    """The ``k`` most likely tokens right after ``prompt``, decoded, with their probabilities, most
    likely first."""
    logits, _ = model(prompt_ids(model, tokenizer, prompt)[:, -model.config.block_size:])
    probs, ids = F.softmax(logits[0, -1].float(), dim=-1).topk(min(k, logits.size(-1)))
    return [(tokenizer.decode([i]), p) for i, p in zip(ids.tolist(), probs.tolist())]
