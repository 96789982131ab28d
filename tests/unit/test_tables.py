"""``data.table``: a real Delta table (written by ``deltalake``) resolved to one snapshot, its
files, rows and record, the ETL cache's key per snapshot, and one line for each bad input; no
engine starts here (tests/integration/test_table_input.py runs the ETL and the command)."""

from __future__ import annotations

import datetime as dt
import json
import socket
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
from raydp_llm.data.inputs.tables import delta_snapshot, table_corpus


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


@pytest.fixture(scope="module")
def iceberg(tmp_path_factory) -> dict:
    """An Iceberg table in a SQLite catalog: snapshot 0 two documents, 1 one appended, 2 the
    first deleted (pyiceberg rewrites its file); then its text column renamed to body."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.expressions import EqualTo

    root = tmp_path_factory.mktemp("iceberg")
    properties = {"name": "tests", "type": "sql", "uri": f"sqlite:///{root}/catalog.db",
                  "warehouse": (root / "warehouse").as_uri()}
    catalog = SqlCatalog("tests", uri=properties["uri"], warehouse=properties["warehouse"])
    catalog.create_namespace("docs")
    table = catalog.create_table("docs.speeches", schema=pa.schema(
        [("text", pa.string()), ("id", pa.int64())]))
    table.append(pa.table({"text": ["to be or not", "to be"], "id": [1, 2]}))
    table.append(pa.table({"text": ["that is the question"], "id": [3]}))
    table.delete(EqualTo("id", 1))
    snapshots = [s.snapshot_id for s in catalog.load_table("docs.speeches").snapshots()]
    return {"properties": properties, "catalog": catalog, "snapshots": snapshots}


def _catalog_override(properties: dict) -> str:
    return "+data.catalog={" + ",".join(f"{k}:'{v}'" for k, v in properties.items()) + "}"


def test_an_iceberg_snapshot_is_the_files_its_scan_plans(iceberg):
    from raydp_llm.data.inputs.tables import iceberg_snapshot

    first, second, latest = iceberg["snapshots"]
    cfg = make_config("data.table=docs.speeches", "data.format=parquet",
                      _catalog_override(iceberg["properties"]))
    corpus = corpus_of(cfg)
    assert corpus.table == {"uri": "docs.speeches", "format": "iceberg", "snapshot_id": latest,
                            "timestamp": corpus.table["timestamp"], "files": 2, "rows": 2}
    assert all(Path(f).is_file() for f in corpus.files) and corpus.fingerprinted
    pinned = iceberg_snapshot("docs.speeches", iceberg["properties"], first, None, ("text",),
                              S3Options())
    assert pinned.rows == 2 and len(pinned.files) == 1
    assert pinned.files[0] not in {Path(f).as_uri() for f in corpus.files}  # rewritten since
    at_second = iceberg_snapshot("docs.speeches", iceberg["properties"], None,
                                 pinned_time(iceberg, second), ("text",), S3Options())
    assert at_second.version == second
    with pytest.raises(InputError, match=r"data.table_version=7: docs.speeches has no such "
                                         r"snapshot; its snapshots are \d+, \d+, \d+"):
        iceberg_snapshot("docs.speeches", iceberg["properties"], 7, None, ("text",), S3Options())
    with pytest.raises(InputError, match=r"data.table=docs.nothing: not found in data.catalog "
                                         r"\(NoSuchTableError"):
        iceberg_snapshot("docs.nothing", iceberg["properties"], None, None, ("text",), S3Options())


def pinned_time(iceberg: dict, snapshot_id: int) -> str:
    """The ISO time of a snapshot's commit."""
    table = iceberg["catalog"].load_table("docs.speeches")
    ms = table.snapshot_by_id(snapshot_id).timestamp_ms
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


def test_a_column_renamed_since_files_were_written_is_refused(iceberg, tmp_path):
    """Files written as text, the column now body: Spark's reader, by name, would miss them."""
    from raydp_llm.data.inputs.tables import iceberg_snapshot

    catalog = iceberg["catalog"]
    renamed = catalog.create_table("docs.renamed", schema=pa.schema([("text", pa.string())]))
    renamed.append(pa.table({"text": ["a line"]}))
    with renamed.update_schema() as update:
        update.rename_column("text", "body")
    with pytest.raises(InputError, match=r"data.table=docs.renamed: column body had another name "
                                         r"when \S+ was written"):
        iceberg_snapshot("docs.renamed", iceberg["properties"], None, None, ("body",), S3Options())
    # by the name its files hold (each was written before the rename), the snapshot reads
    before = catalog.load_table("docs.renamed").snapshots()[0].snapshot_id
    assert iceberg_snapshot("docs.renamed", iceberg["properties"], before, None, ("text",),
                            S3Options()).rows == 1


def test_deltalake_still_labels_an_older_versions_history_from_that_version(table):
    """The quirk ``tables._commit_time`` works around (deltalake 1.6.6): loaded at version 0, the
    table's history labels its newest commit 0. When this fails, read the time from the loaded
    table's own history again."""
    path, _ = table
    loaded = DeltaTable(path, version=0)
    newest = max(DeltaTable(path).history(), key=lambda c: c["version"])
    assert {c["version"] for c in loaded.history()} == {0, -1, -2}
    assert next(c for c in loaded.history() if c["version"] == 0)["timestamp"] == \
        newest["timestamp"]


def _record(run_dir: Path, run_id: str, table: dict | None, status: str = "running",
            resumed_from: str | None = None, source_tables: dict | None = None) -> None:
    """A run's run.json as a dead run left it (pid 1 never started at 0.0: not alive)."""
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_id, "out_dir": str(run_dir), "resumed_from": resumed_from,
        "status": status, "host": socket.gethostname(), "pid": 1, "pid_started": 0.0,
        "heartbeat": time.time(), "table": table, "source_tables": source_tables}))


def test_a_resumed_run_is_pinned_to_the_snapshot_of_the_run_it_continues(table, tmp_path):
    """train.resume=auto, data.table unpinned: the newest dead, unfinished run of that table, not
    continued since, names the version; its siblings' other states do not."""
    from raydp_llm.training.driver.runs import pin_resumed_table

    path, _ = table
    record = delta_snapshot(str(path), 1, None, S3Options()).record()
    runs = tmp_path / "outputs"
    settings = _config(path)
    assert pin_resumed_table(settings, runs / "new", None) is settings  # no earlier run
    _record(runs / "finished", "a", {**record, "version": 0}, status="finished")
    _record(runs / "other_table", "b", {**record, "uri": "/elsewhere", "version": 0})
    assert pin_resumed_table(settings, runs / "new", None) is settings
    _record(runs / "killed", "c", record)
    assert pin_resumed_table(settings, runs / "new", None).data.table_version == 1
    for kept in (_config(path, "data.table_version=2"), _config(path, "train.resume=never")):
        assert pin_resumed_table(kept, runs / "new", None) is kept
    # a run that finished continuing the killed one: nothing is left to continue
    _record(runs / "continued", "d", record, status="finished",
            resumed_from=str(runs / "killed" / "ray_results" / "r" / "checkpoint_000000"))
    (runs / "killed" / "ray_results" / "r").mkdir(parents=True)
    (runs / "killed" / "run.json").rename(runs / "killed" / "ray_results" / "r" / "run.json")
    assert pin_resumed_table(settings, runs / "new", None) is settings

    # a mixture: each unpinned table source pinned to what the killed mixture read, the pinned
    # one kept; a run of the table alone, or of other sources, is not the mixture's
    mixture = make_config("data.format=parquet", f"data.sources=[{{name:new,table:'{path}',"
                          f"table_since:0}},{{name:old,table:'{path}',table_version:0}}]")
    mixtures = tmp_path / "mixtures"
    _record(mixtures / "alone", "e", record)
    _record(mixtures / "others", "f", None, source_tables={"other": record})
    assert pin_resumed_table(mixture, mixtures / "new", None) is mixture
    _record(mixtures / "killed", "g", None, source_tables={"new": record,
                                                           "old": {**record, "version": 0}})
    pinned = pin_resumed_table(mixture, mixtures / "new", None).data.sources
    assert [(s.name, s.table_version, s.table_since) for s in pinned] == [("new", 1, "0"),
                                                                           ("old", 0, None)]


def test_a_snapshot_whose_file_was_vacuumed_is_one_line(tmp_path):
    """A version's data file removed since (VACUUM, expired snapshots): refused at the door."""
    path = tmp_path / "vacuumed"
    write_versions(path)
    (gone,) = DeltaTable(path, version=0).file_uris()
    Path(gone).unlink()
    with pytest.raises(InputError) as refused:
        corpus_of(_config(path, "data.table_version=0"))
    assert str(refused.value).startswith(f"data.table={path}: snapshot 0 names a data file that "
                                         f"is gone ({gone}: no such file")
    assert "\n" not in str(refused.value)


def test_what_was_appended_since_a_version_is_read_alone(table, tmp_path):
    """data.table_since: version 1's appended file alone after 0; a delete in between (version 2
    rewrote a file of 0) refused; model: the version a model's directory records."""
    path, _ = table
    appended = corpus_of(_config(path, "data.table_version=1", "data.table_since=0"))
    (only,) = appended.files
    assert only not in delta_snapshot(str(path), 0, None, S3Options()).files
    assert appended.table["since"] == 0 and appended.table["rows"] == 1
    with pytest.raises(InputError, match=r"data.table_since=0: between it and 2, \S+ rewrote or "
                                         r"removed 1 of its data files"):
        corpus_of(_config(path, "data.table_since=0"))
    with pytest.raises(InputError, match=r"data.table_since=1: \S+ has no rows appended after "
                                         r"it \(snapshot 1\)"):
        corpus_of(_config(path, "data.table_version=1", "data.table_since=1"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "training_data.json").write_text(json.dumps(
        {"table": delta_snapshot(str(path), 0, None, S3Options()).record()}))
    since_model = _config(path, "data.table_version=1", "data.table_since=model").data
    # (cli/inputs.py gives model.path, or model.init_from, as the model's directory)
    assert table_corpus(since_model, S3Options(), str(model)).files == appended.files
    with pytest.raises(InputError, match=r"data.table_since=model: \S+training_data.json names "
                                         r"no table snapshot"):
        table_corpus(since_model, S3Options(), str(tmp_path))
    # a mixture's model: the newest snapshot of the table among its sources (here version 0,
    # written as a replay beside another table's source)
    old = delta_snapshot(str(path), 0, None, S3Options()).record()
    (model / "training_data.json").write_text(json.dumps({"sources": {
        "replay": old, "other": {**old, "uri": "/elsewhere", "timestamp": "9999"}}}))
    assert table_corpus(since_model, S3Options(), str(model)).files == appended.files
    (model / "training_data.json").write_text(json.dumps({"sources": {"other": {
        **old, "uri": "/elsewhere"}}}))
    with pytest.raises(InputError, match=r"data.table_since=model: \S+ learned from /elsewhere, "
                                         r"not data.table="):
        table_corpus(since_model, S3Options(), str(model))


def test_what_was_appended_to_an_iceberg_table_is_read_alone(iceberg):
    first, second, latest = iceberg["snapshots"]
    catalog = _catalog_override(iceberg["properties"])
    appended = corpus_of(make_config("data.table=docs.speeches", "data.format=parquet", catalog,
                                     f"data.table_version={second}", f"data.table_since={first}"))
    assert appended.table["rows"] == 1 and len(appended.files) == 1
    assert appended.table["snapshot_id"] == second and appended.table["since"] == first
    with pytest.raises(InputError, match=rf"data.table_since={first}: between it and {latest}"):
        corpus_of(make_config("data.table=docs.speeches", "data.format=parquet", catalog,
                              f"data.table_since={first}"))


def test_a_mixture_replays_the_old_snapshot_beside_what_was_appended(table):
    """Two sources of one table: what version 1 appended after 0, and version 0 replayed."""
    from raydp_llm.cli.inputs import check_inputs

    path, _ = table
    settings = make_config(
        "data.format=parquet",
        f"data.sources=[{{name:new,weight:0.8,table:'{path}',table_version:1,table_since:0}},"
        f"{{name:replay,weight:0.2,table:'{path}',table_version:0}}]")
    corpora = check_inputs(settings)
    assert corpora["new"].table["since"] == 0 and corpora["new"].table["rows"] == 1
    assert corpora["replay"].table["version"] == 0 and corpora["replay"].table["rows"] == 2
    assert not set(corpora["new"].files) & set(corpora["replay"].files)


def test_tables_on_s3_resolve_as_local_ones(s3, tmp_path):
    """A Delta table under s3:// and an Iceberg table of a Glue catalog with its warehouse on S3
    (both on the S3 stand-in): pinned, at a time and appended-since as the local ones, their files
    s3:// objects listed with their sizes (the cache key's inputs). A missing bucket and a catalog
    endpoint nobody answers at (read from, or written to by output.catalog) are one line each, at
    once."""
    from helpers.s3 import BUCKET, glue_catalog
    from raydp_llm.data.inputs.table_out import append_once
    from raydp_llm.data.inputs.tables import delta_location, iceberg_catalog

    endpoint = f"s3.endpoint_url={s3.endpoint_url}"
    uri = f"s3://{BUCKET}/tables/{tmp_path.name}/docs"
    target, options = delta_location(uri, s3)
    write_deltalake(target, pa.table({"text": ["to be", "or not"]}), storage_options=options)
    # time travel goes by the log files' modification times, which S3 keeps in whole seconds
    time.sleep(1.1)
    write_deltalake(target, pa.table({"text": ["to be"]}), storage_options=options, mode="append")
    first, latest = (delta_snapshot(uri, v, None, s3) for v in (0, None))
    assert (first.version, first.rows, latest.version, latest.rows) == (0, 2, 1, 3)
    assert all(f.startswith(f"{uri}/") for f in latest.files)
    assert delta_snapshot(uri, None, first.timestamp, s3).version == 0  # as of its commit
    corpus = corpus_of(make_config(f"data.table={uri}", "data.format=parquet", endpoint,
                                   "data.table_since=0"))
    assert corpus.files == sorted(set(latest.files) - set(first.files))
    assert corpus.fingerprinted and corpus.table["uri"] == uri and corpus.table["rows"] == 1

    properties = glue_catalog(s3, f"s3://{BUCKET}/warehouse-{tmp_path.name}")
    catalog = iceberg_catalog(properties)
    catalog.create_namespace("unit_docs")
    table = catalog.create_table("unit_docs.speeches", schema=pa.schema([("text", pa.string())]))
    table.append(pa.table({"text": ["to be", "or not"]}))
    table.append(pa.table({"text": ["to be"]}))
    snapshots = [s.snapshot_id for s in catalog.load_table("unit_docs.speeches").snapshots()]
    override = _catalog_override(properties)
    corpus = corpus_of(make_config("data.table=unit_docs.speeches", "data.format=parquet",
                                   override, endpoint, f"data.table_since={snapshots[0]}"))
    assert corpus.table["snapshot_id"] == snapshots[1] and corpus.table["rows"] == 1
    assert corpus.fingerprinted and corpus.files[0].startswith(f"{properties['warehouse']}/")

    with pytest.raises(InputError, match=r"data.table=s3://no-such-bucket/docs: there is no "
                                         r"bucket no-such-bucket"):
        delta_snapshot("s3://no-such-bucket/docs", None, None, s3)
    started = time.monotonic()
    with pytest.raises(InputError, match=r"data.table=unit_docs.speeches: data.catalog cannot be "
                                         r"reached: nothing answers at data.catalog.glue.endpoint="
                                         r"http://127.0.0.1:9 "):
        corpus_of(make_config("data.table=unit_docs.speeches", "data.format=parquet", endpoint,
                              _catalog_override(properties | {"glue.endpoint":
                                                              "http://127.0.0.1:9"})))
    assert time.monotonic() - started < 5  # not boto3's retries (about 25 s)
    started = time.monotonic()
    with pytest.raises(InputError, match=r"output.table=unit_docs.answers: output.catalog cannot "
                                         r"be reached: nothing answers at output.catalog.glue."
                                         r"endpoint=http://127.0.0.1:9 "):
        append_once("unit_docs.answers", properties | {"glue.endpoint": "http://127.0.0.1:9"},
                    "job-1", [lambda: pa.table({"answer": ["2"]})], s3)
    assert time.monotonic() - started < 5


def test_every_record_format_reads_a_table_and_checks_its_own_columns(table, iceberg):
    """Preference pairs and GRPO prompts are Parquet rows too: a table resolves for them as for
    documents, and the prompts' manifest carries its record. A column renamed since a file was
    written is refused when the format reads it (every column, for prompts: rewards read any),
    not when it does not."""
    from raydp_llm.data.inputs.tables import iceberg_snapshot
    from raydp_llm.data.prompts.dataset import PromptManifest

    path, _ = table
    for data_format in ("preference", "prompts"):
        assert corpus_of(_config(path, f"data.format={data_format}")).table["version"] == 2
    record = corpus_of(_config(path, "data.format=prompts")).table
    manifest = PromptManifest("c", {}, {}, None, "char", 10, table=record)
    assert manifest.to_json()["table"] == record
    assert "table" not in PromptManifest("c", {}, {}, None, "char", 10).to_json()

    catalog = iceberg["catalog"]
    answers = catalog.create_table("docs.answers", schema=pa.schema(
        [("prompt", pa.string()), ("answer", pa.string())]))
    answers.append(pa.table({"prompt": ["1+1="], "answer": ["2"]}))
    with answers.update_schema() as update:
        update.rename_column("answer", "solution")
    text_only = iceberg_snapshot("docs.answers", iceberg["properties"], None, None, ("prompt",),
                                 S3Options())
    assert text_only.rows == 1  # the renamed column is not read
    with pytest.raises(InputError, match=r"data.table=docs.answers: column solution had another "
                                         r"name when \S+ was written"):
        corpus_of(make_config("data.table=docs.answers", "data.format=prompts",
                              _catalog_override(iceberg["properties"])))
