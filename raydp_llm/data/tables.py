"""``data.table``: a Delta Lake table as the ETL's input, resolved to one snapshot when the run
starts.

``deltalake`` (delta-rs) reads the table's log and names the snapshot's data files: those the
version's log adds and has not removed since, so rows a delete or an update rewrote are gone. The
ETL reads exactly those Parquet files, as it reads ``data.path``'s (Spark's own Delta reader is a
jar from Maven, which these machines cannot fetch). Their paths, sizes and modification times are
the ETL cache's key: the same snapshot is a hit, another a miss. What the files alone cannot say is
refused with one line: deletion vectors (rows deleted without rewriting their file) and column
mapping (columns renamed in the log, not in the files).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from urllib.parse import urlparse

import pyarrow as pa

from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options, is_s3, s3_uri
from raydp_llm.data.corpus import Corpus, resolve_corpus


@dataclass(frozen=True)
class TableSnapshot:
    """One snapshot of a table: what the run reads and records (``record``)."""

    uri: str  # as given (a directory or s3:// prefix)
    version: int  # Delta's version
    timestamp: str  # its commit's time, ISO 8601 in UTC
    files: list[str]  # the data files, absolute paths or URIs, sorted
    rows: int | None  # from the log's statistics; None when a file has none

    def record(self) -> dict:
        """The snapshot as the manifest and the summary hold it."""
        return {"uri": self.uri, "format": "delta", "version": self.version,
                "timestamp": self.timestamp, "files": len(self.files), "rows": self.rows}

    def corpus(self, s3: S3Options) -> Corpus:
        """The snapshot's data files as the ETL's corpus, listed as ``data.path``'s are (their
        sizes and modification times, the cache key's and the ETL's check that nothing changed
        while it read; a file vacuumed since is one line)."""
        listed = resolve_corpus(self.files, markdown=False, s3=s3)
        return replace(listed, name=f"{self.uri}@v{self.version}", table=self.record())


def _storage_options(uri: str, s3: S3Options) -> dict[str, str]:
    """delta-rs's options for an s3:// table: the endpoint and region of the ``s3`` settings (the
    credentials come from the environment, as for every other S3 read)."""
    if not is_s3(uri):
        return {}
    options = {"AWS_REGION": s3.region or "us-east-1"}
    if s3.endpoint_url:
        options["AWS_ENDPOINT_URL"] = s3.endpoint_url
        options["AWS_ALLOW_HTTP"] = str(urlparse(s3.endpoint_url).scheme == "http").lower()
    return options


def _open(uri: str, version: int | None, as_of: str | None, s3: S3Options):
    """The table at ``version`` (or the last version committed at ``as_of``, or the latest)."""
    from deltalake import DeltaTable

    table_uri = s3_uri(uri) if is_s3(uri) else uri
    try:
        table = DeltaTable(table_uri, storage_options=_storage_options(uri, s3))
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


def _commit_time(table) -> str:
    """The ISO time (UTC) of the loaded version's commit."""
    version = table.version()
    for commit in table.history():
        if commit.get("version") == version:
            stamp = dt.datetime.fromtimestamp(commit["timestamp"] / 1000, tz=dt.timezone.utc)
            return stamp.isoformat(timespec="milliseconds")
    return ""  # the log's history no longer holds it (its checkpoint does)


def delta_snapshot(uri: str, version: int | None, as_of: str | None,
                   s3: S3Options) -> TableSnapshot:
    """``uri``'s snapshot at ``version``, at ``as_of`` or the latest: its data files and rows."""
    table = _open(uri, version, as_of, s3)
    _refuse_what_files_cannot_say(table, uri)
    files = sorted(table.file_uris())
    if not files:
        raise InputError(f"data.table={uri}: version {table.version()} holds no rows; give a "
                         "version with data (data.table_version)")
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    counts = actions.get("num_records", [None])
    rows = None if None in counts else int(sum(counts))
    return TableSnapshot(uri=uri, version=table.version(), timestamp=_commit_time(table),
                         files=files, rows=rows)
