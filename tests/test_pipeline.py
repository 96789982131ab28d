"""Integration: the real engines (Ray, RayDP Spark, ray.data.from_spark, Ray Train DDP, torch)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import make_config
from raydp_llm import windows
from raydp_llm.checkpoint import load_model_dir
from raydp_llm.etl import to_ray_datasets, write_parquet
from raydp_llm.pipeline import check_inputs, etl_session
from raydp_llm.tokenizer import CharTokenizer

pytestmark = pytest.mark.integration

BLOCK, STRIDE = 16, 5


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, shakespeare) -> Path:
    """Three documents cut from the benchmark corpus (the last one ends without a newline)."""
    text = shakespeare.read_text()
    d = tmp_path_factory.mktemp("corpus")
    for i, (a, b) in enumerate([(0, 20_000), (20_000, 21_000), (50_000, 65_000)]):
        (d / f"part{i}.txt").write_text(text[a:b].rstrip("\n") if i == 2 else text[a:b])
    return d


def reference_stream(corpus_dir: Path) -> str:
    """What the ETL must produce: documents in path order, each followed by a blank line."""
    return "".join(p.read_text().rstrip() + "\n\n" for p in sorted(corpus_dir.iterdir()))


def test_spark_etl_equals_a_single_process_reference(ray_cluster, corpus_dir, tmp_path):
    cfg = make_config(f"data.path={corpus_dir}", f"model.block_size={BLOCK}", f"data.stride={STRIDE}")
    timings = {}
    with etl_session(cfg, check_inputs(cfg), timings, tmp_path) as etl:
        rows = {name: sorted((r.start, bytes(r.tokens)) for r in df.collect())
                for name, df in (("train", etl.train), ("val", etl.val))}
        write_parquet(etl, tmp_path / "dataset")
        manifest = etl.manifest

    stream = reference_stream(corpus_dir)
    tok = CharTokenizer(stream)
    ids = tok.encode(stream)
    boundary = windows.split_boundary(len(ids), 0.1)
    assert manifest["tokens"] == len(ids) and manifest["tokens_train"] == boundary
    assert manifest["vocab_size"] == tok.vocab_size and manifest["documents"] == 3
    for name, lo, hi in (("train", 0, boundary), ("val", boundary, len(ids))):
        expected = [(s, ids[s:s + BLOCK + 1].tobytes()) for s in range(lo, hi - BLOCK, STRIDE)]
        assert rows[name] == expected, f"{name} windows differ from the reference"
        assert all(lo <= s and s + BLOCK + 1 <= hi for s, _ in rows[name])  # none crosses the split
    assert manifest["windows_train"] == len(rows["train"]) and manifest["windows_val"] == len(rows["val"])
    assert timings["spark_start_s"] > 0
    # prepare's output: Parquet windows beside the tokenizer
    table = pq.read_table(tmp_path / "dataset" / "train")
    assert table.num_rows == manifest["windows_train"]
    assert json.loads((tmp_path / "dataset" / "tokenizer.json").read_text())["chars"] == tok.chars
    assert "spark-driver.log" in {p.name for p in tmp_path.iterdir()}


def test_markdown_sample_corpus_is_plain_text(ray_cluster, tmp_path):
    cfg = make_config("data.max_documents=1", "model.block_size=32")
    with etl_session(cfg, check_inputs(cfg), {}, tmp_path) as etl:
        first = etl.val.orderBy("start").first()
        text = CharTokenizer(etl.tokenizer.chars).decode(np.frombuffer(first.tokens, dtype=np.uint16))
        chars = etl.tokenizer.chars
    assert not set("*_#\\") & set(chars), f"markdown markup left in the vocabulary: {chars!r}"
    assert len(text) == 33


def test_train_end_to_end_on_two_ddp_workers(ray_cluster, corpus_dir, tmp_path):
    from raydp_llm.train import run

    cfg = make_config(f"data.path={corpus_dir}", "model.n_layer=2", "model.n_head=2", "model.n_embd=64",
                      "model.block_size=32", "train.batch_size=16", "train.max_steps=150",
                      "train.eval_interval=50", "train.eval_batches=null", "optim.lr=3e-3",
                      "sample.max_new_tokens=80", "sample.prompt=ROMEO:")
    summary = run(cfg, tmp_path)

    for name in ("metrics.csv", "summary.json", "manifest.json", "samples.txt", "model/model.safetensors",
                 "model/config.json", "model/tokenizer.json"):
        assert (tmp_path / name).is_file(), name
    vocab = summary["etl"]["vocab_size"]
    assert summary["final_val_loss"] < 0.8 * math.log(vocab), summary
    assert summary["final_val_loss"] < summary["first_val_loss"]
    assert summary["steps"] == 150 and summary["tokens"] == 150 * 16 * 32
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,tokens,train_loss,val_loss,lr,tokens_per_s,elapsed_s" and len(rows) == 4
    for key in ("etl_s", "train_s", "total_s", "spark_start_s", "num_params"):
        assert summary[key] > 0, key
    assert summary["ray_start_s"] >= 0  # Ray is shared by the test session, so ~0 here
    assert (tmp_path / "samples.txt").read_text().startswith("ROMEO:")

    # The model directory loads and generates without Ray or Spark, in a fresh process.
    out = subprocess.run([sys.executable, "-m", "raydp_llm.generate", f"model_dir={tmp_path / 'model'}",
                          "prompt=JULIET:", "max_new_tokens=50", "seed=3"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("JULIET:") and len(out.stdout.rstrip("\n")) == len("JULIET:") + 50
    model, _ = load_model_dir(tmp_path / "model")
    assert model.num_params() == summary["num_params"]


def test_ray_datasets_outlive_spark(ray_cluster, corpus_dir, tmp_path):
    cfg = make_config(f"data.path={corpus_dir}", "model.block_size=64")
    with etl_session(cfg, check_inputs(cfg), {}, tmp_path) as etl:
        datasets = to_ray_datasets(etl)
    import ray

    assert datasets["train"].count() == etl.manifest["windows_train"]  # Spark is stopped by now
    batch = datasets["val"].take_batch(4)
    assert all(len(t) == 65 * 2 for t in batch["tokens"])  # 65 uint16 tokens per window
    assert ray.available_resources().get("CPU", 0) >= 2  # the executors gave their CPUs back
