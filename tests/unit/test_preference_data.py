"""Preference rows rendered and encoded as TRL does it (no Spark): each answer is the whole
conversation's rendering after the prompt's rendering with the generation prompt; the ids are a
Qwen2 tokenizer's (transformers') of the prompt, then of the answer; a pair is two records of
``block_size + 1`` flagged tokens, only the answers counted; what is skipped is counted."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from helpers.hf_models import CHAT_TEXTS as TEXTS
from helpers.hf_models import QWEN_CHAT as QWEN
from helpers.hf_models import chat_tokenizer
from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import load_tokenizer
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.chat.template import PAIR, resolve_template
from raydp_llm.data.preference.encode import PairEncoder
from raydp_llm.data.preference.pairs import PairRenderer, pair_sides

ROW = {"prompt": "What is a rose?", "chosen": "A flower.", "rejected": "A thorn, mostly."}
CONVERSATIONS = {
    "chosen": [{"role": "user", "content": "What is a rose?"},
               {"role": "assistant", "content": "A flower."}],
    "rejected": [{"role": "user", "content": "What is a rose?"},
                 {"role": "assistant", "content": "A thorn, mostly."}]}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import AutoTokenizer

    directory = chat_tokenizer(tmp_path_factory.mktemp("qwen"), TEXTS, QWEN)
    return directory, AutoTokenizer.from_pretrained(str(directory))


def render(qwen, rows: list, strict: bool = False) -> list[str]:
    directory, _ = qwen
    renderer = PairRenderer(resolve_template(None, str(directory)), "prompt", "chosen",
                            "rejected", strict)
    batch = pa.RecordBatch.from_pydict({
        "src": ["f.jsonl"] * len(rows), "block": [0] * len(rows),
        "text": [json.dumps(r).encode() for r in rows]})
    (out,) = list(renderer([batch]))
    return [t.decode() for t in out.column("text").to_pylist()]


def encode(qwen, texts: list[str], block: int = 63, **settings):
    directory, _ = qwen
    data = replace(DataSettings(), format="preference", **settings)
    batch = pa.RecordBatch.from_pydict({"src": ["f"] * len(texts), "block": [0] * len(texts),
                                        "doc": list(range(len(texts))),
                                        "raw": [t.encode() for t in texts]})
    encoder = PairEncoder(load_tokenizer(directory), block, data)
    (piece,) = [b.to_pylist()[0] for b in encoder([batch])]
    return piece, np.frombuffer(piece["tokens"], chat_tokens.DTYPE)


@pytest.mark.parametrize("row", [ROW, CONVERSATIONS], ids=["strings", "conversations"])
def test_each_side_is_the_prompt_then_the_rest_of_the_whole_rendering(qwen, row):
    """As TRL cuts them: the prompt rendered with the generation prompt; the answer the whole
    conversation's rendering after it (its end of turn included). Two whole conversations share
    their prompt: their first messages."""
    _, auto = qwen
    (text,) = render(qwen, [row])
    chosen, rejected = pair_sides(text)
    prompt = [{"role": "user", "content": "What is a rose?"}]
    assert chosen.prompt == rejected.prompt == auto.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=True)
    whole = auto.apply_chat_template(CONVERSATIONS["chosen"], tokenize=False)
    assert chosen.prompt + chosen.answer == whole
    assert chosen.answer == "A flower.<|im_end|>\n"
    assert rejected.answer == "A thorn, mostly.<|im_end|>\n"


def test_a_pair_is_two_records_of_the_transformers_ids_only_the_answers_counted(qwen):
    _, auto = qwen
    (text,) = render(qwen, [ROW])
    piece, words = encode(qwen, [text], block=63)
    assert piece["pairs"] == 1 and piece["n"] == len(words) == 2 * 64
    for side, record in zip(pair_sides(text), (words[:64], words[64:])):
        ids, train, start = chat_tokens.unpack(record)
        prompt = auto(side.prompt, add_special_tokens=False)["input_ids"]
        answer = auto(side.answer, add_special_tokens=False)["input_ids"]
        n = len(prompt) + len(answer)
        assert ids[:n].tolist() == prompt + answer  # TRL: the two tokenized apart
        assert train.tolist() == [False] * len(prompt) + [True] * len(answer) + [False] * (64 - n)
        assert start.tolist() == [True] + [False] * 63  # one sequence, its padding after it
    chosen_answer = len(auto(pair_sides(text)[0].answer, add_special_tokens=False)["input_ids"])
    assert piece["chosen_tokens"] == chosen_answer and piece["doc_start"] == [0]


def test_missing_identical_and_overlong_pairs_are_counted_or_refused(qwen):
    same = dict(ROW, rejected=ROW["chosen"])
    missing = dict(ROW, rejected="  ")
    long = dict(ROW, chosen="a rose " * 80)
    texts = render(qwen, [ROW, same, missing, long])
    assert texts[2] == PAIR  # no answer: left for the encoder to count
    piece, words = encode(qwen, texts, block=63)
    assert (piece["pairs"], piece["identical"], piece["incomplete"], piece["dropped"]) == \
        (1, 1, 1, 1)
    assert len(words) == 2 * 64
    truncated, words = encode(qwen, texts, block=63, overlong="truncate")
    assert truncated["pairs"] == 2 and truncated["truncated"] == 1 and len(words) == 4 * 64
    hashes = np.frombuffer(truncated["prompt_hashes"], np.int64)  # ROW and long share a prompt
    assert len(hashes) == 2 and hashes[0] == hashes[1]
    with pytest.raises(InputError, match=r"^f: row 4: a side of the pair has \d+ tokens, more "
                                         r"than model.block_size \+ 1 = 64; shorten it"):
        encode(qwen, texts, block=63, overlong="error")
    with pytest.raises(InputError, match=r"^f.jsonl: the row .* has no prompt with a non-empty "
                                         r"chosen and rejected"):
        render(qwen, [missing], strict=True)
