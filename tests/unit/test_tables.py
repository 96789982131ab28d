"""``data.table``: a real Delta table (written by ``deltalake``) resolved to one snapshot, its
files, rows and record, the ETL cache's key per snapshot, and one line for each bad input; no
engine starts here (tests/integration/test_table_input.py runs the ETL and the command)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from helpers.configs import make_config
from raydp_llm.cli.inputs import corpus_of
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.cache import cache_key
from raydp_llm.data.tables import delta_snapshot


def write_versions(path: Path) -> list[str]:
    """Version 0: two documents; 1: one appended; 2: the first deleted (its file rewritten). The
    commit times of versions 0 and 1, ISO."""
    write_deltalake(path, pa.table({"text": ["to be or not", "to be"], "id": [1, 2]}))
    time.sleep(0.05)
    write_deltalake(path, pa.table({"text": ["that is the question"], "id": [3]}), mode="append")
    DeltaTable(path).delete("id = 1")
    return [dt.datetime.fromtimestamp(c["timestamp"] / 1000, tz=dt.timezone.utc).isoformat()
            for c in sorted(DeltaTable(path).history(), key=lambda c: c["version"])[:2]]


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("delta") / "docs"
    return path, write_versions(path)


def _config(table: Path, *overrides: str):
    return make_config(f"data.table={table}", "data.format=parquet", *overrides)


def test_a_snapshot_is_the_files_its_version_holds(table):
    path, times = table
    latest = delta_snapshot(str(path), None, None, S3Options())
    assert latest.version == 2 and latest.rows == 2 and len(latest.files) == 2
    assert all(Path(f).is_file() and Path(f).parent == path for f in latest.files)
    first = delta_snapshot(str(path), 0, None, S3Options())
    assert first.version == 0 and first.rows == 2 and len(first.files) == 1
    assert first.files[0] not in latest.files  # the delete rewrote its file
    # the last version committed at a time: version 0 until version 1's commit
    assert delta_snapshot(str(path), None, times[0], S3Options()).version == 0
    assert delta_snapshot(str(path), None, times[1], S3Options()).version == 1
    assert first.record() == {"uri": str(path), "format": "delta", "version": 0,
                              "timestamp": first.timestamp, "files": 1, "rows": 2}
    assert first.timestamp.startswith(times[0][:19])


def test_the_cache_key_is_the_snapshots(table):
    """The same snapshot, pinned or as the latest, is one key; another version another."""
    path, _ = table
    cfg = _config(path)
    key = {}
    for name, pin in {"latest": [], "pinned": ["data.table_version=2"],
                      "older": ["data.table_version=1"]}.items():
        settings = _config(path, *pin)
        corpus = corpus_of(settings)
        key[name] = cache_key(corpus, settings.data, settings.tokenizer, settings.seed)
    assert key["latest"] == key["pinned"] != key["older"]
    assert corpus_of(cfg).table["version"] == 2


@pytest.mark.parametrize("overrides, says", [
    (["data.table_version=7"], r"data.table_version=7: \S+ has no such snapshot .*its latest "
                               r"version is 2"),
    (["data.table_version=1", "data.table_as_of=2026-01-01T00:00:00+00:00"],
     r"data.table_version=1 and data.table_as_of=\S+ both pin data.table's snapshot"),
    (["data.format=text"], r"data.format=text: data.table's rows are Parquet rows"),
    (["data.path=/tmp"], r"data.table=\S+ and data.path both name the run's input"),
])
def test_bad_table_settings_get_one_line(table, overrides, says):
    path, _ = table
    with pytest.raises(InputError, match=says):
        corpus_of(make_config(f"data.table={path}", "data.format=parquet", *overrides))


def test_what_reading_the_files_cannot_follow_is_refused(tmp_path):
    """No table at the path; columns mapped by name (a rename lives in the log, not the files)."""
    with pytest.raises(InputError, match=r"data.table=\S+: no Delta table there .*_delta_log"):
        delta_snapshot(str(tmp_path), None, None, S3Options())
    mapped = tmp_path / "mapped"
    write_deltalake(mapped, pa.table({"text": ["a"]}),
                    configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(InputError, match=r"its columns are mapped \(delta.columnMapping.mode="
                                         r"name\)"):
        delta_snapshot(str(mapped), None, None, S3Options())
