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
from pathlib import Path

import pyarrow as pa

from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.inputs.tables import delta_location, iceberg_catalog

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

    target, options = delta_location(uri, s3)
    done = _delta_done(target, job, options)
    for number in range(done, len(groups)):
        write_deltalake(target, groups[number](), mode="append", storage_options=options,
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(job, number + 1)]))
    return len(groups) - done


def _append_iceberg(name: str, catalog: dict, job: str,
                    groups: list[Callable[[], pa.Table]]) -> int:
    """The groups after those ``job`` appended; a missing table is created with the schema of
    the first group appended now."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        store = iceberg_catalog(catalog, "output.catalog")
    except OSError as err:  # the answers' parts are kept: the same command appends them later
        raise InputError(f"output.table={name}: output.catalog cannot be reached: {err}"
                         ) from None
    try:
        table = store.load_table(name)
    except NoSuchTableError:
        table = None
    done = 0 if table is None else max(
        (int(s.summary.get(DONE_PROPERTY, 0)) for s in table.snapshots()
         if s.summary.get(JOB_PROPERTY) == job), default=0)
    for number in range(done, len(groups)):
        rows = groups[number]()
        if table is None:
            table = store.create_table(name, schema=rows.schema)
        table.append(rows, snapshot_properties={JOB_PROPERTY: job, DONE_PROPERTY: str(number + 1)})
    return len(groups) - done


def _refusals() -> tuple[type[Exception], ...]:
    """What a table raises for rows it will not take (a schema that differs, a store refusing)."""
    from deltalake.exceptions import DeltaError

    return ValueError, TypeError, OSError, DeltaError


def append_once(table: str, catalog: dict, job: str, groups: Iterable[Callable[[], pa.Table]],
                s3: S3Options) -> int:
    """The rows of ``groups`` (each read when its turn comes) appended to ``table`` (a Delta
    directory, made absolute when local, or with ``catalog`` an Iceberg namespace.table) in
    order, but the groups ``job`` appended before; the number of groups appended now. A table
    whose schema refuses the rows is one line."""
    groups = list(groups)
    try:
        if catalog:
            return _append_iceberg(table, catalog, job, groups)
        local = "://" not in table
        return _append_delta(str(Path(table).absolute()) if local else table, job, groups, s3)
    except _refusals() as err:
        raise InputError(f"{table}: the rows could not be appended ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'no detail'}); give a new "
                         "table, or one whose columns are the rows'") from None
