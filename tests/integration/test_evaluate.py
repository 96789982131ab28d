"""Evaluation of a model directory on a corpus through the real ETL, checked against a direct torch
computation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from helpers.configs import make_config
from helpers.etl import every_token_scores, stream_of
from raydp_llm.checkpoint.model_dir import load_model_dir, save_model_dir
from raydp_llm.cli.evaluate import run
from raydp_llm.core.config import GPTConfig
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.models.factory import build_model

pytestmark = pytest.mark.integration

BLOCK = 16


def model_dir(directory: Path, chars: str) -> Path:
    """An untrained tiny GPT with a char tokenizer over ``chars`` (newline added): no training
    needed."""
    tokenizer = CharTokenizer("\n" + chars)
    torch.manual_seed(0)
    model = build_model(
        GPTConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=1, n_head=2, n_embd=32)
    )
    return save_model_dir(directory, model, tokenizer)


@pytest.fixture(scope="module")
def evaluated(ray_cluster, corpus_dir, tmp_path_factory) -> dict:
    """One evaluation of an untrained model on the corpus, documents scored too, asserted both ways
    below: its result, its directory, the model's directory and the corpus's characters."""
    out = tmp_path_factory.mktemp("evaluate")
    chars = "".join(set().union(*(p.read_text() for p in corpus_dir.iterdir())))
    model_path = model_dir(out / "model", chars)
    cfg = make_config(f"model_dir={model_path}", f"data.path={corpus_dir}", "eval_batch_size=7",
                      "per_document=true", f"output.table={out / 'scores'}", config_name="evaluate")
    return {"result": run(cfg, out), "out": out, "model": model_path, "chars": chars}


@pytest.mark.slow
def test_evaluate_matches_a_direct_computation(evaluated):
    result, chars, model_path = evaluated["result"], evaluated["chars"], evaluated["model"]
    assert json.loads((evaluated["out"] / "evaluation.json").read_text()) == result
    m = result["etl"]
    assert (
        m["block_size"] == BLOCK and m["tokenizer_hash"] == CharTokenizer("\n" + chars).fingerprint
    )
    ids = stream_of(Path(result["dataset"]), m["token_dtype"])
    boundary, n = m["tokens_train"], m["tokens"]
    model, _ = load_model_dir(model_path)
    # every token but each split's first, the last window of each split shorter than a block
    direct = every_token_scores(lambda x: model(x)[0], ids, [(0, boundary), (boundary, n)],
                                BLOCK)
    assert result["tokens"] == direct["tokens"] == n - 2
    assert result["windows"] == m["windows_train"] + m["windows_val"] == \
        -(-(boundary - 1) // BLOCK) - (-(n - boundary - 1) // BLOCK)
    assert result["loss"] == pytest.approx(direct["loss"], rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-12)
    assert result["bits_per_char"] == pytest.approx(
        result["loss"] / math.log(2) / m["chars_per_token"], rel=1e-12
    )
    assert 0.99 < m["chars_per_token"] <= 1  # char tokens, plus one end-of-document token per file
    assert result["accuracy"] == pytest.approx(direct["accuracy"], abs=1e-3)
    # output.table: the same figures appended to a Delta table, a row each (evaluate_job.record)
    from deltalake import DeltaTable

    scores = DeltaTable(evaluated["out"] / "scores").to_pyarrow_table().to_pylist()
    by_figure = {r["figure"]: r["value"] for r in scores}
    assert by_figure["loss"] == result["loss"] and by_figure["tokens"] == result["tokens"]
    assert {r["evaluation_dir"] for r in scores} == {str(evaluated["out"])}
    assert {r["model_dir"] for r in scores} == {str(model_path)}


@pytest.mark.slow
def test_characters_the_model_lacks_are_one_line(ray_cluster, corpus_dir, tmp_path):
    cfg = make_config(
        f"model_dir={model_dir(tmp_path / 'model', 'abcdefgh ')}",
        f"data.path={corpus_dir}",
        config_name="evaluate",
    )
    with pytest.raises(InputError, match=r"the corpus has characters that "
                                         r"tokenizer.path=.*/model/tokenizer.json lacks, among "
                                         r"them \"(.+)\"; remove them from the corpus") as err:
        run(cfg, tmp_path)
    assert "\n" not in str(err.value)
    named = (
        str(err.value).split('among them "', 1)[1].split('";', 1)[0]
    )  # those of the batch that failed first
    assert named and not set(named) & set("abcdefgh ")


def test_data_format_must_fit_the_model(corpus_dir, tmp_path):
    cfg = make_config(
        f"model_dir={model_dir(tmp_path / 'model', 'abc')}",
        f"data.path={corpus_dir}",
        "data.format=ids",
        config_name="evaluate",
    )
    with pytest.raises(
        InputError,
        match="data.format=ids does not fit the model's char tokenizer: set "
        r"data.format=text \(or parquet\)",
    ):
        run(cfg, tmp_path)


def test_preference_pairs_need_a_reference_that_fits(corpus_dir, tmp_path):
    """data.format=preference scores the model against a reference: one line, before any engine,
    when the model records none and none is given, and when the given one's vocabulary differs."""
    tuned = model_dir(tmp_path / "model", "abc")
    pairs = ("data.format=preference", f"data.path={corpus_dir}")
    with pytest.raises(InputError, match=r"model_dir=.*/model records no DPO reference \(no "
                                         r"preference.json\): give ref_model_dir=DIR, the model "
                                         r"it was tuned from$"):
        run(make_config(f"model_dir={tuned}", *pairs, config_name="evaluate"), tmp_path)
    other = model_dir(tmp_path / "other", "abcdef")
    with pytest.raises(InputError, match=r"ref_model_dir=.*/other: its vocabulary \(8 tokens\) "
                                         r"is not model_dir's \(5\); give the model model_dir "
                                         r"was tuned from$"):
        run(make_config(f"model_dir={tuned}", f"ref_model_dir={other}", *pairs,
                        config_name="evaluate"), tmp_path)
    with pytest.raises(InputError, match=r"ref_model_dir=.*/absent: .*; give the model "):
        run(make_config(f"model_dir={tuned}", f"ref_model_dir={tmp_path / 'absent'}", *pairs,
                        config_name="evaluate"), tmp_path)


@pytest.mark.slow
def test_per_document_scores_each_documents_tokens_on_the_cluster(evaluated):
    result, chars, model_path = evaluated["result"], evaluated["chars"], evaluated["model"]
    entry = Path(result["dataset"])
    ids = stream_of(entry, result["etl"]["token_dtype"])
    places = pq.read_table(entry / "documents").sort_by("start").to_pylist()
    eod = CharTokenizer("\n" + chars).eod_id
    # the documents (files) cover every token but the end-of-document ones, each after one
    assert [Path(p["path"]).name for p in places] == ["part0.txt", "part1.txt", "part2.txt"]
    assert sum(p["end"] - p["start"] for p in places) == len(ids) - 3
    assert all(ids[p["start"] - 1] == eod for p in places)
    scores = pq.read_table(result["document_scores"]).to_pylist()
    assert [(s["path"], s["doc"]) for s in scores] == [(p["path"], 0) for p in places]
    model, _ = load_model_dir(model_path)
    for place, got in zip(places, scores):
        seq = torch.from_numpy(ids[place["start"] - 1:place["end"]].astype(np.int64))
        nats = 0.0
        with torch.no_grad():
            for i in range(0, len(seq) - 1, BLOCK):
                w = seq[i:i + BLOCK + 1].unsqueeze(0)
                logits, _ = model(w[:, :-1])
                nats += torch.nn.functional.cross_entropy(
                    logits[0], w[0, 1:], reduction="sum").item()
        assert got["tokens"] == place["end"] - place["start"]
        assert got["mean_loss"] == pytest.approx(nats / got["tokens"], rel=1e-5)
    assert scores[2]["val"] and not scores[0]["val"]  # the tail is validation
