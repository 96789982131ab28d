"""Rows appended to a real Delta table (deltalake) and a real Iceberg table (pyiceberg, a SQLite
catalog) once each (data/inputs/table_out.py): a job stopped between two commits appends, when run
again, only the groups after the last it committed; a finished job appends nothing again; rows
the table's schema refuses are one line. The command-line job that appends its answers is
tests/integration/test_answers.py's."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from raydp_llm.cli.keyvalue import parse_args
from raydp_llm.core.config import GenerateSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.inputs.table_out import append_once

ROWS = [pa.table({"id": [2 * g, 2 * g + 1], "answer": [f"a{2 * g}", f"a{2 * g + 1}"]})
        for g in range(3)]


class Stop(Exception):
    """The job's end before its third commit."""


def groups(stop_at: int | None = None) -> list:
    """The three groups' readers; the one at ``stop_at`` ends the job instead."""
    def reader(g: int):
        def read() -> pa.Table:
            if g == stop_at:
                raise Stop
            return ROWS[g]
        return read
    return [reader(g) for g in range(3)]


def _appended_in_turn(append, read_ids) -> None:
    with pytest.raises(Stop):
        append(groups(stop_at=2))
    assert sorted(read_ids()) == [0, 1, 2, 3]  # two commits landed
    assert append(groups()) == 1  # run again: the third group alone
    assert append(groups()) == 0  # finished: nothing again
    assert sorted(read_ids()) == list(range(6))


def test_a_delta_table_gets_each_group_once(tmp_path):
    table = str(tmp_path / "answers")

    def append(readers):
        return append_once(table, {}, "job-1", readers, S3Options())

    _appended_in_turn(append, lambda: DeltaTable(table).to_pyarrow_table().column("id")
                      .to_pylist())
    # another job's rows go in beside them; rows of another schema are one line
    assert append_once(table, {}, "job-2", groups()[:1], S3Options()) == 1
    with pytest.raises(InputError, match=rf"^{table}: the rows could not be appended "):
        append_once(table, {}, "job-3", [lambda: pa.table({"id": ["not a number"]})],
                    S3Options())


def test_an_iceberg_table_gets_each_group_once(tmp_path):
    catalog = {"name": "tests", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
               "warehouse": (tmp_path / "warehouse").as_uri()}
    from pyiceberg.catalog.sql import SqlCatalog

    SqlCatalog("tests", uri=catalog["uri"], warehouse=catalog["warehouse"]).create_namespace(
        "out")

    def append(readers):
        return append_once("out.answers", catalog, "job-1", readers, S3Options())

    def read_ids():
        store = SqlCatalog("tests", uri=catalog["uri"], warehouse=catalog["warehouse"])
        return store.load_table("out.answers").scan().to_arrow().column("id").to_pylist()

    _appended_in_turn(append, read_ids)


def test_generate_reads_the_catalog_as_json():
    s = parse_args(GenerateSettings, ["model_dir=m", "output.table=out.answers",
                                      'output.catalog={"type": "sql", "uri": "sqlite:///c.db"}'],
                   required=("model_dir",))
    assert s.output.catalog == {"type": "sql", "uri": "sqlite:///c.db"}


def test_an_evaluations_figures_are_a_row_each():
    from raydp_llm.cli.evaluate_job import score_rows

    evaluation = {"model_dir": "m", "loss": 1.5, "tokens": 120, "eval_s": 3.2, "bad": True,
                  "sources": {"news": {"val_loss": 2.0}},
                  "etl": {"table": {"uri": "/t", "version": 3}, "tokens": 99}}
    rows = score_rows(evaluation, "/runs/e1", '{"uri": "/t", "version": 1}').to_pylist()
    assert {r["figure"]: r["value"] for r in rows} == {"loss": 1.5, "tokens": 120.0,
                                                        "sources.news.val_loss": 2.0}
    assert {r["data_table"] for r in rows} == {'{"uri": "/t", "version": 3}'}
    assert {r["model_table"] for r in rows} == {'{"uri": "/t", "version": 1}'}
