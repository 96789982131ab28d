"""``data.format=chat`` through the Spark ETL on the real engines: conversations from JSON Lines and
Parquet rendered, packed into records of ``block_size + 1`` flagged tokens, counted in the manifest,
and bad input refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.configs import make_config
from helpers.etl import cut_windows
from helpers.hf_models import CHAT_TEXTS, QWEN_CHAT, chat_tokenizer
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.data import cache
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.etl.handoff import to_parquet
from raydp_llm.data.etl.records import EtlPlan
from raydp_llm.data.prepare import _run_etl
from raydp_llm.training.spec import windows_of

pytestmark = pytest.mark.integration

BLOCK = 255  # records of 256 tokens


def conversation(i: int) -> list[dict]:
    """Conversation ``i``: one or two exchanges; every 7th is long (more than a record)."""
    answer = "yes, " * (60 if i % 7 == 3 else 1) + f"number {i}"
    turns = [{"role": "user", "content": f"q{i}?"}, {"role": "assistant", "content": answer}]
    return turns + turns if i % 2 else turns


def etl(spark, tmp_path, *overrides):
    cfg = make_config(f"model.block_size={BLOCK}", f"data.path={tmp_path}", "data.format=chat",
                      "data.val_fraction=0.25", *overrides)
    out = _run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)), lambda *_: None)
    out.windows = windows_of(cfg, out.index, out.manifest).to_json()
    out.settings = cfg
    return out


def test_jsonl_conversations_pack_into_records(spark, tmp_path):
    rows = [{"messages": conversation(i)} for i in range(40)]
    rows.append({"messages": [{"role": "user", "content": "no answer"}]})
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = etl(spark, tmp_path)
    m = out.manifest.to_json()
    chat = m["chat"]
    assert m["token_dtype"] == "uint32" and chat["template"] == "chatml"
    assert chat["end_of_turn"] == "<|im_end|>" and chat["flag_bytes_per_token"] == 2
    long = sum(1 for i in range(40) if i % 7 == 3)
    assert chat["dropped"] == long and chat["no_assistant"] == 1 and chat["truncated"] == 0
    assert chat["conversations"] == 40 - long == m["documents"]
    assert chat["turns"] == sum(1 + i % 2 for i in range(40) if i % 7 != 3)
    assert m["tokens"] % (BLOCK + 1) == 0
    assert m["tokens"] == chat["tokens_trained"] + chat["tokens_masked"] + chat["padding_tokens"]
    assert out.windows["stride"] == out.windows["val_stride"] == BLOCK + 1
    windows = cut_windows(out)
    total = sum(len(w) for w in windows.values())
    assert total * (BLOCK + 1) == m["tokens"] and windows["val"]
    for start, window in windows["train"] + windows["val"]:
        ids, train, first = chat_tokens.unpack(np.frombuffer(window, chat_tokens.DTYPE))
        assert start % (BLOCK + 1) == 0 and len(ids) == BLOCK + 1 and first[0] and not train[0]
    decoded = out.tokenizer.decode(ids[train])
    assert decoded.endswith("<|im_end|>\n") and "user" not in decoded
    # the cache entry holds the flagged words and reads back the chat entry
    entry = cache.commit(to_parquet(out, tmp_path / "cache", "key"), {})
    index, _, manifest, _ = cache.read_entry(entry)
    assert manifest.chat == chat and len(index["train"]) == len(out.index["train"])


def test_parquet_prompt_response_with_bpe(spark, tmp_path):
    prompts = [f"q{i}?" for i in range(30)]
    responses = ["yes, " * (300 if i == 5 else 1) + f"number {i}" for i in range(30)]
    pq.write_table(pa.table({"prompt": prompts, "response": responses, "id": list(range(30))}),
                   tmp_path / "chat.parquet")
    out = etl(spark, tmp_path, "tokenizer=bpe", "tokenizer.vocab_size=300",
              "data.overlong=truncate", "data.packing=false", "data.train_on=all")
    chat = out.manifest.to_json()["chat"]
    assert chat["truncated"] == 1 and chat["dropped"] == 0 and chat["conversations"] == 30
    assert out.manifest.tokens == 30 * (BLOCK + 1)  # one conversation per record
    assert len(out.tokenizer.encode("<|im_start|><|im_end|>")) == 2


def test_model_tokenizer_and_template_give_transformers_ids(spark, tmp_path):
    from transformers import AutoTokenizer

    model = chat_tokenizer(tmp_path / "model", CHAT_TEXTS, QWEN_CHAT)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"messages": conversation(i)} for i in range(12) if i % 7 != 3]
    (corpus / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = etl(spark, corpus, "tokenizer=bpe", f"tokenizer.path={model}", "data.packing=false")
    assert out.manifest.to_json()["chat"]["template"] == "model"
    auto = AutoTokenizer.from_pretrained(str(model))
    train = cut_windows(out)["train"]
    assert len(train) >= 5
    for start, window in train:
        ids, _, first = chat_tokens.unpack(np.frombuffer(window, chat_tokens.DTYPE))
        end = int(np.flatnonzero(first)[1]) if first.sum() > 1 else len(ids)
        expected = auto.apply_chat_template(rows[start // (BLOCK + 1)]["messages"])
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert ids[:end].tolist() == list(expected)


def test_bad_input_is_one_line(spark, tmp_path):
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "chat.parquet")
    with pytest.raises(InputError, match="^data.messages_column=messages: no such column"):
        etl(spark, tmp_path)
    (tmp_path / "chat.parquet").unlink()
    bad = tmp_path / "chat.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(InputError, match=r"chat.jsonl: the row .*: the chat template \(file\) "
                                         "refuses the conversation: unknown role robot"):
        template = tmp_path.parent / "refusing.jinja"
        template.write_text("{% for m in messages %}{% if m['role'] == 'robot' %}"
                            "{{ raise_exception('unknown role robot') }}{% endif %}"
                            "{{ m['content'] }}{% endfor %}")
        etl(spark, tmp_path, f"data.chat_template={template}")
    bad.write_text(json.dumps({"messages": conversation(3)}) + "\n")
    with pytest.raises(InputError, match=r"chat.jsonl: row 1: the conversation has \d+ tokens, "
                                         "more than model.block_size"):
        etl(spark, tmp_path, "data.overlong=error")
    with pytest.raises(InputError, match="^data.sampling=random: data.format=chat"):
        etl(spark, tmp_path, "data.sampling=random")


def test_a_tokenizer_whose_offsets_miss_the_text_is_one_line(spark, tmp_path, hf_families):
    """The tiny Llama's tokenizer drops white space (a byte-level vocabulary in a SentencePiece
    pipeline): its offsets cannot place the assistant's tokens, which would silently train
    nothing."""
    rows = [{"prompt": "Is apple a word?", "response": "Yes."}] * 4
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"chat\.jsonl: row 1: no token of the assistant's turns"):
        etl(spark, tmp_path, "tokenizer=bpe", f"tokenizer.path={hf_families['llama']}",
            "data.chat_template=chatml")


def test_preference_pairs_are_two_records_of_transformers_ids(spark, tmp_path):
    """``data.format=preference`` through Spark: each kept pair two records (the chosen side, then
    the rejected), one window; each side the model tokenizer's ids of the prompt rendered with the
    generation prompt, then of the answer (as TRL cuts them), only the answer's tokens counted;
    the pairs skipped are counted; a Parquet file's columns render alike."""
    from transformers import AutoTokenizer

    model = chat_tokenizer(tmp_path / "model", CHAT_TEXTS, QWEN_CHAT)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"prompt": f"q{i}?", "chosen": f"yes, number {i}", "rejected": f"no, {i}"}
            for i in range(12)]
    skipped = [{"prompt": "same?", "chosen": "a", "rejected": "a"},
               {"prompt": "none?", "chosen": "x"}]
    again = [{"prompt": "q0?", "chosen": "yes, zero", "rejected": "no"}]  # a prompt seen before
    (corpus / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                for r in rows + skipped + again))
    more = [{"prompt": f"p{i}?", "chosen": f"sure {i}", "rejected": "never"} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(more), corpus / "more.parquet")
    cfg = make_config(f"model.block_size={BLOCK}", f"data.path={corpus}",
                      "data.format=preference", "train.objective=dpo", "data.val_fraction=0.25",
                      "tokenizer=bpe", f"tokenizer.path={model}")
    out = _run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)), lambda *_: None)
    out.windows = windows_of(cfg, out.index, out.manifest).to_json()
    out.settings = cfg
    chat = out.manifest.to_json()["chat"]
    assert (chat["pairs"], chat["identical"], chat["incomplete"]) == (17, 1, 1)
    assert chat["prompts"] == 16 and out.manifest.tokens == 17 * 2 * (BLOCK + 1)
    assert out.windows["stride"] == out.windows["val_stride"] == 2 * (BLOCK + 1)
    auto = AutoTokenizer.from_pretrained(str(model))
    by_pair = {(r["prompt"], r["chosen"]): r for r in rows + more + again}
    windows = cut_windows(out)
    assert sum(len(w) for w in windows.values()) == 17 and windows["val"]
    for _, window in windows["train"] + windows["val"]:
        words = np.frombuffer(window, chat_tokens.DTYPE)
        sides = [chat_tokens.unpack(half) for half in np.split(words, 2)]
        prompt = auto.decode(sides[0].ids[:int(np.argmax(sides[0].train))])  # before the answer
        chosen = auto.decode(sides[0].ids[sides[0].train])
        row = by_pair[(prompt.split("user\n")[1].split("<|im_end|>")[0],
                       chosen.split("<|im_end|>")[0])]
        _assert_cut_as_trl_cuts(auto, sides, row)


def _assert_cut_as_trl_cuts(auto, sides, row: dict) -> None:
    """Each side of ``row``'s pair: the tokenizer's ids of the prompt rendered with the generation
    prompt, then of the rest of the whole rendering; only the latter counted."""
    for side, answer in zip(sides, (row["chosen"], row["rejected"])):
        messages = [{"role": "user", "content": row["prompt"]}]
        head = auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        whole = auto.apply_chat_template(messages + [{"role": "assistant", "content": answer}],
                                         tokenize=False)
        expected = auto(head, add_special_tokens=False)["input_ids"]
        tail = auto(whole[len(head):], add_special_tokens=False)["input_ids"]
        n = len(expected) + len(tail)
        assert side.ids[:n].tolist() == expected + tail
        assert side.train.tolist() == [False] * len(expected) + [True] * len(tail) + \
            [False] * (BLOCK + 1 - n)
