"""A mixture of two sources on the real engines (``data.sources``): each source its own ETL cache
entry, one tokenizer over their disjoint alphabets, each source's validation loss in metrics.csv,
summary.json's mixture, each source learned better by the run that weights it more, an exact
resume on another number of workers, evaluate's loss per source, prepare's entry per source, and a
source too small for a window named in one line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import commands
from helpers.configs import CACHE_DIR, NO_CHECK, make_config
from raydp_llm.cli.evaluate import run as evaluate
from raydp_llm.cli.train import run as train
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import load_tokenizer
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

RUN = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
       "train.batch_size=16", "train.max_steps=8", "train.eval_interval=4", "optim.lr=1e-2",
       "train.checkpoint_interval=4", "train.eval_batches=null", "sample.max_new_tokens=10",
       f"data.cache_dir={CACHE_DIR}", NO_CHECK]


def words(alphabet: str, n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join("".join(rng.choice(list(alphabet), size=rng.integers(2, 7)))
                    for _ in range(n)) + "\n"


def sources(*named: tuple[str, object, float]) -> str:
    """The ``data.sources`` override of (name, path, weight)."""
    listed = ", ".join(f"{{name: {name}, path: '{path}', weight: {weight}}}"
                       for name, path, weight in named)
    return f"data.sources=[{listed}]"


@pytest.fixture(scope="module")
def mixed(ray_cluster, tmp_path_factory) -> dict:
    """Lower-case words (domain) and upper-case ones (replay), 9:1."""
    out = tmp_path_factory.mktemp("mixture")
    (out / "domain.txt").write_text(words("abcdefgh", 6000, 1))
    (out / "replay.txt").write_text(words("QRSTUVWXYZ", 6000, 2))
    overrides = [*RUN, sources(("domain", out / "domain.txt", 0.9),
                               ("replay", out / "replay.txt", 0.1))]
    summary = commands.train(out / "run", *overrides)  # as a user runs it: a fresh process
    return {"summary": summary, "out": out, "overrides": overrides}


def test_each_source_trains_at_its_weight_and_validates_on_its_own(mixed):
    run_dir, summary = mixed["out"] / "run", mixed["summary"]
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [4, 8]
    for r in rows:  # the weighted loss, and each source's
        assert r["val_loss"] == pytest.approx(0.9 * r["val_loss_domain"]
                                              + 0.1 * r["val_loss_replay"], rel=1e-9)
    assert rows[-1]["val_loss_domain"] != rows[-1]["val_loss_replay"]
    mixture = summary["mixture"]
    assert list(mixture) == ["domain", "replay"]
    for name, weight in (("domain", 0.9), ("replay", 0.1)):
        m = mixture[name]
        assert m["weight"] == weight and abs(m["share_trained"] - weight) <= 1 / 64
        assert m["tokens_trained"] == round(m["share_trained"] * 8 * 16) * 16
        assert 0 < m["epochs"] < 1 and m["documents"] == 1 and m["tokens"] > 20_000
    sources = summary["etl"]["sources"]
    assert sources["domain"]["etl_key"] != sources["replay"]["etl_key"]  # two cache entries
    # one vocabulary over both alphabets: the model's tokenizer reads either source
    tokenizer = load_tokenizer(run_dir / "model" / "tokenizer.json")
    assert set("abcdefghQRSTUVWXYZ") <= set(tokenizer.chars)
    assert (run_dir / "loss.png").is_file()


def test_the_sources_etls_share_one_spark_and_each_counts_its_own_jobs(mixed):
    """One Spark application ran both sources' ETLs (started once, by the first), each as a job
    group keyed by its cache key; each source's etl_stats.json counts that group's jobs only."""
    run_dir, keys = mixed["out"] / "run", mixed["summary"]["etl"]["sources"]
    logs = list((run_dir / "spark-events").iterdir())
    assert len(logs) == 1, logs
    starts = [e for e in map(json.loads, logs[0].read_text().splitlines())
              if e["Event"] == "SparkListenerJobStart"]
    # a group is named by the ETL's cache key and a suffix of its own
    groups = Counter(((e["Properties"].get("spark.jobGroup.id") or "").rsplit("/", 1)[0] or None)
                     for e in starts)
    for name, started in (("domain", True), ("replay", False)):
        stats = json.loads((run_dir / "sources" / name / "etl_stats.json").read_text())
        assert stats["jobs"] == groups[keys[name]["etl_key"]] > 0, (name, groups)
        assert stats["tasks"] > 0 and (stats["spark_start_s"] > 0) == started
    # and the start-up's warm-up job, in no group
    assert set(groups) == {None, keys["domain"]["etl_key"], keys["replay"]["etl_key"]}


def test_each_source_is_learned_better_by_the_run_that_weights_it_more(mixed, tmp_path):
    """The same budget at 0.1/0.9 instead of 0.9/0.1: each source's validation loss is lower in
    the run that weighted it more (the sources encoded once: both cache hits)."""
    flipped = [*RUN, sources(("domain", mixed["out"] / "domain.txt", 0.1),
                             ("replay", mixed["out"] / "replay.txt", 0.9))]
    summary = train(make_config(*flipped), tmp_path / "flipped")
    assert summary["etl"]["sources"]["domain"]["cache_hit"] is True
    assert summary["etl"]["sources"]["replay"]["cache_hit"] is True
    mostly_domain = read_metrics(mixed["out"] / "run" / "metrics.csv")[-1]
    mostly_replay = read_metrics(tmp_path / "flipped" / "metrics.csv")[-1]
    assert mostly_domain["val_loss_domain"] < mostly_replay["val_loss_domain"]
    assert mostly_replay["val_loss_replay"] < mostly_domain["val_loss_replay"]


def test_a_resumed_mixture_on_one_worker_ends_on_the_same_curve(mixed, tmp_path):
    first = mixed["out"] / "run"
    (checkpoint,) = [p.parent for p in first.glob("ray_results/*/checkpoint_*/train_state.json")
                     if json.loads(p.read_text())["step"] == 4]
    summary = train(make_config(*mixed["overrides"], f"train.resume={checkpoint}",
                                "train.num_workers=1"), tmp_path / "resumed")
    assert summary["resumed_from"] and summary["etl"]["cache_hit"] is True
    (resumed,) = read_metrics(tmp_path / "resumed" / "metrics.csv")
    whole = read_metrics(first / "metrics.csv")[-1]
    assert resumed["step"] == 8
    for key in ("val_loss", "val_loss_domain", "val_loss_replay", "train_loss"):
        assert resumed[key] == pytest.approx(whole[key], rel=1e-4), key


def test_evaluate_on_the_sources_gives_a_loss_per_source(mixed, tmp_path):
    """Each source scored as a corpus of its own: the same loss as evaluate on that source's path
    alone (its ETL cache entry, shared), and the loss weighted as training's val_loss is."""
    model_dir = mixed["out"] / "run" / "model"
    on = [f"model_dir={model_dir}", f"data.cache_dir={CACHE_DIR}", NO_CHECK]
    result = evaluate(make_config(*on, sources(("domain", mixed["out"] / "domain.txt", 0.9),
                                               ("replay", mixed["out"] / "replay.txt", 0.1)),
                                  config_name="evaluate"), tmp_path / "mixture")
    domain, replay = result["sources"]["domain"], result["sources"]["replay"]
    assert result["loss"] == pytest.approx(0.9 * domain["loss"] + 0.1 * replay["loss"])
    assert domain["loss"] < replay["loss"]  # the model trained mostly on the domain
    (tmp_path / "alone").mkdir()
    alone = evaluate(make_config(*on, f"data.path={mixed['out'] / 'domain.txt'}",
                                 config_name="evaluate"), tmp_path / "alone")
    assert alone["etl"]["cache_hit"] is True
    assert alone["loss"] == pytest.approx(domain["loss"], rel=1e-9)
    assert alone["tokens"] == domain["tokens"]


def test_a_source_too_small_for_a_window_is_named(mixed, tmp_path):
    (tmp_path / "tiny.txt").write_text("abc\n")
    overrides = [*RUN, sources(("domain", mixed["out"] / "domain.txt", 0.9),
                               ("tiny", tmp_path / "tiny.txt", 0.1))]
    with pytest.raises(InputError, match=r"^data.sources: tiny: .* giving 0 training"):
        train(make_config(*overrides), tmp_path / "run")


def test_prepare_writes_each_sources_entry_that_the_run_reads(mixed, tmp_path, capsys):
    """``python -m raydp_llm.prepare`` of a mixture: each source's ETL cache entry, the very one
    the run read (here cache hits of the run's), its manifest by source."""
    from raydp_llm.cli.inputs import check_inputs
    from raydp_llm.cli.prepare_job import run_checked
    from raydp_llm.core.timing import Stopwatch

    settings = make_config(*mixed["overrides"])
    run_checked(settings, check_inputs(settings), tmp_path, Stopwatch())
    manifests = json.loads((tmp_path / "manifest.json").read_text())["sources"]
    ran = mixed["summary"]["etl"]["sources"]
    assert list(manifests) == ["domain", "replay"]
    for name, weight in (("domain", 0.9), ("replay", 0.1)):
        m = manifests[name]
        assert m["etl_key"] == ran[name]["etl_key"] and m["cache_hit"] and m["weight"] == weight
        assert m == json.loads((tmp_path / "sources" / name / "manifest.json").read_text())
        assert m["tokens"] == mixed["summary"]["mixture"][name]["tokens"]
    printed = capsys.readouterr().out
    assert "source domain (weight 0.9): " in printed and "source replay (weight 0.1): " in printed


def test_a_mixtures_bpe_is_trained_on_a_sample_of_the_sources_at_their_weights(ray_cluster,
                                                                               tmp_path):
    """tokenizer=bpe: one BPE for both sources, trained on a sample in which each source has its
    weight's share (all of the 0.9 source, a ninth of that from the 0.1 one), written where the next
    prepare of the same mixture finds it: that one's sources hit the cache."""
    from raydp_llm.cli.inputs import check_inputs
    from raydp_llm.cli.prepare_job import run_checked
    from raydp_llm.core.timing import Stopwatch

    for name, alphabet in (("domain", "abcdefgh"), ("replay", "QRSTUVWXYZ")):  # lines to draw
        (tmp_path / f"{name}.txt").write_text("".join(words(alphabet, 10, seed)
                                                      for seed in range(2000)))
    settings = make_config(*RUN, sources(("domain", tmp_path / "domain.txt", 0.9),
                                         ("replay", tmp_path / "replay.txt", 0.1)),
                           "tokenizer=bpe", "tokenizer.vocab_size=300")
    for out in ("first", "second"):
        run_checked(settings, check_inputs(settings), tmp_path / out, Stopwatch())
    first, second = (json.loads((tmp_path / out / "manifest.json").read_text())["sources"]
                     for out in ("first", "second"))
    for name in ("domain", "replay"):
        assert first[name]["tokenizer"] == "bpe" and first[name]["vocab_size"] == 300
        assert not first[name]["cache_hit"] and second[name]["cache_hit"]
        assert second[name]["etl_key"] == first[name]["etl_key"]
    (path,) = Path(CACHE_DIR, "tokenizers").glob("mixture-" + "[0-9a-f]" * 20 + ".json")
    drawn = {d["name"]: d for d in json.loads(path.with_suffix(".sample.json").read_text())}
    domain, replay = drawn["domain"], drawn["replay"]
    assert domain["weight"] == 0.9 and domain["sampled_bytes"] == domain["text_bytes"]
    assert replay["sampled_bytes"] == pytest.approx(domain["sampled_bytes"] / 9, rel=0.2)
    vocab = load_tokenizer(path).tok.get_vocab()
    merged = [t for t in vocab if len(t) > 1 and t.isalpha()]
    assert any(t.islower() for t in merged) and len(vocab) == 300
