"""Instruction tuning end to end on the real engines: a GPT trained on conversations replies to a
user turn and stops at the end of its turn (``generate chat=true``, and batch answers over a table
of turns or conversations); evaluate scores the same conversations packed and unpacked alike.
(Transformers' families see packed conversations apart: tests/unit/test_chat_training.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from helpers.configs import CACHE_DIR, NO_CHECK, make_config
from helpers.paths import ROOT
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.cli.answers import answer_table
from raydp_llm.cli.evaluate import run as evaluate
from raydp_llm.cli.keyvalue import parse_args
from raydp_llm.cli.train import run as train
from raydp_llm.core.config import GenerateSettings, SampleSettings
from raydp_llm.core.errors import InputError
from raydp_llm.data.chat.template import model_template
from raydp_llm.training.driver.generation import chat_reply

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

WORDS = ["apple", "river", "stone", "cloud", "ember", "grain", "frost", "maple", "tiger", "ocean"]


def conversations(n: int) -> list[dict]:
    """Questions that vary; the same short reply to each, which the model learns."""
    rows = []
    for i in range(n):
        word = WORDS[i % len(WORDS)] + WORDS[(i * 7) % len(WORDS)][: i % 5]
        rows.append({"prompt": f"Is {word} a word?", "response": "Yes."})
    return rows


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("chat")
    rows = conversations(600)
    (directory / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


@pytest.fixture(scope="module")
def chat_run(ray_cluster, chat_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("chat_run") / "run"
    summary = train(make_config(
        "data.format=chat", f"data.path={chat_data}", "model.block_size=256", "model.n_layer=2",
        "model.n_embd=64", "optim.lr=3e-3", "train.batch_size=16", "train.max_steps=150",
        "train.eval_interval=75", "train.checkpoint_interval=150", "sample.max_new_tokens=40",
        "sample.prompt=Is granite a word?", f"data.cache_dir={CACHE_DIR}", NO_CHECK), out)
    return {"out": out, "summary": summary}


def test_a_chat_model_replies_and_stops_at_the_end_of_its_turn(chat_run):
    model_dir = chat_run["out"] / "model"
    chat = model_template(model_dir)
    assert chat is not None and chat.end_of_turn() == "<|im_end|>"
    assert (chat_run["out"] / "samples.txt").read_text().strip() == "Yes."
    model, tokenizer = load_model_dir(model_dir)
    prompt = chat.render([{"role": "user", "content": "Is pebble a word?"}],
                         add_generation_prompt=True)
    idx = torch.as_tensor(tokenizer.encode(prompt).astype("int64"))[None, :]
    out = model.generate(idx, 200, temperature=0,
                         stop=lambda ids: "<|im_end|>" in tokenizer.decode(ids[0, idx.size(1):]))
    assert tokenizer.decode(out[0, idx.size(1):]) == "Yes.<|im_end|>"  # stopped there
    shown = subprocess.run([sys.executable, "-m", "raydp_llm.generate", f"model_dir={model_dir}",
                            "chat=true", "prompt=Is maple a word?", "temperature=0"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.strip() == "Yes.", shown.stderr


def evaluated(model_dir, data, tmp_path, packing: bool, *overrides) -> dict:
    cfg = make_config(f"model_dir={model_dir}", f"data.path={data}", "data.format=chat",
                      f"data.packing={str(packing).lower()}", f"data.cache_dir={CACHE_DIR}",
                      NO_CHECK, *overrides, config_name="evaluate")
    return evaluate(cfg, tmp_path / f"packed_{packing}")


def test_evaluate_scores_the_assistants_tokens_alike_packed_or_not(chat_run, chat_data,
                                                                   tmp_path):
    model_dir = chat_run["out"] / "model"
    packed = evaluated(model_dir, chat_data, tmp_path, True)
    unpacked = evaluated(model_dir, chat_data, tmp_path, False)
    chat = packed["etl"]["chat"]
    assert packed["tokens"] == unpacked["tokens"] == chat["tokens_trained"]
    assert packed["windows"] < unpacked["windows"] == chat["conversations"]
    assert packed["loss"] == pytest.approx(unpacked["loss"], abs=1e-3)
    assert packed["loss"] < 0.1  # the replies are learned


def test_batch_answers_reply_to_turns_and_conversations_and_stop_at_the_turns_end(chat_run,
                                                                                  tmp_path):
    """``generate data.path=... out=...`` on a chat model: a prompt column as user turns
    (``chat=true``) and a column of conversations (``data.messages_column``), each rendered with
    the model's template and answered until the end of the turn, as one-prompt ``chat_reply``."""
    model_dir = chat_run["out"] / "model"
    questions = ["Is pebble a word?", "Is maple a word?", "Is river a word?"]
    pq.write_table(pa.table({
        "prompt": questions,
        "messages": [[{"role": "user", "content": q}] for q in questions],
    }), tmp_path / "prompts.parquet")
    common = [f"model_dir={model_dir}", f"data.path={tmp_path / 'prompts.parquet'}",
              "max_new_tokens=40", "temperature=0", "rows_per_part=2", "actors=1"]
    answer_table(batch(*common, "chat=true", f"out={tmp_path / 'a'}"))
    answer_table(batch(*common, "data.messages_column=messages", f"out={tmp_path / 'b'}"))
    model, tokenizer = load_model_dir(model_dir)
    chat = model_template(model_dir)
    for out in (tmp_path / "a", tmp_path / "b"):
        rows = pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()
        assert [r["prompt"] for r in rows] == questions
        for r in rows:
            alone = chat_reply(model, tokenizer, chat, SampleSettings(
                prompt=r["prompt"], max_new_tokens=40, temperature=0.0), seed=0)
            assert r["completion"] == alone == "Yes."
            assert r["completion_tokens"] < 40  # stopped at the end of the turn
    with pytest.raises(InputError, match=r"^data.messages_column=turns: .* has no such column"):
        answer_table(batch(*common, "data.messages_column=turns", f"out={tmp_path / 'c'}"))


def batch(*args: str) -> GenerateSettings:
    """``generate``'s settings for batch answers, as its command line makes them."""
    return parse_args(GenerateSettings, list(args), required=("model_dir",))
