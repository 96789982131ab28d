"""``data.table``: a Delta Lake or Iceberg table as the ETL's input, resolved to one snapshot when
the run starts.

Each format's own library names the snapshot's data files: ``deltalake`` (delta-rs) from the
table's log (the files its version adds and has not removed since), ``pyiceberg`` from the
catalog's table (``data.catalog``: its scan plan). Rows a delete or an update rewrote are gone with
their files. The ETL reads exactly those Parquet files, as it reads ``data.path``'s (Spark's own
Delta and Iceberg readers are jars from Maven, which these machines cannot fetch). Their paths,
sizes and modification times are the ETL cache's key: the same snapshot is a hit, another a miss.
What the files alone cannot say is refused with one line: Delta's deletion vectors and column
mapping, Iceberg's delete files, and a column renamed since some of the files were written.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from urllib.parse import urlparse

import pyarrow as pa

from raydp_llm.core import storage
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options, is_s3, s3_uri
from raydp_llm.data.inputs.files import Corpus, local_path, resolve_corpus


@dataclass(frozen=True)
class TableSnapshot:
    """One snapshot of a table: what the run reads and records (``record``)."""

    uri: str  # as given: a Delta directory (or s3:// prefix), an Iceberg namespace.table
    version: int  # Delta's version, Iceberg's snapshot id
    timestamp: str  # its commit's time, ISO 8601 in UTC
    # the data files (absolute paths or URIs, sorted), each with its rows from the log's or the
    # manifests' statistics (None where a file has none)
    rows_by_file: dict[str, int | None]
    format: str = "delta"  # or iceberg
    since: int | None = None  # only the rows appended after this version or snapshot

    @property
    def files(self) -> list[str]:
        return sorted(self.rows_by_file)

    @property
    def rows(self) -> int | None:
        counts = list(self.rows_by_file.values())
        return None if None in counts else int(sum(counts))

    def record(self) -> dict:
        """The snapshot as the manifest and the summary hold it."""
        key = "version" if self.format == "delta" else "snapshot_id"
        since = {} if self.since is None else {"since": self.since}
        return {"uri": self.uri, "format": self.format, key: self.version, **since,
                "timestamp": self.timestamp, "files": len(self.files), "rows": self.rows}

    def appended_since(self, base: TableSnapshot) -> TableSnapshot:
        """The rows appended after ``base`` (an earlier snapshot): the files this one holds and
        ``base`` does not. Refused when a file of ``base`` is gone (rows rewritten, deleted or
        compacted in between) or nothing was appended."""
        what = f"data.table_since={base.version}"
        gone = sorted(set(base.rows_by_file) - set(self.rows_by_file))
        if gone:
            raise InputError(f"{what}: between it and {self.version}, {self.uri} rewrote or "
                             f"removed {len(gone)} of its data files (a delete, an update, a "
                             f"merge or a compaction: {gone[0]}), so its new rows are not just "
                             "the appended ones; train on the whole snapshot (no "
                             "data.table_since)")
        added = {f: n for f, n in self.rows_by_file.items() if f not in base.rows_by_file}
        if not added:
            raise InputError(f"{what}: {self.uri} has no rows appended after it (snapshot "
                             f"{self.version}); nothing to train on")
        return replace(self, rows_by_file=added, since=base.version)

    def corpus(self, s3: S3Options) -> Corpus:
        """The snapshot's data files as the ETL's corpus, listed as ``data.path``'s are (their
        sizes and modification times, the cache key's and the ETL's check that nothing changed
        while it read; a file vacuumed since is one line)."""
        local = [local_path(f) if f.startswith("file:") else f for f in self.files]
        try:
            listed = resolve_corpus(local, markdown=False, s3=s3)
        except InputError as err:  # a file vacuumed, or its snapshot expired
            raise InputError(f"data.table={self.uri}: snapshot {self.version} names a data file "
                             f"that is gone ({str(err).removeprefix('data.path=')}); pin a later "
                             "snapshot (data.table_version), or restore the file") from None
        return replace(listed, name=f"{self.uri}@{self.version}", table=self.record())


def delta_location(uri: str, s3: S3Options) -> tuple[str, dict[str, str]]:
    """A Delta table's URI as delta-rs takes it (``s3a://`` as ``s3://``) and delta-rs's storage
    options: for an s3:// table the endpoint and region of the ``s3`` settings (the credentials
    come from the environment, as for every other S3 read)."""
    if not is_s3(uri):
        return uri, {}
    options = {"AWS_REGION": s3.region or "us-east-1"}
    if s3.endpoint_url:
        options["AWS_ENDPOINT_URL"] = s3.endpoint_url
        options["AWS_ALLOW_HTTP"] = str(urlparse(s3.endpoint_url).scheme == "http").lower()
    return s3_uri(uri), options


def is_iceberg(table: str, catalog: dict) -> bool:
    """Whether ``data.table`` (or a source's ``table``) names an Iceberg table of ``data.catalog``
    (``namespace.table``), not a Delta table's location (a path or URI: a mixture may hold
    both)."""
    return bool(catalog) and "/" not in table


def iceberg_catalog(catalog: dict, setting: str = "data.catalog"):
    """The pyiceberg catalog of ``data.catalog``'s (or ``output.catalog``'s: ``setting``)
    properties: its ``name`` (default ``default``) and the rest as pyiceberg takes them. An
    endpoint nobody answers at is an OSError at once, naming ``setting``'s key."""
    from pyiceberg.catalog import load_catalog

    _catalog_answers(catalog, setting)
    properties = {k: str(v) for k, v in catalog.items()}
    return load_catalog(properties.pop("name", "default"), **properties)


def _open(uri: str, version: int | None, as_of: str | None, s3: S3Options):
    """The table at ``version`` (or the last version committed at ``as_of``, or the latest)."""
    from deltalake import DeltaTable

    target, options = delta_location(uri, s3)
    try:
        table = DeltaTable(target, storage_options=options)
    except Exception as err:  # TableNotFoundError, an unreachable store
        raise InputError(f"data.table={uri}: no Delta table there ({type(err).__name__}: "
                         f"{str(err).splitlines()[0]}); give the table's directory, the one "
                         "holding _delta_log/") from None
    try:
        if version is not None:
            table.load_as_version(version)
        elif as_of is not None:
            table.load_as_version(dt.datetime.fromisoformat(as_of))
    except Exception as err:
        what = (f"data.table_version={version}" if version is not None
                else f"data.table_as_of={as_of}")
        raise InputError(f"{what}: {uri} has no such snapshot ({str(err).splitlines()[0]}); its "
                         f"latest version is {table.version()}: give a version from 0 to it, or "
                         "a time after the table's first commit") from None
    return table


def _refuse_what_files_cannot_say(table, uri: str) -> None:
    """Deletion vectors and column mapping change what a file's rows mean: refused."""
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise InputError(f"data.table={uri}: its columns are mapped (delta.columnMapping.mode="
                         f"{mode}), which reading its files directly cannot follow; rewrite the "
                         "table without column mapping, or export the snapshot to Parquet and "
                         "give data.path")
    if pa.table(table.deletion_vectors()).num_rows:
        raise InputError(f"data.table={uri}: version {table.version()} has rows deleted by "
                         "deletion vectors, which reading its files directly would bring back; "
                         "purge them first (REORG TABLE ... APPLY (PURGE)), or pin "
                         "data.table_version to a version before the delete")


def _commit_time(table, latest) -> str:
    """The ISO time (UTC) of ``table``'s loaded version's commit, read from the ``latest`` state
    of the same table: deltalake 1.6.6's ``history()`` of a table loaded at an older version
    labels the newest commits with that version and the ones below it (read 2026-12-03;
    tests/unit/test_tables.py holds it)."""
    version = table.version()
    for commit in latest.history():
        if commit.get("version") == version:
            stamp = dt.datetime.fromtimestamp(commit["timestamp"] / 1000, tz=dt.timezone.utc)
            return stamp.isoformat(timespec="milliseconds")
    return ""  # the log's history no longer holds it (its checkpoint does)


def delta_snapshot(uri: str, version: int | None, as_of: str | None,
                   s3: S3Options) -> TableSnapshot:
    """``uri``'s snapshot at ``version``, at ``as_of`` or the latest: its data files and rows."""
    if is_s3(uri):  # a missing bucket or an endpoint nobody answers at is its own line, once
        storage.check_bucket("data.table", uri, s3)
    table = _open(uri, version, as_of, s3)
    _refuse_what_files_cannot_say(table, uri)
    uris = {u.rsplit("/", 1)[-1]: u for u in table.file_uris()}  # data files' names are unique
    if not uris:
        raise InputError(f"data.table={uri}: version {table.version()} holds no rows; give a "
                         "version with data (data.table_version)")
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    counts = actions.get("num_records", [None] * len(actions["path"]))
    rows = {uris[p.rsplit("/", 1)[-1]]: None if n is None else int(n)
            for p, n in zip(actions["path"], counts)}
    latest = table if version is None and as_of is None else _open(uri, None, None, s3)
    return TableSnapshot(uri=uri, version=table.version(), timestamp=_commit_time(table, latest),
                         rows_by_file=rows)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat(
        timespec="milliseconds")


# the properties of pyiceberg's catalogs that name the service its client calls
CATALOG_ENDPOINTS = ("uri", "glue.endpoint")


def _catalog_answers(catalog: dict, setting: str) -> None:
    """An OSError at once when nothing listens at the catalog's endpoint (a REST catalog's
    ``uri``, ``glue.endpoint``): boto3 retries a refused Glue connection for about 25 s."""
    for key in CATALOG_ENDPOINTS:
        url = urlparse(str(catalog.get(key, "")))
        if url.scheme in ("http", "https") and url.hostname:
            storage.answers(url, f"{setting}.{key}")


def _iceberg_table(name: str, catalog: dict):
    """The catalog's table ``name`` (namespace.table); the catalog from pyiceberg's properties."""
    try:
        store = iceberg_catalog(catalog)
    except OSError as err:
        raise InputError(f"data.table={name}: data.catalog cannot be reached: {err}") from None
    try:
        return store.load_table(name)
    except Exception as err:  # NoSuchTableError, an unreachable or unknown catalog
        raise InputError(f"data.table={name}: not found in data.catalog ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'no detail'}); give a "
                         "namespace.table of that catalog, and the catalog's pyiceberg "
                         "properties (type: sql|glue|rest, uri, warehouse)") from None


def _iceberg_snapshot(table, name: str, snapshot_id: int | None, as_of: str | None):
    """The snapshot pinned by id or time, or the current one."""
    if snapshot_id is not None:
        found = table.snapshot_by_id(snapshot_id)
        what = f"data.table_version={snapshot_id}"
    elif as_of is not None:
        at = dt.datetime.fromisoformat(as_of)
        found = table.snapshot_as_of_timestamp(int(at.timestamp() * 1000))
        what = f"data.table_as_of={as_of}"
    else:
        found, what = table.current_snapshot(), f"data.table={name}"
    if found is None:
        ids = [s.snapshot_id for s in table.snapshots()]
        raise InputError(f"{what}: {name} has no such snapshot; its snapshots are "
                         f"{', '.join(map(str, ids)) or 'none (no rows yet)'}: give one of them "
                         "(data.table_version) or a time after the first")
    return found


def _renamed(table, snapshot, columns: tuple[str, ...] | None, tasks: list,
             s3: S3Options) -> tuple[str, str] | None:
    """The first of ``columns`` (None: every column) renamed since a data file of ``tasks`` was
    written, and that file (Iceberg reads by field id, Spark's Parquet reader by name)."""
    # the current snapshot reads by the table's schema, an older one by its own (as Spark's
    # Iceberg reader does)
    current = table.current_snapshot()
    own = snapshot.schema_id is not None and snapshot.snapshot_id != current.snapshot_id
    schema = table.schemas()[snapshot.schema_id] if own else table.schema()
    names_by_id: dict[int, set[str]] = {}
    for each in table.schemas().values():
        for f in each.fields:
            names_by_id.setdefault(f.field_id, set()).add(f.name)
    renamed = [f.name for f in schema.fields if (columns is None or f.name in columns)
               and names_by_id[f.field_id] != {f.name}]
    if not renamed:
        return None
    import pyarrow.parquet as pq

    for task in tasks:  # each file's own names, from its footer
        path = task.file.file_path
        if is_s3(path):
            names = pq.read_schema(s3_uri(path).removeprefix("s3://"),
                                   filesystem=s3.filesystem()).names
        else:
            names = pq.read_schema(local_path(path) if path.startswith("file:") else path).names
        missing = [c for c in renamed if c not in names]
        if missing:
            return missing[0], path
    return None


def iceberg_snapshot(name: str, catalog: dict, snapshot_id: int | None, as_of: str | None,
                     columns: tuple[str, ...] | None, s3: S3Options) -> TableSnapshot:
    """Table ``name``'s snapshot in ``catalog`` (by id, at a time, or the current one): its data
    files and rows; delete files and a renamed column of ``columns`` (None: of any) refused."""
    table = _iceberg_table(name, catalog)
    snapshot = _iceberg_snapshot(table, name, snapshot_id, as_of)
    tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
    deletes = [t for t in tasks if t.delete_files]
    if deletes:
        raise InputError(f"data.table={name}: snapshot {snapshot.snapshot_id} has delete files "
                         f"(position or equality deletes, on {len(deletes)} of its {len(tasks)} "
                         "data files), which reading the data files directly would bring back; "
                         "compact the table (rewrite_data_files) or pin data.table_version to "
                         "a snapshot before the delete")
    renamed = _renamed(table, snapshot, columns, tasks, s3)
    if renamed:
        raise InputError(f"data.table={name}: column {renamed[0]} had another name when "
                         f"{renamed[1]} was written (Iceberg reads it by field id, Spark's "
                         "Parquet reader by name); rewrite the table's files "
                         "(rewrite_data_files), or give the column's old name (data.text_column "
                         "or the format's column setting) and pin a snapshot before the rename")
    if not tasks:
        raise InputError(f"data.table={name}: snapshot {snapshot.snapshot_id} holds no rows; "
                         "give a snapshot with data (data.table_version)")
    return TableSnapshot(uri=name, version=snapshot.snapshot_id,
                         timestamp=_iso(snapshot.timestamp_ms),
                         rows_by_file={t.file.file_path: t.file.record_count for t in tasks},
                         format="iceberg")


# what a table's rows are read as: the formats that read Parquet rows (data/etl/formats.py)
TABLE_FORMATS = ("parquet", "chat", "preference", "prompts")
DATA_RECORD = "training_data.json"  # in a model directory: the table snapshot it learned from


def read_columns(d) -> tuple[str, ...] | None:
    """The columns ``data.format`` reads of a row (None: every one, as a prompt's rewards may)."""
    by_format = {"parquet": (d.text_column,),
                 "chat": (d.messages_column, d.prompt_column, d.response_column),
                 "preference": (d.prompt_column, d.chosen_column, d.rejected_column)}
    return by_format.get(d.format)


def _check(d) -> None:
    """``data.table``'s settings beside the others: one input, one pin, a Parquet format."""
    given = [k for k in ("path", "query") if getattr(d, k) is not None] + (
        ["sources"] if d.sources else [])
    if given:
        raise InputError(f"data.table={d.table} and data.{given[0]} both name the run's input; "
                         "give one of them")
    if d.table_version is not None and d.table_as_of is not None:
        raise InputError(f"data.table_version={d.table_version} and data.table_as_of="
                         f"{d.table_as_of} both pin data.table's snapshot; give one of them")
    if d.format not in TABLE_FORMATS:
        raise InputError(f"data.format={d.format}: data.table's rows are Parquet rows; set "
                         "data.format=parquet (a document in data.text_column), chat, "
                         "preference or prompts")


def model_snapshot(model_dir: str, s3: S3Options) -> dict | None:
    """The table snapshot a model directory (local or s3://) records it learned from
    (``DATA_RECORD``, a run on ``data.table`` writes it), or a mixture's ``{"sources": {name:
    snapshot}}``; None when it learned from none."""
    record = storage.join(model_dir, DATA_RECORD)
    if not storage.exists(record, s3):
        return None
    learned = storage.read_json(record, s3)
    return learned.get("table", learned)


def _since(d, model_dir: str | None, s3: S3Options) -> int:
    """``data.table_since``: a version or snapshot id, or ``model``: the one the model of
    ``model.path`` (or ``model.init_from``) learned from, as its ``training_data.json`` says (a
    mixture's model: the newest snapshot of this table among its sources)."""
    if str(d.table_since) != "model":
        try:
            return int(d.table_since)
        except ValueError:
            raise InputError(f"data.table_since={d.table_since}: give a version or snapshot id, "
                             "or model (the one model.path's model learned from)") from None
    learned = model_snapshot(model_dir, s3) if model_dir else None
    if learned is None:
        where = storage.join(model_dir, DATA_RECORD) if model_dir else "no model.path"
        raise InputError(f"data.table_since=model: {where} names no table snapshot (a run on "
                         "data.table writes it into its model/); give model.path such a model, "
                         "or the version itself")
    tables = list(learned["sources"].values()) if "sources" in learned else [learned]
    same = [t for t in tables if t["uri"] == d.table]
    if not same:
        read = ", ".join(sorted({t["uri"] for t in tables}))
        raise InputError(f"data.table_since=model: {model_dir} learned from {read}, not "
                         f"data.table={d.table}; give the version itself")
    newest = max(same, key=lambda t: t.get("timestamp", ""))  # Iceberg's ids are not in order
    return newest.get("version", newest.get("snapshot_id"))


def table_corpus(d, s3: S3Options, model_dir: str | None = None) -> Corpus:
    """The corpus of the ``data`` settings' table: its snapshot, or with ``data.table_since``
    only the rows appended after that one."""
    _check(d)

    def snapshot(version: int | None, as_of: str | None) -> TableSnapshot:
        if is_iceberg(d.table, d.catalog):
            return iceberg_snapshot(d.table, dict(d.catalog), version, as_of, read_columns(d),
                                    s3)
        return delta_snapshot(d.table, version, as_of, s3)

    chosen = snapshot(d.table_version, d.table_as_of)
    if d.table_since is not None:
        chosen = chosen.appended_since(snapshot(_since(d, model_dir, s3), None))
    return chosen.corpus(s3)
