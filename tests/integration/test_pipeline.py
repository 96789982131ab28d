"""Integration: the whole path on the real engines (Ray, RayDP Spark, from_spark / the ETL cache,
Ray Train DDP)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import urllib.request
from dataclasses import replace
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.configs import make_config
from helpers.etl import prepare
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.data import cache
from raydp_llm.data.prepare import prepared
from raydp_llm.engines.preflight import check_workers_fit, preflight
from raydp_llm.training.driver.metrics import COLUMNS, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

BLOCK = 16


E2E_RUN = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "model.block_size=32",
    "train.batch_size=16",
    "train.max_steps=150",
    "train.eval_interval=50",
    "train.eval_batches=null",
    "optim.lr=3e-3",
    "sample.max_new_tokens=80",
    "sample.prompt=ROMEO:",
]
RUN_OUTPUTS = (
    "metrics.csv",
    "summary.json",
    "manifest.json",
    "samples.txt",
    "loss.png",
    "throughput.png",
    "model/model.safetensors",
    "model/config.json",
    "model/tokenizer.json",
)


def _assert_metrics_rows(rows: list[dict], summary: dict) -> None:
    for r in rows:
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
        assert r["val_bpc"] == pytest.approx(
            r["val_loss"] / math.log(2) / summary["etl"]["chars_per_token"]
        )
        assert 0 < r["train_acc"] < 1 and 0 < r["val_acc"] < 1 and r["grad_norm"] > 0
        assert (
            0 <= r["grad_abs_min"] <= r["grad_abs_mean"] <= r["grad_abs_max"]
            and r["grad_abs_var"] > 0
        )
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["rss_mb"] > 50
        assert 0 < r["sys_mem_used_mb"] < r["sys_mem_total_mb"] and r["cpu_percent"] > 0
        assert r["mfu"] is None and r["gpu_mem_mb"] is None  # no train.peak_flops, no GPU


def _assert_generates_in_a_fresh_process(model_dir) -> None:
    """The model directory loads and generates without Ray or Spark, in a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydp_llm.generate",
            f"model_dir={model_dir}",
            "prompt=JULIET:",
            "max_new_tokens=50",
            "seed=3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("JULIET:") and len(out.stdout) > len("JULIET:") + 20


def test_train_end_to_end_on_two_ddp_workers(ray_cluster, corpus_dir, tmp_path):
    from raydp_llm.cli.train import run

    cfg = make_config(
        f"data.path={corpus_dir}",
        f"data.cache_dir={tmp_path / 'cache'}",  # a Spark ETL here
        "cluster.keep_spark=false",  # Spark's own start and stop, timed in the summary
        *E2E_RUN,
    )
    run_dir = tmp_path / "run"
    summary = run(cfg, run_dir)

    for name in RUN_OUTPUTS:
        assert (run_dir / name).is_file(), name
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    vocab = summary["etl"]["vocab_size"]
    assert summary["final_val_loss"] < 0.8 * math.log(vocab), summary
    assert summary["final_val_loss"] < summary["first_val_loss"]
    assert summary["steps"] == 150 and summary["tokens"] == 150 * 16 * 32
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [50, 100, 150] and list(rows[0]) == COLUMNS
    _assert_metrics_rows(rows, summary)
    assert (
        rows[-1]["val_acc"] > rows[0]["val_acc"]
        and summary["flops_per_token"] > 6 * summary["num_params"]
    )
    for key in ("etl_s", "train_s", "total_s", "spark_start_s", "num_params"):
        assert summary[key] > 0, key
    # Ray is shared by the test session: the job finds it up, so its "start" is the job's set-up
    # alone, shorter than Spark's (a JVM and its executors), and the start-up phases report it
    assert 0 <= summary["ray_start_s"] < summary["spark_start_s"], summary
    assert summary["startup"]["ray_start_s"] == round(summary["ray_start_s"], 2)
    assert (run_dir / "samples.txt").read_text().startswith("ROMEO:")

    _assert_generates_in_a_fresh_process(run_dir / "model")
    model, _ = load_model_dir(run_dir / "model")
    assert model.num_params() == summary["num_params"]
    _exports_to_transformers(run_dir / "model", tmp_path / "hf", "ROMEO:")


def _exports_to_transformers(model_dir, out, prompt: str) -> None:
    """``python -m raydp_llm.export`` of a trained model: transformers loads it with no custom
    code, with the same logits (float32), ids and greedy continuation."""
    import torch
    import transformers

    from raydp_llm.cli.export import main as export_main

    assert export_main([f"model_dir={model_dir}", f"out={out}"]) == 0
    ours, tokenizer = load_model_dir(model_dir)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tokenizer.encode(prompt).tolist()])
    assert hf_tok(prompt)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        assert (ours(ids)[0] - theirs(ids).logits).abs().max().item() <= 1e-4
    new = ours.config.block_size - ids.size(1)
    greedy = theirs.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    assert ours.generate(ids, new, temperature=0).tolist() == greedy.tolist()


def test_fine_tune_a_gpt2_checkpoint_then_export_it(ray_cluster, corpus_dir, tmp_path):
    """model.init_from: a GPT-2 directory written by transformers (random weights, a BPE trained
    here) gives the shape, the weights and the tokenizer; training goes on from those weights; the
    result exports back to transformers exactly."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from raydp_llm.cli.train import run
    from raydp_llm.core.tokenizer import train_bpe

    text = [p.read_text() for p in sorted(corpus_dir.iterdir())]
    bpe = train_bpe([text], vocab_size=400)
    hf_dir = tmp_path / "gpt2"
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=bpe.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4))
    gpt2.save_pretrained(hf_dir)
    PreTrainedTokenizerFast(tokenizer_object=bpe.tok, eos_token="<|endoftext|>").save_pretrained(
        hf_dir)

    with pytest.raises(InputError, match=r"model.init_from=.* has n_layer=2 but model.n_layer=3"):
        make_config(f"model.init_from={hf_dir}", "model.n_layer=3")
    cfg = make_config(f"data.path={corpus_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                      f"model.init_from={hf_dir}", "model.block_size=32", "train.batch_size=8",
                      "train.max_steps=20", "train.eval_interval=20", "train.num_workers=1",
                      "optim.warmup_steps=2", "sample.max_new_tokens=0")
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.activation) == (2, 32, "gelu_tanh")
    summary = run(cfg, tmp_path / "run")
    assert summary["steps"] == 20 and summary["etl"]["vocab_size"] == bpe.vocab_size
    trained, tokenizer = load_model_dir(tmp_path / "run" / "model")
    sample = text[0][:2000]
    assert tokenizer.encode(sample).tolist() == bpe.encode(sample).tolist()  # its tokenizer
    start = gpt2.transformer.wte.weight.detach()
    moved = trained.wte.weight.detach()
    assert not torch.equal(moved, start)  # it trained ...
    assert torch.nn.functional.cosine_similarity(moved.flatten(), start.flatten(), 0) > 0.9  # from
    _exports_to_transformers(tmp_path / "run" / "model", tmp_path / "hf", "ROMEO:")


def test_lstm_baseline_trains_for_whole_epochs(ray_cluster, corpus_dir, tmp_path):
    from raydp_llm.cli.train import run

    cfg = make_config(
        f"data.path={corpus_dir}",
        "model=lstm",
        "model.n_layer=1",
        "model.n_embd=64",
        "model.block_size=32",
        "train.batch_size=16",
        "train.epochs=2",
        "train.eval_interval=20",
        "train.checkpoint_interval=0",
        "train.eval_batches=4",
        "sample.max_new_tokens=20",
    )
    summary = run(cfg, tmp_path)
    windows = summary["etl"]["windows_train"]
    assert summary["steps"] == 2 * (windows // 8 // 2)  # micro-batches of 8 on each of 2 workers
    rows = read_metrics(tmp_path / "metrics.csv")
    assert rows[-1]["epoch"] == 1 and rows[0]["epoch"] == 0
    assert summary["final_val_loss"] < summary["first_val_loss"]
    model, _ = load_model_dir(tmp_path / "model")
    assert model.kind == "lstm" and model.num_params() == summary["num_params"]


def _assert_spark_and_its_executors_are_up(data, cluster) -> None:
    """While the caller holds Spark: the run's chunks, Spark's UI on the loopback only, and the kept
    executors' CPUs."""
    import ray
    from pyspark import SparkContext

    assert len(data.sources["val"].where) == data.manifest.chunks_val
    assert SparkContext._active_spark_context is not None  # Spark is still running
    ui = (
        SparkContext._active_spark_context.uiWebUrl
    )  # cluster.spark_ui=true: on the loopback only
    assert (
        urlsplit(ui).hostname == "127.0.0.1"
        and urllib.request.urlopen(f"{ui}/jobs/", timeout=10).status == 200
    )
    if ray.util.get_node_ip_address() != "127.0.0.1":
        with pytest.raises(OSError):  # not on the machine's network address
            urllib.request.urlopen(
                ui.replace("127.0.0.1", ray.util.get_node_ip_address()), timeout=10
            )
    total = ray.cluster_resources()["CPU"]
    held = cluster.executors * cluster.executor_ray_cpus
    assert held > 0 and ray.available_resources().get("CPU", 0) <= total - held  # kept


def _assert_greedy_workers_are_refused_before_the_etl(corpus_dir) -> None:
    greedy = make_config(
        f"data.path={corpus_dir}",
        "data.cache=false",
        "cluster.keep_executors=true",
        "cluster.keep_spark=false",
        "train.cpus_per_worker=64",
    )
    with pytest.raises(InputError, match=r"the embedded Ray has \d+ CPUs \(cluster.num_cpus\) but "
                                         r"the job needs 128\.5"):
        check_inputs(greedy)  # before any engine starts
    # A joined cluster's CPUs are known once it is reached: checked again before the ETL, by the
    # same formula.
    with pytest.raises(InputError, match=r"the Ray cluster has \d+ CPUs but the job needs 128\.5: "
                                         r"cluster.executors=1 × cluster.executor_ray_cpus=0.5 \+ "
                                         r"train.num_workers=2 × train.cpus_per_worker=64; set "
                                         r"cluster.keep_executors=false or lower"):
        preflight(greedy.cluster, greedy.train, None)
    # DDP workers wider than any node would wait forever: refused before the ETL.
    with pytest.raises(InputError, match=r"train.num_workers=2 workers of 64 CPUs: the Ray "
                                         r"cluster's nodes \(\d+ CPUs/0 GPUs\) hold only 0; lower "
                                         r"train.num_workers"):
        check_workers_fit(greedy.train)


def test_kept_executors_stay_up_until_the_run_ends_and_the_chunks_outlive_spark(
        ray_cluster, corpus_dir, tmp_path):
    """One hand-off from Spark (``data.cache=false``) asserted both ways: the kept executors hold
    their CPUs while the caller holds Spark, and the chunks in the object store outlive it."""
    import ray
    from pyspark import SparkContext

    cfg = make_config(f"data.path={corpus_dir}", "data.cache=false", "cluster.keep_executors=true",
                      "cluster.keep_spark=false",
                      "train.num_workers=1", "cluster.spark_ui=true", "model.block_size=64",
                      "data.chunk_tokens=20000")
    with prepared(
        cfg, check_inputs(cfg), tmp_path, to_ray=True, store=None
    ) as data:  # the caller holds Spark
        _assert_spark_and_its_executors_are_up(data, cfg.cluster)
    assert SparkContext._active_spark_context is None
    assert ray.available_resources().get("CPU", 0) >= 2  # the executors gave their CPUs back
    _chunks_outlive_spark(cfg, data, tmp_path)

    _assert_greedy_workers_are_refused_before_the_etl(corpus_dir)
    check_workers_fit(cfg.train)


def _chunks_outlive_spark(cfg, data, tmp_path) -> None:
    """The chunks handed over to the object store are all there, a block per chunk, and read back
    into the run's windows after Spark stopped."""
    import numpy as np
    import ray

    from raydp_llm.data.stream import BlockChunks, ChunkReader, EpochOrder
    from raydp_llm.training.spec import samplings, windows_of

    assert not data.cache_hit and data.entry is None
    m = data.manifest.to_json() | windows_of(cfg, data.index, data.manifest).to_json()
    for name, cut in samplings(cfg).items():  # Spark is stopped by now
        source = data.sources[name]
        assert isinstance(source, BlockChunks) and len(source.where) == m[f"chunks_{name}"]
        assert len(source.refs) == m[f"chunks_{name}"]  # a block per chunk: a worker reads its own
        order = EpochOrder(data.index[name], cut, seed=0, epoch=None)
        windows = ChunkReader(source, data.index[name], "uint16", 2).windows(
            order, np.arange(order.total))
        assert windows.shape == (m[f"windows_{name}"], 65)
    assert m["chunks_train"] > 1
    # RayDP's fetch tasks must not leave workers that break later actors (raydp_fixes): Ray Data's
    # Parquet reader creates actors on the same worker pool.
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "t.parquet")
    assert ray.data.read_parquet(str(tmp_path / "t.parquet")).count() == 10


def _assert_the_entry_is_whole(miss, key: str, cache_dir) -> None:
    """The entry's files: a chunk per row, a row group per chunk, no temporary name left."""
    entry = miss.entry
    assert entry == cache_dir / "fresh" / key and (entry / "manifest.json").is_file()
    assert pq.read_table(entry / "train").num_rows == miss.manifest.chunks_train
    # a worker reads a row group per chunk it needs: one chunk, or several short ones that together
    # hold less than one full chunk
    full = (miss.manifest.chunk_tokens + miss.manifest.halo_tokens) * 2
    for f in (entry / "train").glob("*.parquet"):
        meta = pq.ParquetFile(f).metadata
        groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
        assert all(g.num_rows == 1 or g.total_byte_size <= full for g in groups)
    assert not list((cache_dir / "fresh").glob(".*tmp*"))  # the temporary name is gone


def _assert_spark_stats(stats: dict, corpus_dir) -> None:
    assert stats["jobs"] > 0 and stats["stages"] > 0 and stats["tasks"] >= stats["stages"]
    assert (
        stats["failed_tasks"] == 0
        and stats["input_records"] > 0
        and stats["shuffle_write_bytes"] > 0
    )
    assert stats["input_bytes"] >= sum(p.stat().st_size for p in corpus_dir.iterdir())
    assert (
        0
        < stats["task_duration_ms_min"]
        <= stats["task_duration_ms_avg"]
        <= stats["task_duration_ms_max"]
    )
    assert {"read", "tokenizer", "encode", "write"} <= set(
        stats["phase_s"]
    )  # chunks are cut as written
    assert len(stats["per_stage"]) == stats["stages"]


def _assert_only_inputs_and_etl_settings_change_the_key(cfg, corpus, corpus_dir, key) -> None:
    # Any change of the inputs or ETL settings is a new key.
    touched = corpus_dir / "part1.txt"
    mtime = touched.stat().st_mtime_ns
    os.utime(touched, ns=(0, 0))
    try:
        assert cache.cache_key(check_inputs(cfg), cfg.data, cfg.tokenizer, cfg.seed) != key
    finally:  # the session's corpus: later tests hit the cache entries built on it
        os.utime(touched, ns=(mtime, mtime))
    changed = make_config(f"data.path={corpus_dir}", "data.segment_tokens=100", "data.split=hash")
    assert cache.cache_key(corpus, changed.data, changed.tokenizer, cfg.seed) != key
    # Windows are cut when read: another block, stride or sampling is the same entry.
    windows = make_config(f"data.path={corpus_dir}", "model.block_size=64", "data.stride=3",
                          "data.val_stride=5", "data.sampling=random")
    assert cache.cache_key(corpus, windows.data, windows.tokenizer, cfg.seed) == key


def test_cache_miss_hit_and_partial_entries(ray_cluster, corpus_dir, tmp_path):
    from raydp_llm.engines.spark import stop_kept_spark

    cache_dir = tmp_path / "cache"
    cfg = make_config(
        f"data.path={corpus_dir}", f"data.cache_dir={cache_dir}", f"model.block_size={BLOCK}")
    stop_kept_spark()  # Spark's own start, timed (then kept for the next test's first ETL)
    corpus = check_inputs(cfg)
    key = cache.cache_key(corpus, cfg.data, cfg.tokenizer, cfg.seed)
    (cache_dir / key).mkdir(parents=True)  # a partial entry: no manifest
    (cache_dir / f".{key}.tmp-dead").mkdir()  # a crashed write

    miss = prepare(cfg, corpus, tmp_path, to_ray=False, store=cache_dir / "fresh")
    assert not miss.cache_hit and "spark_start_s" in miss.timings
    _assert_the_entry_is_whole(miss, key, cache_dir)
    entry = miss.entry
    stats = json.loads(
        (tmp_path / "etl_stats.json").read_text()
    )  # Spark's own metrics for this ETL
    assert stats == miss.stats == json.loads((entry / "etl_stats.json").read_text())
    _assert_spark_stats(stats, corpus_dir)

    cfg_hit = make_config(f"data.path={corpus_dir}", f"data.cache_dir={cache_dir / 'fresh'}",
                          f"model.block_size={BLOCK}")
    hit = prepare(cfg_hit, corpus, tmp_path, to_ray=True, store=None)
    assert hit.cache_hit and "spark_start_s" not in hit.timings
    assert len(hit.sources["train"].where) == miss.manifest.chunks_train
    assert hit.manifest.to_json() == json.loads((entry / "manifest.json").read_text())
    assert hit.tokenizer.to_json() == miss.tokenizer.to_json()
    assert hit.stats == stats  # the hit reports what the ETL that made the entry cost

    _assert_only_inputs_and_etl_settings_change_the_key(cfg, corpus, corpus_dir, key)


def test_a_kept_spark_serves_the_next_job_with_its_settings_and_is_stopped_for_others(
        ray_cluster, corpus_dir, tmp_path, caplog):
    """cluster.keep_spark (the tests' default): the next ETL with the same cluster settings skips
    Spark's start and its stats count its own jobs; a job with other settings stops it first."""
    import logging

    from pyspark import SparkContext

    from raydp_llm.engines.spark import kept_spark

    def etl(*overrides: str, out: str):
        cfg = make_config(f"data.path={corpus_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                          *overrides)
        return cfg, prepare(cfg, check_inputs(cfg), tmp_path / out, to_ray=False,
                            store=tmp_path / "cache")

    cfg, first = etl("model.block_size=16", out="first")
    kept = kept_spark(cfg.cluster)
    assert not first.cache_hit and kept is not None
    with caplog.at_level(logging.INFO, logger="raydp_llm"):
        _, second = etl("model.block_size=16", "seed=7", out="second")  # another key, same jobs
    assert not second.cache_hit and "spark_start_s" not in second.timings
    assert "Spark kept running by an earlier job: its start skipped" in caplog.text
    # the event log holds both ETLs' jobs, the stats of each its own
    assert kept_spark(cfg.cluster) is kept and second.stats["jobs"] == first.stats["jobs"] > 0
    assert kept_spark(replace(cfg.cluster, executor_memory="768m")) is None  # stopped
    assert SparkContext._active_spark_context is None
