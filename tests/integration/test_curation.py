"""Curation on the real engines: document keys across input splits."""

from __future__ import annotations

import pytest

from conftest import make_config
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.data.documents import document_keys
from raydp_llm.data.etl import documents, read_lines
from raydp_llm.engines.spark import spark_session

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark(ray_cluster, tmp_path_factory):
    cfg = make_config()
    with spark_session(cfg.cluster, app_name="test_curation",
                       log_dir=tmp_path_factory.mktemp("spark")) as session:
        yield session


def reference_keys(lines: list[str], split: str) -> list[int]:
    """Each line's document number in its file, as the encoder cuts documents (-1: blank)."""
    keys, number, last_blank = [], -1, True
    for i, line in enumerate(lines):
        blank = not line.strip()
        if blank:
            keys.append(-1)
        elif split == "line":
            keys.append(i)
        elif split == "file":
            keys.append(0)
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
