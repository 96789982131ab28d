"""A table of prompts read in parts (data/prompts.py): the parts of every file, read alone, are the
table's rows in order, each part numbered and placed in the whole table; JSON Lines with blank
lines and rows of other columns, Parquet parts across row groups."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from raydp_llm.core.storage import S3Options
from raydp_llm.data.prompts import first_columns, index_file, parts_of, read_part

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
