"""Curation on the real engines (Ray + RayDP Spark): document keys across input splits, planted
exact and near duplicates, boilerplate, validation text copied into training documents, and the
score filter."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.configs import make_config
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.data.etl.curation import contamination
from raydp_llm.data.etl.curation.documents import document_keys
from raydp_llm.data.etl.curation.minhash import jaccard, shingles
from raydp_llm.data.etl.read import documents, read_lines
from raydp_llm.data.etl.records import EtlPlan
from raydp_llm.data.etl.run import run_etl

pytestmark = pytest.mark.integration


def reference_keys(lines: list[str], split: str) -> list[int]:
    """Each line's document number in its file, as the encoder cuts documents (-1: blank)."""
    keys, number, last_blank = [], -1, True
    for i, line in enumerate(lines):
        blank = not line.strip()
        if split == "file":
            keys.append(0)
        elif blank:
            keys.append(-1)
        elif split == "line":
            keys.append(i)
        else:
            number += last_blank
            keys.append(number)
        last_blank = blank
    return keys


@pytest.mark.parametrize("split", ["blank_line", "line", "file"])
def test_document_keys_match_the_encoders_documents_across_input_splits(spark, tmp_path, split):
    paragraphs = [f"paragraph {i} " + "words " * (i % 50) + "\nmore" * (i % 4) for i in range(400)]
    long = "\n".join(["a paragraph longer than an input split"] * 400)
    text = "\n\n".join(paragraphs) + "\n\n\n" + long + "\n"
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.txt").write_text("x\n\ny\n")
    cfg = make_config(f"data.path={tmp_path}")
    corpus = check_inputs(cfg)
    split_bytes = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4k")  # many input splits, in paragraphs
    try:
        lines = documents(read_lines(spark, corpus, cfg.data, cfg.s3), corpus, cfg.data)
        got = sorted((r.src, r.block, r.line, r.doc)
                     for r in document_keys(spark, lines, split).collect())
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", split_bytes)
    assert len({block for src, block, _, _ in got if src.endswith("a.txt")}) > 5
    for name in ("a.txt", "b.txt"):
        keys = [doc for src, _, _, doc in got if src.endswith(name)]  # in file order
        assert keys == reference_keys((tmp_path / name).read_text().split("\n")[:-1], split)


class Planted:
    """A JSON Lines corpus with what curation must find, planted at known places: documents are
    ``(file, line)``; ``a.jsonl`` and ``b.jsonl`` are training text, ``z.jsonl`` ends the stream
    (its documents lie in the validation tail)."""

    def __init__(self, root: Path, seed: int = 0):
        rng = random.Random(seed)
        self.vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                              for _ in range(rng.randint(3, 9))) for _ in range(5000)]
        self.rng = rng
        files = {"a.jsonl": [self.text(300) for _ in range(150)],
                 "b.jsonl": [], "z.jsonl": [self.text(300) for _ in range(40)]}
        self.exact, self.near_above, self.below, self.boiler = set(), set(), set(), {}
        a, b = files["a.jsonl"], files["b.jsonl"]
        for i in range(20):  # exact: the same text, case and white space changed
            b.append("  " + a[i].upper().replace(" ", "   \t") + " ")
            self.exact.add(("b.jsonl", len(b) - 1))
        for i in range(20, 100):  # near: a few words replaced, or many (below the threshold)
            edited = self.edit(a[i], rng.choice([1, 2, 3, 3, 12, 20, 40]))
            similarity = jaccard(shingles(a[i], 5), shingles(edited, 5))
            b.append(edited)
            if similarity >= 0.88:
                self.near_above.add(("b.jsonl", len(b) - 1))
            elif similarity <= 0.7:
                self.below.add(("b.jsonl", len(b) - 1))
        self.boiler = {"max_dup_lines": "Home\nAbout us\nContact\n" * 30,
                       "max_symbol_word_ratio": " ".join(["### ...", "word"] * 60),
                       "min_words": "too short to keep"}
        for rule, text in self.boiler.items():
            b.append(text)
            self.boiler[rule] = ("b.jsonl", len(b) - 1)
        self.hosts = set()  # training documents holding a copy of validation text
        for k in range(6):
            host, val_doc = 100 + k, files["z.jsonl"][-1 - k].split()
            a[host] = a[host] + " " + " ".join(val_doc[50:80])
            self.hosts.add(("a.jsonl", host))
        for name, texts in files.items():
            (root / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        self.files = files

    def text(self, words: int) -> str:
        return " ".join(self.rng.choice(self.vocab) for _ in range(words))

    def edit(self, text: str, replaced: int) -> str:
        words = text.split()
        for i in self.rng.sample(range(len(words)), replaced):
            words[i] = self.rng.choice(self.vocab) + "q"
        return " ".join(words)


def removed_by(spark_out) -> dict[tuple[str, int], str]:
    return {(Path(r.src).name, r.doc): r.reason for r in spark_out.removed.collect()}


@pytest.mark.slow
def test_planted_duplicates_boilerplate_and_contamination_are_found(spark, tmp_path):
    corpus = Planted(tmp_path)
    cfg = make_config(f"data.path={tmp_path}", "data.format=jsonl", "data.dedup=near",
                      "data.filters.min_words=50", "data.filters.max_dup_lines=0.3",
                      "data.filters.max_symbol_word_ratio=0.1", "data.decontaminate=remove")
    out = run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)))
    removed = removed_by(out)
    assert {doc for doc, why in removed.items() if why == "exact_duplicate"} == corpus.exact
    near = {doc for doc, why in removed.items() if why == "near_duplicate"}
    recall = len(near & corpus.near_above) / len(corpus.near_above)
    kept_ok = corpus.below | {("a.jsonl", i) for i in range(150)} | {
        ("z.jsonl", i) for i in range(40)}
    false_positive = len(near & kept_ok) / len(kept_ok)
    assert len(corpus.near_above) >= 20 and len(corpus.below) >= 20
    assert recall >= 0.95 and false_positive <= 0.01, (recall, false_positive)
    assert {rule: removed.get(doc) for rule, doc in corpus.boiler.items()} == {
        rule: rule for rule in corpus.boiler}
    assert {doc for doc, why in removed.items() if why == "contamination"} == corpus.hosts
    report = out.manifest.curation
    sizes = {"train_documents": 0, "val_documents": 0, "val_ngrams": 0}
    assert report["contamination"] | sizes == {
        "ngram": 13, "val_documents_overlapping": 6, "train_documents_overlapping": 6,
        "action": "remove"} | sizes
    stages = {s["stage"]: s for s in report["stages"]}
    assert list(stages) == ["filters", "exact", "near", "decontaminate"]
    assert stages["exact"]["clusters"]["count"] == 20
    for before, after in zip(report["stages"], report["stages"][1:]):
        assert after["documents_in"] == before["documents_out"]
    total = sum(len(t) for t in corpus.files.values())
    assert report["documents_in"] == total
    assert report["documents_out"] == total - len(removed) == out.manifest.documents
    assert {s["reason"] for s in out.removed_sample} == set(removed.values())


@pytest.mark.slow
def test_the_exact_and_the_filtered_contamination_checks_agree(spark, tmp_path, monkeypatch):
    """A small validation split's n-grams are collected and matched exactly; a large one's go
    through a Bloom filter and joins in Spark: the same figures (the removal: the test above)."""
    Planted(tmp_path)  # six validation documents copied into training ones
    cfg = make_config(f"data.path={tmp_path}", "data.format=jsonl", "data.decontaminate=report")
    exact = run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)))
    monkeypatch.setattr(contamination, "SMALL_VALIDATION_TOKENS", 0)
    filtered = run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)))
    found = exact.manifest.curation["contamination"]
    assert found == filtered.manifest.curation["contamination"]
    assert found["val_documents_overlapping"] == found["train_documents_overlapping"] == 6
    # each validation document (z.jsonl's last, 300 random words) has 288 distinct 13-grams
    assert found["val_documents"] > 10 and found["val_ngrams"] == 288 * found["val_documents"]


def test_exact_file_duplicates_keep_the_first_file_and_the_stream_drops_the_rest(spark, tmp_path):
    texts = {"a.txt": "To be, or not to be.\nThat is the question.\n",
             "b.txt": "Something else entirely.\n",
             "c.txt": "to be, OR not to be.\n\nThat   is the question.\n"}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    base = [f"data.path={tmp_path}", "data.dedup=exact"]
    out = run_etl(spark, EtlPlan.of(cfg := make_config(*base), check_inputs(cfg)))
    assert removed_by(out) == {("c.txt", 0): "exact_duplicate"}
    row = out.removed.first()
    assert (Path(row.kept_src).name, row.kept_doc) == ("a.txt", 0)
    reference = run_etl(spark, EtlPlan.of(cfg := make_config(
        f"data.path=[{tmp_path}/a.txt,{tmp_path}/b.txt]"), check_inputs(cfg)))
    assert out.manifest.tokens == reference.manifest.tokens
    assert out.manifest.documents == 2


def test_score_filter_drops_the_documents_the_model_finds_least_plausible(spark, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    texts = [f"document number {i} " + "words " * 20 for i in range(50)]
    (data / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    path = data / "d.jsonl"
    losses = np.linspace(1.0, 5.0, 50)
    uri = f"file://{path}"
    pq.write_table(pa.table({"path": [uri] * 50, "doc": list(range(50)), "tokens": [30] * 50,
                             "mean_loss": losses}), tmp_path / "scores.parquet")
    base = [f"data.path={data}", "data.format=jsonl",
            f"data.filters.score_path={tmp_path}/scores.parquet"]
    out = run_etl(spark, EtlPlan.of(cfg := make_config(*base, "data.filters.max_score=3.0"),
                                    check_inputs(cfg)))
    assert set(removed_by(out)) == {("d.jsonl", i) for i in range(50) if losses[i] > 3.0}
    out = run_etl(spark, EtlPlan.of(cfg := make_config(
        *base, "data.filters.max_score_quantile=0.8"), check_inputs(cfg)))
    assert len(removed_by(out)) == 10
