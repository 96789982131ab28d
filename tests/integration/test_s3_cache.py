"""The ETL cache on S3 (``data.cache_dir=s3://...``, ``data/s3_cache.py``) on the S3 stand-in and
the real Spark: the entry the local cache holds, written by the executors; found again without
Spark; one sealed copy when two runs built a key at once; a damaged entry rebuilt. The EMR run on
two nodes reads it from both (test_multinode.py)."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest

from helpers.configs import make_config
from helpers.etl import prepare
from helpers.s3 import BUCKET
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core import integrity, storage
from raydp_llm.data import cache, s3_cache

pytestmark = pytest.mark.integration

DATA = ["model.block_size=32", "data.chunk_tokens=2048"]


def test_an_s3_entry_is_the_local_one_found_again_sealed_once_and_rebuilt_when_damaged(
    ray_cluster, s3, corpus_dir, tmp_path, caplog
):
    cache_dir = f"s3://{BUCKET}/s3cache/{tmp_path.name}"
    settings = make_config(f"data.path={corpus_dir}", f"data.cache_dir={cache_dir}",
                           f"s3.endpoint_url={s3.endpoint_url}", *DATA)
    corpus = check_inputs(settings)
    local_cfg = make_config(f"data.path={corpus_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                            *DATA)
    local = prepare(local_cfg, corpus, tmp_path / "local", to_ray=True, store=tmp_path / "cache")
    built = prepare(settings, corpus, tmp_path / "built", to_ray=True, store=cache_dir)

    # The same key, manifest and chunks as the local entry; each chunk a row group of its own, read
    # from S3 as the workers read it
    key = local.manifest.etl_key
    assert built.cache_hit is False and built.entry.startswith(f"{cache_dir}/{key}/")
    assert built.manifest.to_json() == local.manifest.to_json()
    for split, index in built.index.items():
        assert len(index) > 1
        for c, start in enumerate(index.start):
            assert built.sources[split].fetch(c, start) == local.sources[split].fetch(c, start)
        footers = built.sources[split].footers
        assert sum(f.num_row_groups for f in footers) == sum(f.num_rows for f in footers)
    assert integrity.problem(built.entry, s3, hashes=False) is None  # sealed, every file listed
    assert storage.exists(f"{built.entry}/documents", s3)

    # Found again: no Spark, the same copy
    hit = prepare(settings, corpus, tmp_path / "hit", to_ray=True, store=cache_dir)
    assert hit.cache_hit and hit.entry == built.entry and "spark_start_s" not in hit.timings
    assert hit.manifest.to_json() == built.manifest.to_json()

    # Two runs built the key at once: the later one's commit finds the pointer, deletes its own
    # copy and reads the first one's
    rival = s3_cache.Staged(cache_dir, key, "rival", Path(tempfile.mkdtemp()), s3)
    storage.copy(built.entry, rival.uri, s3)
    assert rival.commit({"rival": True}) == built.entry
    assert not storage.exists(rival.uri, s3) and not rival.local.exists()

    # A chunk file cut short on S3: the next run says so in one line and builds the key again
    part = storage.list_objects(f"{built.entry}/train/", s3)[0].path
    fs, _ = storage.resolve(built.entry, s3)
    with fs.open_input_stream(part) as f:
        head = f.read(1000)
    with fs.open_output_stream(part) as f:
        f.write(head)
    with caplog.at_level(logging.WARNING, logger="raydp_llm.data.s3_cache"):
        rebuilt = prepare(settings, corpus, tmp_path / "rebuilt", to_ray=False, store=cache_dir)
    assert "is damaged (train/part-00000.parquet has 1000 bytes" in caplog.text
    assert rebuilt.cache_hit is False and rebuilt.entry != built.entry
    pointer = json.loads(storage.read_text(f"{cache_dir}/{key}/{s3_cache.POINTER}", s3))
    assert rebuilt.entry.endswith(pointer["attempt"])
    assert cache.entry_problem(rebuilt.entry, s3) is None


def test_a_key_is_named_once_and_an_unreadable_name_is_dropped(s3, caplog):
    """The key's pointer: written by one writer of two (S3's conditional PUT), and, unreadable,
    deleted with one line so that the key is built again."""
    pointer = f"s3://{BUCKET}/s3cache/named/key/{s3_cache.POINTER}"
    assert storage.write_new(pointer, '{"attempt": "a"}', s3)
    assert not storage.write_new(pointer, '{"attempt": "b"}', s3)
    assert json.loads(storage.read_text(pointer, s3)) == {"attempt": "a"}
    storage.remove(pointer, s3)
    storage.write_text(pointer, "{half", s3)
    with caplog.at_level(logging.WARNING, logger="raydp_llm.data.s3_cache"):
        assert s3_cache.lookup(f"s3://{BUCKET}/s3cache/named", "key", s3) is None
    assert "sealed.json is unreadable (JSONDecodeError)" in caplog.text
    assert not storage.exists(pointer, s3)
