"""The ETL's typed records: ``manifest.json`` read and written back byte for byte (the keys in
their order, the optional ones only when set), the per-file statistics merged, a reader per
``data.format``."""

from __future__ import annotations

import json
from types import SimpleNamespace

from raydp_llm.data.etl.formats import READERS
from raydp_llm.data.etl.records import FileStats, Manifest

ON_DISK = {
    "corpus": "c", "files": 2, "skipped_binary_files": [], "documents": 3, "bytes": None,
    "characters": 90, "invalid_utf8_replaced": 0, "tokens": 40, "tokens_train": 36,
    "tokens_val": 4, "chars_per_token": 2.25, "chunks_train": 1, "chunks_val": 1,
    "chunk_tokens": 8192, "halo_tokens": 1025, "token_bytes_stored": 80, "vocab_size": 50,
    "tokenizer": "char", "tokenizer_hash": "abc", "token_dtype": "uint16", "split": "tail",
    "val_fraction": 0.1, "format": "jsonl", "seed": 1337,
    "inputs": [{"path": "/a", "size": 45, "mtime_ns": 1}], "document_split": "line",
    "curation": {"stages": []},
}


def test_manifest_json_round_trips_byte_for_byte():
    bad = {"bad_json_lines": {"not_json": 1, "no_field": 0, "not_string": 0, "files": {"/a": 1}}}
    for content in (ON_DISK, ON_DISK | {"etl_key": "k"}, bad | ON_DISK | {"etl_key": "k"}):
        text = json.dumps(content, indent=2)
        manifest = Manifest.from_json(json.loads(text))
        assert json.dumps(manifest.to_json(), indent=2) == text
    assert Manifest.from_json(ON_DISK).chunks("val") == 1


def test_file_stats_merge_an_executors_row_and_id_lines():
    stats = FileStats()
    row = SimpleNamespace(lines=2, chars=10, nonblank=8, nul_lines=0, replaced=1, ids=3,
                          not_json=1, no_field=0, not_string=0, charset="ab", bad=None,
                          min_id=4, max_id=9)
    stats.merge(row)
    stats.merge(row)
    stats.add_ids("1 12 5")
    assert (stats.lines, stats.replaced, stats.ids, stats.bad_json_lines()) == (4, 2, 9, 2)
    assert (stats.min_id, stats.max_id, stats.charset) == (1, 12, {"a", "b"})
    stats.add_ids("3 x4 7")
    assert stats.bad == "x4" and stats.ids == 9


def test_every_data_format_has_a_reader():
    assert sorted(READERS) == ["chat", "ids", "jsonl", "parquet", "preference", "prompts", "sql",
                               "text"]
    assert [name for name, r in READERS.items() if r.token_ids] == ["ids"]
    assert [name for name, r in READERS.items() if r.chat] == ["chat", "preference"]
    assert [name for name, r in READERS.items() if r.pairs] == ["preference"]
    assert sorted(name for name, r in READERS.items() if r.rows_are_documents) == [
        "chat", "jsonl", "parquet", "preference", "prompts", "sql"]
