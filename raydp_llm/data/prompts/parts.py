"""A table of prompts read in parts, never whole in one process (batch answers, cli/answers.py).

Its files (a corpus's: a file, a directory's, a glob's, local or on S3, sorted by name; or the
Parquet files the executors wrote of a query's rows, ``stage_query``) are indexed first, a Ray task
each (``index_file``): the rows, the columns, and for JSON Lines the byte offset of every
``rows_per_part``-th row and the schema of all its rows. Then the parts (``parts_of``):
``rows_per_part`` rows of one file each (a file's last part shorter), numbered in the table's
order, each knowing the number of its first row in the whole table (the answers' seeds). An actor
reads one part alone (``read_part``): the row groups of a Parquet file that hold it, or a byte range
of a JSON Lines file. The index is kept with the answers (``INDEX_FILE``), so that a rerun answers
the same parts of the same rows.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from raydp_llm.core import storage
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.storage import S3Options

INDEX_FILE = "prompts.json"  # beside the answers: the prompt files' index, for a rerun
STAGED_DIR = "_prompts"  # beside the answers: a query's rows, written once by the executors
SCHEMA_ROWS = 10_000  # JSON Lines: rows parsed at a time for the file's schema (memory bound)


@dataclass(frozen=True)
class PromptFile:
    """One indexed file of the table. ``columns`` is None when its first row is not a JSON
    object."""

    uri: str
    size: int
    rows: int
    columns: list[str] | None
    offsets: list[int] = field(default_factory=list)  # JSON Lines: rows 0, R, 2R, ...; its end
    schema: str = ""  # JSON Lines: the Arrow schema of all its rows (base64 IPC)


@dataclass(frozen=True)
class Part:
    """``rows`` rows of one file from its row ``first``: the table's rows ``row0`` on. A JSON
    Lines part is the file's bytes ``[start, stop)``."""

    number: int
    uri: str
    first: int
    rows: int
    row0: int
    start: int = 0
    stop: int = 0


def index_file(uri: str, size: int, data_format: str, rows_per_part: int,
               s3: S3Options) -> PromptFile:
    """``uri``'s rows and columns (Parquet: its footer alone), and for JSON Lines where each part
    begins and the schema of every row: one pass over its lines, blank ones skipped (as Arrow's
    reader skips them)."""
    fs, path = storage.resolve(uri, s3)
    if data_format == "parquet":
        found = pq.ParquetFile(path, filesystem=fs)
        return PromptFile(uri, size, found.metadata.num_rows, found.schema_arrow.names)
    offsets, rows, at, schema = [], 0, 0, None
    with fs.open_input_stream(path) as f:
        for line in _lines(f):
            if line.strip():
                if rows % rows_per_part == 0:
                    offsets.append(at)
                if rows == 0 and _is_object([line]):
                    schema = RowSchema(uri)
                if schema is not None:
                    schema.add(line)
                rows += 1
            at += len(line)
    offsets.append(at)
    if schema is None:
        return PromptFile(uri, size, rows, None, offsets)
    found = schema.done()
    return PromptFile(uri, size, rows, found.names, offsets,
                      base64.b64encode(found.serialize().to_pybytes()).decode())


class RowSchema:
    """The Arrow schema of every row of a JSON Lines file, parsed ``SCHEMA_ROWS`` rows at a time.

    Why all rows: a part is read with its file's schema, and a column that is null in the first
    rows and text later (or whole numbers first, fractions later) must be text (a float) in every
    part; the first rows alone would fail the part that holds the later ones."""

    def __init__(self, uri: str):
        self.uri, self.block, self.parsed, self.schema = uri, [], 0, None  # parsed: rows before

    def add(self, line: bytes) -> None:
        """The file's next non-blank row."""
        self.block.append(line)
        if len(self.block) == SCHEMA_ROWS:
            self._parse()

    def done(self) -> pa.Schema:
        self._parse()
        return self.schema

    def _parse(self) -> None:
        if not self.block:
            return
        try:
            found = pj.read_json(pa.BufferReader(b"".join(self.block))).schema
            known = [found] if self.schema is None else [self.schema, found]
            self.schema = pa.unify_schemas(known, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
            last = self.parsed + len(self.block) - 1
            raise InputError(f"{self.uri}: rows {self.parsed}-{last} do not read as one table "
                             f"with the rows before ({first_line(err)}); give every line one "
                             "JSON object and each column one JSON type") from None
        self.parsed += len(self.block)
        self.block = []


def _is_object(lines: list[bytes]) -> bool:
    """Whether the first of ``lines`` is a JSON object (a JSON Lines row)."""
    try:
        return bool(lines) and isinstance(json.loads(lines[0]), dict)
    except ValueError:
        return False


def _lines(f, block: int = 1 << 20) -> Iterator[bytes]:
    """``f``'s lines, each with its newline (the last one's may lack it)."""
    rest = b""
    while chunk := f.read(block):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line + b"\n"
    if rest:
        yield rest


def parts_of(files: list[PromptFile], rows_per_part: int) -> list[Part]:
    """The table's parts, in its order: each file cut into ``rows_per_part`` rows."""
    parts, row0 = [], 0
    for f in files:
        for k, first in enumerate(range(0, f.rows, rows_per_part)):
            span = (f.offsets[k], f.offsets[k + 1]) if f.offsets else (0, 0)
            parts.append(Part(len(parts), f.uri, first, min(rows_per_part, f.rows - first),
                              row0 + first, *span))
        row0 += f.rows
    return parts


def read_part(part: Part, data_format: str, schema: str, s3: S3Options) -> pa.Table:
    """``part``'s rows: the Parquet row groups that hold them, cut to them; or its JSON Lines bytes,
    read with ``schema`` (its file's, ``PromptFile.schema``: every part the same columns)."""
    fs, path = storage.resolve(part.uri, s3)
    if data_format == "parquet":
        found = pq.ParquetFile(path, filesystem=fs)
        groups, skipped, seen = [], 0, 0
        for g in range(found.num_row_groups):
            n = found.metadata.row_group(g).num_rows
            if seen + n > part.first and seen < part.first + part.rows:
                skipped = skipped if groups else part.first - seen
                groups.append(g)
            seen += n
        return found.read_row_groups(groups).slice(skipped, part.rows)
    with fs.open_input_file(path) as f:
        raw = f.read_at(part.stop - part.start, part.start)
    explicit = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(schema)))
    options = pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="infer")
    return pj.read_json(pa.BufferReader(raw), parse_options=options)


def first_columns(uri: str, data_format: str, s3: S3Options) -> list[str] | None:
    """The columns of ``uri`` (Parquet: its footer's; JSON Lines: its first row's keys), or None
    when its first row is not a JSON object: the check before any engine starts."""
    fs, path = storage.resolve(uri, s3)
    if data_format == "parquet":
        return pq.read_schema(path, filesystem=fs).names
    with fs.open_input_stream(path) as f:
        first = next((line for line in _lines(f) if line.strip()), b"")
    return list(json.loads(first)) if _is_object([first]) else None


def save_index(uri: str, files: list[PromptFile], s3: S3Options) -> None:
    storage.write_text(uri, json.dumps({"files": [asdict(f) for f in files]}), s3)


def load_index(uri: str, s3: S3Options) -> list[PromptFile] | None:
    """The index a first run kept at ``uri``, or None."""
    if not storage.exists(uri, s3):
        return None
    return [PromptFile(**f) for f in storage.read_json(uri, s3)["files"]]


def stage_query(rows, staged: str, s3: S3Options) -> list[str]:
    """A query's rows (a Spark DataFrame) written by the executors under ``staged``: a Parquet file
    per partition that has rows, named by its number, written batch by batch (local files whole
    or absent: renamed when written). Their URIs, in the rows' order."""
    from pyspark.sql import functions as F

    def write(batches):
        writer, target, tmp = None, "", ""
        for batch in batches:
            number = batch.column("__part")[0].as_py()
            batch = batch.select([c for c in batch.schema.names if c != "__part"])
            if writer is None:
                target = storage.join(staged, f"part-{number:05d}.parquet")
                tmp = target if storage.is_s3(target) else f"{target}.tmp"
                fs, path = storage.resolve(tmp, s3)
                writer = pq.ParquetWriter(path, batch.schema, filesystem=fs)
            writer.write_batch(batch)
        if writer is not None:
            writer.close()
            if tmp != target:
                Path(tmp).replace(target)
            yield pa.RecordBatch.from_pydict({"file": [target]})

    if not storage.is_s3(staged):
        Path(staged).mkdir(parents=True, exist_ok=True)
    parted = rows.withColumn("__part", F.spark_partition_id())
    return sorted(r.file for r in parted.mapInArrow(write, "file string").collect())
