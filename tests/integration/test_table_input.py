"""``data.table`` on the real engines: a Delta table written by ``deltalake`` and an Iceberg table
in a SQLite catalog written by ``pyiceberg`` (two snapshots each), a pinned snapshot through the
Spark ETL exactly as its Parquet files read as ``data.path``, the snapshot recorded in the
manifest, the same snapshot a cache hit, rows written while a run reads not read, and
``python -m raydp_llm.train`` as a user runs it on each (from the cache: no second Spark): a
Delta run killed, the table moved on, and the run continued on its own snapshot; its record in
summary.json, run.json and the model; and a mixture of the two tables. The latest snapshot's
resolution, time travel and the refusals are tests/unit/test_tables.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from helpers import commands
from helpers.configs import NO_CHECK, make_config
from helpers.etl import prepare
from helpers.processes import kill_tree
from helpers.terminal import wait_for
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core import integrity

pytestmark = [pytest.mark.integration]

TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.max_steps=10", "train.eval_interval=10",
        "train.eval_batches=2", "train.checkpoint_interval=0", "sample.max_new_tokens=10"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("table_cache")


@pytest.fixture(scope="module")
def table(shakespeare, tmp_path_factory) -> Path:
    """Speeches of the benchmark corpus's first 150 kB as rows: version 0 half of them, version 1
    the rest appended."""
    speeches = _speeches(shakespeare)
    path = tmp_path_factory.mktemp("table") / "speeches"
    half = len(speeches) // 2
    write_deltalake(path, pa.table({"text": speeches[:half]}))
    write_deltalake(path, pa.table({"text": speeches[half:]}), mode="append")
    return path


def _speeches(shakespeare: Path) -> list[str]:
    return [s for s in shakespeare.read_text()[:150_000].split("\n\n") if s.strip()]


@pytest.fixture(scope="module")
def iceberg(shakespeare, tmp_path_factory) -> dict:
    """The same speeches in an Iceberg table of a SQLite catalog: snapshot 1 half, 2 the rest."""
    from pyiceberg.catalog.sql import SqlCatalog

    root = tmp_path_factory.mktemp("iceberg")
    properties = {"name": "tests", "type": "sql", "uri": f"sqlite:///{root}/catalog.db",
                  "warehouse": (root / "warehouse").as_uri()}
    catalog = SqlCatalog("tests", uri=properties["uri"], warehouse=properties["warehouse"])
    catalog.create_namespace("docs")
    table = catalog.create_table("docs.speeches", schema=pa.schema([("text", pa.string())]))
    speeches = _speeches(shakespeare)
    table.append(pa.table({"text": speeches[:len(speeches) // 2]}))
    table.append(pa.table({"text": speeches[len(speeches) // 2:]}))
    first = catalog.load_table("docs.speeches").snapshots()[0]
    files = [t.file.file_path for t in table.scan(snapshot_id=first.snapshot_id).plan_files()]
    override = "+data.catalog={" + ",".join(f"{k}:'{v}'" for k, v in properties.items()) + "}"
    return {"override": override, "first": first.snapshot_id, "files": files}


def _prepared(cache: Path, out: Path, *overrides: str):
    cfg = make_config("data.format=parquet", f"data.cache_dir={cache}", *overrides)
    return prepare(cfg, check_inputs(cfg), out, to_ray=False, store=cache)


def test_a_pinned_snapshot_is_its_files_read_as_they_are_and_is_cached(ray_cluster, table,
                                                                       cache, tmp_path):
    pinned = _prepared(cache, tmp_path / "v0", f"data.table={table}", "data.table_version=0")
    (v0_file,) = DeltaTable(table, version=0).file_uris()
    direct = _prepared(tmp_path / "cache", tmp_path / "direct", f"data.path={v0_file}")
    got, want = pinned.manifest_json(), direct.manifest_json()
    assert not pinned.cache_hit and got["tokens"] == want["tokens"] > 0
    assert got["documents"] == want["documents"] == got["table"]["rows"]
    assert got["inputs"] == want["inputs"]  # the same file, size and time: one cache key's inputs
    assert got["table"] == {"uri": str(table), "format": "delta", "version": 0,
                            "timestamp": got["table"]["timestamp"], "files": 1,
                            "rows": got["documents"]}
    # the same snapshot again: a hit, recorded alike; the latest version is another entry
    again = _prepared(cache, tmp_path / "again", f"data.table={table}", "data.table_version=0")
    assert again.cache_hit and again.manifest_json()["table"] == got["table"]
    assert again.entry == pinned.entry
    # the latest snapshot, fixed when the run starts: rows written meanwhile are not read
    cfg = make_config("data.format=parquet", f"data.cache_dir={cache}", f"data.table={table}")
    corpus = check_inputs(cfg)
    write_deltalake(table, pa.table({"text": ["written while the run ran"]}), mode="append")
    latest = prepare(cfg, corpus, tmp_path / "latest", to_ray=False, store=cache)
    assert not latest.cache_hit and latest.entry != pinned.entry
    assert latest.manifest_json()["table"]["version"] == 1
    assert latest.manifest_json()["documents"] == latest.manifest_json()["table"]["rows"] > \
        got["documents"]
    # the version written meanwhile, as the next test's first run finds it (in the cache)
    assert _prepared(cache, tmp_path / "v2", f"data.table={table}").manifest_json()["table"][
        "version"] == 2


def test_a_killed_run_continues_on_its_snapshot_after_the_table_moved_on(table, cache, tmp_path):
    """The command as a user runs it, the table unpinned: the first run reads the latest version
    (2, cached by the test before) and is SIGKILLed after its first checkpoint; a version 3 is
    appended; the same command (train.resume=auto) continues that checkpoint on version 2, the one
    its record names, and records it in the manifest, the summary, run.json and the model."""
    # 350 steps (several seconds) between the first checkpoint and the end: the kill lands in
    # between (a run that reached max_steps is finished, not continued)
    command = [f"data.table={table}", "data.format=parquet", f"data.cache_dir={cache}", *TINY,
               "train.max_steps=400", "train.checkpoint_interval=50", "train.eval_interval=50",
               NO_CHECK]
    runs = tmp_path / "runs"
    first = commands.start("raydp_llm.train", *command, f"hydra.run.dir={runs / 'killed'}")
    wait_for(first, lambda: any(runs.glob("killed/ray_results/*/checkpoint_*/complete.json")),
             "the first checkpoint", timeout_s=300)
    kill_tree(first)
    write_deltalake(table, pa.table({"text": ["appended after the kill"]}), mode="append")
    summary = commands.train(runs / "again", *command)
    record = summary["table"]
    assert summary["resumed_from"] and "/checkpoint_" in summary["resumed_from"]
    assert record["version"] == 2 and DeltaTable(table).version() == 3
    assert summary["etl"]["cache_hit"] is True and record["files"] == 3
    assert summary["status"] == "finished" and summary["steps"] == 400
    console = (runs / "again.console").read_text()
    assert re.search(rf"data.table={table}: pinned to 2, which run \S+ read", console)
    run_dir = runs / "again"
    # the same record in the manifest, summary.json's etl, run.json and the model's directory
    assert json.loads((run_dir / "manifest.json").read_text())["table"] == record
    assert summary["etl"]["table"] == record and record["rows"] == summary["etl"]["documents"]
    assert json.loads((run_dir / "run.json").read_text())["table"] == record
    assert json.loads((run_dir / "model" / "training_data.json").read_text()) == {
        "table": record}
    assert integrity.problem(run_dir / "model") is None  # sealed again, the record listed


def test_an_iceberg_snapshot_is_its_files_read_as_they_are(ray_cluster, iceberg, cache,
                                                           tmp_path):
    pinned = _prepared(cache, tmp_path / "first", "data.table=docs.speeches", iceberg["override"],
                       f"data.table_version={iceberg['first']}")
    (data_file,) = iceberg["files"]
    direct = _prepared(tmp_path / "cache", tmp_path / "direct",
                       f"data.path={data_file.removeprefix('file://')}")
    got, want = pinned.manifest_json(), direct.manifest_json()
    assert got["tokens"] == want["tokens"] > 0 and got["inputs"] == want["inputs"]
    assert got["documents"] == want["documents"] == got["table"]["rows"]
    assert got["table"] == {"uri": "docs.speeches", "format": "iceberg",
                            "snapshot_id": iceberg["first"], "timestamp": got["table"]["timestamp"],
                            "files": 1, "rows": got["documents"]}


def test_the_command_trains_on_a_mixture_of_a_delta_and_an_iceberg_snapshot(table, iceberg,
                                                                             cache, tmp_path):
    """A mixture of two tables, as a user runs it: the Delta table's version 2 and the Iceberg
    table's first snapshot, each its own source (both cache entries the tests before wrote: the
    same snapshot read alone is the same entry); each source's snapshot is recorded in the
    manifest, run.json and the model's directory."""
    sources = (f"data.sources=[{{name:plays,weight:0.7,table:'{table}',table_version:2}},"
               f"{{name:speeches,weight:0.3,table:docs.speeches,"
               f"table_version:{iceberg['first']}}}]")
    run_dir = tmp_path / "run"
    summary = commands.train(run_dir, sources, iceberg["override"], "data.format=parquet",
                             f"data.cache_dir={cache}", *TINY)
    assert summary["status"] == "finished" and summary["steps"] == 10
    etl = summary["etl"]["sources"]
    assert etl["plays"]["cache_hit"] is True and etl["speeches"]["cache_hit"] is True
    read = {name: source["table"] for name, source in etl.items()}
    assert read["plays"]["format"] == "delta" and read["plays"]["version"] == 2
    assert read["speeches"]["snapshot_id"] == iceberg["first"]
    assert {n: s["table"] for n, s in json.loads((run_dir / "manifest.json").read_text())[
        "sources"].items()} == read
    assert json.loads((run_dir / "run.json").read_text())["source_tables"] == read
    assert json.loads((run_dir / "model" / "training_data.json").read_text()) == {
        "sources": read}
    assert integrity.problem(run_dir / "model") is None
