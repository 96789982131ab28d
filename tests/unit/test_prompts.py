"""A table of prompts read in parts (data/prompts/parts.py): the parts of every file, read alone,
are the table's rows in order, each part numbered and placed in the whole table; JSON Lines with
blank lines and rows of other columns, Parquet parts across row groups."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.prompts.parts import first_columns, index_file, parts_of, read_part

NO_S3 = S3Options()


def test_the_parts_of_json_lines_and_parquet_files_are_the_tables_rows_in_order(tmp_path):
    rows = [{"id": i, "prompt": f"line {i}"} for i in range(23)]
    first = tmp_path / "a.jsonl"  # rows 0-10, with blank lines; a row without the prompt
    first.write_text("\n".join(json.dumps(r) for r in rows[:6]) + "\n\n  \n"
                     + "\n".join(json.dumps(r) for r in rows[6:10]) + '\n{"id": 10}')
    second = tmp_path / "b.jsonl"  # rows 11-22
    second.write_text("".join(json.dumps(r) + "\n" for r in rows[11:]))
    files = [index_file(str(f), f.stat().st_size, "jsonl", 4, NO_S3) for f in (first, second)]
    assert [f.rows for f in files] == [11, 12] and files[0].columns == ["id", "prompt"]
    parts = parts_of(files, 4)
    assert [(p.number, p.first, p.rows, p.row0) for p in parts] == [
        (0, 0, 4, 0), (1, 4, 4, 4), (2, 8, 3, 8), (3, 0, 4, 11), (4, 4, 4, 15), (5, 8, 4, 19)]
    schemas = {f.uri: f.schema for f in files}
    read = [read_part(p, "jsonl", schemas[p.uri], NO_S3) for p in parts]
    assert all(t.schema == read[0].schema for t in read)  # every part the same columns
    assert pa.concat_tables(read).to_pylist() == [
        r if r["id"] != 10 else {"id": 10, "prompt": None} for r in rows]


def test_parquet_parts_across_row_groups_and_the_first_columns(tmp_path):
    table = pa.table({"id": list(range(17)), "prompt": [f"p{i}" for i in range(17)]})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=5)
    f = index_file(str(tmp_path / "p.parquet"), 0, "parquet", 3, NO_S3)
    assert (f.rows, f.columns, f.offsets) == (17, ["id", "prompt"], [])
    parts = parts_of([f], 3)
    assert len(parts) == 6 and parts[-1].rows == 2
    assert pa.concat_tables(read_part(p, "parquet", "", NO_S3) for p in parts).equals(table)
    assert first_columns(str(tmp_path / "p.parquet"), "parquet", NO_S3) == ["id", "prompt"]
    (tmp_path / "x.jsonl").write_text('\n["not", "an object"]\n')
    assert first_columns(str(tmp_path / "x.jsonl"), "jsonl", NO_S3) is None
    assert index_file(str(tmp_path / "x.jsonl"), 0, "jsonl", 3, NO_S3).columns is None


def test_a_column_typed_only_after_the_first_rows_reads_in_every_part(tmp_path, monkeypatch):
    """A part is read with its file's schema, made of all its rows: a column null in the first
    rows and text later, or whole numbers first and fractions later, reads in every part."""
    monkeypatch.setattr("raydp_llm.data.prompts.parts.SCHEMA_ROWS", 3)  # parsed 3 rows at a time
    rows = [{"prompt": f"p{i}", "note": None, "score": i} for i in range(7)]
    rows += [{"prompt": "p7", "note": "late", "score": 0.5}]
    path = tmp_path / "late.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = index_file(str(path), 0, "jsonl", 2, NO_S3)
    read = [read_part(p, "jsonl", f.schema, NO_S3) for p in parts_of([f], 2)]
    assert all(t.schema == read[0].schema for t in read)
    assert read[0].schema.field("note").type == pa.string()
    assert pa.concat_tables(read).to_pylist() == rows


ONE_TABLE = (r"{name}.jsonl: rows {rows} do not read as one table with the rows before \(.+\); "
             r"give every line one JSON object and each column one JSON type$")


def test_rows_of_another_type_or_not_json_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("raydp_llm.data.prompts.parts.SCHEMA_ROWS", 2)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 2}\n'
                     '{"prompt": "c", "id": "x"}\n')
    with pytest.raises(InputError, match=ONE_TABLE.format(name="mixed", rows="2-2")):
        index_file(str(mixed), 0, "jsonl", 2, NO_S3)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": \n')
    with pytest.raises(InputError, match=ONE_TABLE.format(name="broken", rows="2-2")):
        index_file(str(broken), 0, "jsonl", 2, NO_S3)
