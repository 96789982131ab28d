"""Rows appended to a Delta Lake or Iceberg table, each once: a job's output (``generate``'s batch
answers, ``evaluate``'s scores) written back where its input lives.

A job appends its rows in groups, in order, each group one commit that carries how far the job
got: Delta's application transaction (``app_id`` the job, ``version`` the last group written + 1,
the protocol's own exactly-once marker) or the Iceberg snapshot's properties. A rerun of the job
(after a kill) reads that marker first and appends only the groups after it, so every row lands
once; a job that finished appending appends nothing again. The table is created by the first
append when it does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options, is_s3, s3_uri

JOB_PROPERTY, DONE_PROPERTY = "raydp_llm.job", "raydp_llm.groups_done"


def _delta_done(uri: str, job: str, options: dict) -> int:
    """How many groups of ``job`` the Delta table holds (0 when there is no table yet)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=options).transaction_version(job) or 0
    except TableNotFoundError:
        return 0


def _append_delta(uri: str, job: str, groups: list[Callable[[], pa.Table]],
                  s3: S3Options) -> int:
    from deltalake import CommitProperties, Transaction, write_deltalake

    from raydp_llm.data.tables import storage_options

    options = storage_options(uri, s3)
    target = s3_uri(uri) if is_s3(uri) else uri
    done = _delta_done(target, job, options)
    for number in range(done, len(groups)):
        write_deltalake(target, groups[number](), mode="append", storage_options=options,
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(job, number + 1)]))
    return len(groups) - done


def _iceberg_table(name: str, catalog: dict, schema: pa.Schema):
    """The catalog's table ``name``, created with ``schema`` when it does not exist."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    properties = {k: str(v) for k, v in catalog.items()}
    store = load_catalog(properties.pop("name", "default"), **properties)
    try:
        return store.load_table(name)
    except NoSuchTableError:
        return store.create_table(name, schema=schema)


def _append_iceberg(name: str, catalog: dict, job: str, groups: list[Callable[[], pa.Table]],
                    schema: pa.Schema) -> int:
    table = _iceberg_table(name, catalog, schema)
    done = max((int(s.summary.get(DONE_PROPERTY, 0)) for s in table.snapshots()
                if s.summary.get(JOB_PROPERTY) == job), default=0)
    for number in range(done, len(groups)):
        table.append(groups[number](), snapshot_properties={JOB_PROPERTY: job,
                                                            DONE_PROPERTY: str(number + 1)})
    return len(groups) - done


def _refusals() -> tuple[type[Exception], ...]:
    """What a table raises for rows it will not take (a schema that differs, a store refusing)."""
    from deltalake.exceptions import DeltaError

    return ValueError, TypeError, OSError, DeltaError


def append_once(table: str, catalog: dict, job: str, groups: Iterable[Callable[[], pa.Table]],
                schema: pa.Schema, s3: S3Options) -> int:
    """The rows of ``groups`` (each read when its turn comes) appended to ``table`` (a Delta
    directory, or with ``catalog`` an Iceberg namespace.table) in order, but the groups ``job``
    appended before; the number of groups appended now. A table whose schema refuses the rows is
    one line."""
    groups = list(groups)
    try:
        if catalog:
            return _append_iceberg(table, catalog, job, groups, schema)
        return _append_delta(table, job, groups, s3)
    except _refusals() as err:
        raise InputError(f"{table}: the rows could not be appended ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'no detail'}); give a new "
                         "table, or one whose columns are the rows'") from None
