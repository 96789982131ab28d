"""Chat rows rendered and encoded as transformers does it (no Spark): the text equals
``apply_chat_template(tokenize=False)``, the ids its ``tokenize=True``, the masks keep what
``data.train_on`` says, and the encoder packs records of ``block_size + 1`` flagged tokens."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from helpers.hf_models import CHAT_TEXTS as TEXTS
from helpers.hf_models import QWEN_CHAT as QWEN
from helpers.hf_models import chat_tokenizer
from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer, load_tokenizer
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.chat.encode import ChatEncoder, token_starts, trained
from raydp_llm.data.chat.template import Renderer, marked, resolve_template, unmarked

CHAT = [{"role": "user", "content": "What is a rose?"},
        {"role": "assistant", "content": "A flower, sweet by any name."},
        {"role": "user", "content": "And a thorn?"},
        {"role": "assistant", "content": "Its guard."}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny Qwen2 tokenizer with a chat template, saved as a model directory."""
    from transformers import AutoTokenizer

    directory = chat_tokenizer(tmp_path_factory.mktemp("qwen"), TEXTS, QWEN)
    return directory, AutoTokenizer.from_pretrained(str(directory))


def test_render_equals_transformers(qwen):
    directory, auto = qwen
    template = resolve_template(None, str(directory))
    assert template.name == "model" and template.end_of_turn() == "<|im_end|>"
    text, spans = unmarked(marked(template, CHAT, "row"))
    assert text == auto.apply_chat_template(CHAT, tokenize=False)
    assert [text[a:b] for a, b in spans] == ["A flower, sweet by any name.<|im_end|>\n",
                                             "Its guard.<|im_end|>\n"]


def test_ids_equal_transformers_and_masks(qwen):
    directory, auto = qwen
    text, spans = unmarked(marked(resolve_template(None, str(directory)), CHAT, "row"))
    ((ids, starts),) = token_starts(load_tokenizer(directory), [text])
    expected = auto.apply_chat_template(CHAT, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert ids.tolist() == list(expected)
    assistant = trained(starts, spans, "assistant")
    assert auto.decode(ids[assistant]) == ("A flower, sweet by any name.<|im_end|>\n"
                                           "Its guard.<|im_end|>\n")
    assert auto.decode(ids[trained(starts, spans, "last")]) == "Its guard.<|im_end|>\n"
    everything = trained(starts, spans, "all")
    assert not everything[0] and everything[1:].all()


def test_chatml_and_bad_rows():
    template = resolve_template("chatml", None)
    text, _ = unmarked(marked(template, CHAT[:2], "row"))
    assert text.startswith("<|im_start|>user\nWhat is a rose?<|im_end|>\n<|im_start|>assistant\n")
    render = Renderer(template, "messages", "prompt", "response")
    assert render._render("f", '{"prompt": "hi", "response": "yo"}').endswith(
        "<|im_start|>assistant\n\ue000yo<|im_end|>\n\ue001")
    with pytest.raises(InputError, match=r"^f: the row .* has no messages list"):
        render._render("f", '{"text": "hi"}')
    with pytest.raises(InputError, match="an assistant turn is empty"):
        render._render("f", '{"prompt": "hi", "response": " "}')
    refusing = resolve_template(None, None)
    refusing = replace(refusing, text=QWEN)
    with pytest.raises(InputError, match="refuses the conversation: unknown role robot"):
        marked(refusing, [{"role": "robot", "content": "x"}], "f: row 3")


def encode(rows: list[str], block: int, **settings) -> tuple[list, np.ndarray]:
    """The chat encoder on ``rows`` (marked conversations) of one input split: its pieces' rows and
    their stored words."""
    tok = CharTokenizer("".join(unmarked(r)[0] for r in rows) + "\n")
    data = replace(DataSettings(), format="chat", **settings)
    batch = pa.RecordBatch.from_pydict({"src": ["f"] * len(rows), "block": [0] * len(rows),
                                        "doc": list(range(len(rows))),
                                        "raw": [r.encode() for r in rows]})
    pieces = [b.to_pylist()[0] for b in ChatEncoder(tok, block, data)([batch])]
    words = np.concatenate([np.frombuffer(p["tokens"], chat_tokens.DTYPE) for p in pieces])
    return pieces, words


def test_packing_records_and_counts():
    rows = ["ab\ue000cd\ue001", "e\ue000fgh\ue001", "ijklmnop\ue000q\ue001", "\ue000rs\ue001"]
    pieces, words = encode(rows, block=7)  # records of 8 tokens
    (piece,) = pieces
    assert piece["n"] == len(words) == 16 and len(words) % 8 == 0
    ids, train, start = chat_tokens.unpack(words)
    # record 1: abcd, efgh, (ijklmnopq is 9 > 8: dropped); record 2: rs and 6 padding tokens
    assert start.tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0]
    assert train.tolist() == [0, 0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    assert piece["dropped"] == 1 and piece["conversations"] == 3 and piece["padding_tokens"] == 6
    assert piece["tokens_trained"] == 6 and piece["tokens_masked"] == 4 and piece["turns"] == 3
    assert piece["doc"] == [0, 1, 3] and piece["doc_start"] == [0, 4, 8]


def test_unpacked_truncated_and_overlong_error():
    rows = ["ab\ue000cd\ue001", "ijklmnop\ue000q\ue001", "plain, no assistant"]
    pieces, words = encode(rows, block=7, packing=False, overlong="truncate")
    ids, train, start = chat_tokens.unpack(words)
    assert len(words) == 16 and start.tolist()[:8] == [1, 0, 0, 0, 1, 0, 0, 0]
    assert start[8:].tolist() == [1, 0, 0, 0, 0, 0, 0, 0] and not train[8:].any()
    (piece,) = pieces
    assert piece["truncated"] == 1 and piece["no_assistant"] == 1 and piece["padding_tokens"] == 4
    with pytest.raises(InputError, match=r"^f: row 2: the conversation has 9 tokens, more than "
                                         r"model.block_size \+ 1 = 8"):
        encode(rows, block=7, overlong="error")


def test_cache_key_holds_the_record_and_template_for_chat_alone(tmp_path):
    from helpers.configs import make_config
    from raydp_llm.data.cache import cache_key
    from raydp_llm.data.etl.records import EtlPlan
    from raydp_llm.data.inputs.files import Corpus
    from raydp_llm.data.prepare import chat_key, etl_tokenizer

    corpus = Corpus([], False, "chat")

    def key(*overrides):
        cfg = make_config(*overrides)
        tokenizer = etl_tokenizer(cfg.tokenizer)
        plan = EtlPlan.of(cfg, corpus, tokenizer)
        return cache_key(corpus, cfg.data, tokenizer, cfg.seed, chat_key(plan))

    plain = make_config()
    assert chat_key(EtlPlan.of(plain, corpus, etl_tokenizer(plain.tokenizer))) is None
    assert key("model.block_size=32") == key("model.block_size=64")  # text: windows when read
    chat = ("data.format=chat",)
    assert key(*chat, "model.block_size=32") != key(*chat, "model.block_size=64")
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert key(*chat, f"data.chat_template={template}") != key(*chat)
