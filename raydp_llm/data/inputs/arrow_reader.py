"""The files Spark's own readers cannot read, read inside Spark's executors with pyarrow:
``s3://`` objects (the pip ``pyspark`` has no S3 connector, and Hadoop's jars are not a dependency
this project wants) and zstd-compressed files (Hadoop reads ``.zst`` only with its native library,
which the pip ``pyspark`` lacks).

The driver lists the files (``files.py``) and cuts them into input splits: byte ranges of text
files, row groups of Parquet files, a compressed file whole (``.gz``, ``.bz2``, ``.zst``: no byte
range of one can be read alone). Each Spark task reads its splits and yields the rows Spark's own
readers would: ``src, block, text``. A text split holds the lines that start within its byte range,
ended by ``\\n``, ``\\r\\n`` or ``\\r`` as Hadoop's ``LineReader`` ends them, so every line is read
exactly once.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.storage import S3Options, is_s3, resolve

SCHEMA = "src string, block long, text binary"
ARROW_SCHEMA = pa.schema([("src", pa.string()), ("block", pa.int64()), ("text", pa.binary())])
LINES_PER_BATCH = 8192
READ_AHEAD = 1 << 20  # bytes read at a time past a split's end, to finish its last line
COMPRESSED = (".gz", ".bz2", ".zst")  # pyarrow decompresses them as it reads (by the suffix)
NATIVE_ONLY = (".zst",)  # what Hadoop reads only with its native library: read here instead


def compressed(path: str) -> bool:
    return path.lower().endswith(COMPRESSED)


def reads(path: str) -> bool:
    """Whether this reader, not Spark's, reads an input file: S3 objects, and local files Hadoop
    cannot decompress."""
    return is_s3(path) or ("://" not in path and path.lower().endswith(NATIVE_ONLY))


def lines_in_range(f: pa.NativeFile, size: int, start: int, end: int) -> list[bytes]:
    """The lines of ``f`` (``size`` bytes) whose first byte lies in ``[start, end)``, without
    terminators."""
    lo = max(start - 1, 0)
    buf = f.read_at(
        end - lo, lo
    )  # one byte before the range tells whether a line starts at `start`
    if start == 0:
        first = 0
    elif buf[:1] == b"\n" or (buf[:1] == b"\r" and buf[1:2] != b"\n"):
        first = 1
    else:  # `start` is inside a line (or between \r and \n): ours begin after its end
        ends = [i for i in (buf.find(b"\n", 1), buf.find(b"\r", 1)) if i >= 1]
        if not ends:
            return []
        first = min(ends) + 1
        if buf[first - 1:first + 1] == b"\r\n":
            first += 1
    body = buf[first:]
    pos = end
    while body and body[-1:] not in (b"\n", b"\r") and pos < size:  # the last line runs past `end`
        more = f.read_at(min(READ_AHEAD, size - pos), pos)
        cut = [i for i in (more.find(b"\n"), more.find(b"\r")) if i >= 0]
        body += more[:min(cut) + 1] if cut else more
        pos += len(more)
    return _lines(body)


def stream_lines(f: pa.NativeFile) -> Iterator[bytes]:
    """Every line of a stream read to its end (a compressed file), without terminators, ended as
    ``lines_in_range`` ends them."""
    rest = b""
    while data := f.read(READ_AHEAD):
        buf = rest + data
        # the last line end, but not a \r at the very end: it may be the first half of a \r\n
        last = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1))
        yield from _lines(buf[:last + 1])
        rest = buf[last + 1:]
    yield from _lines(rest)


def _lines(body: bytes) -> list[bytes]:
    """``body``'s lines without their terminators; an unterminated last line is a line."""
    text = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not text:
        return []
    return (text[:-1] if text.endswith(b"\n") else text).split(b"\n")


def text_splits(objects: list[tuple[str, int]], split_bytes: int) -> list[tuple[str, int, int]]:
    """``(uri, start, end)`` byte ranges of at most ``split_bytes`` covering each object; a
    compressed object is one split (``end`` -1: read to its end)."""
    return [(uri, start, min(start + split_bytes, size)) for uri, size in objects
            if not compressed(uri) for start in range(0, size, split_bytes)] + \
           [(uri, 0, -1) for uri, _ in objects if compressed(uri)]


def text_column_of(text_column: str):
    """``data.format=parquet``'s pick of a file's columns: the text column; one line without it."""

    def pick(names: list[str], uri: str) -> list[str]:
        if text_column not in names:
            raise InputError(f"data.text_column={text_column}: no such column in {uri}; its "
                             f"columns are {', '.join(names)}")
        return [text_column]

    return pick


def parquet_splits(uris: list[str], s3: S3Options, pick: Callable[[list[str], str], list[str]]
                   ) -> tuple[list[tuple[str, int, int]], dict[str, list[str]]]:
    """``(uri, row group, 0)`` for every row group, and the columns ``pick`` takes of each file
    (from its own); the footers are read here, on the driver."""
    splits, columns = [], {}
    for uri in uris:
        fs, path = resolve(uri, s3)
        file = pq.ParquetFile(fs.open_input_file(path))
        columns[uri] = pick(file.schema_arrow.names, uri)  # the top level's (not leaf) names
        splits += [(uri, group, 0) for group in range(file.metadata.num_row_groups)]
    return splits, columns


def read_corpus(spark: SparkSession, objects: list[tuple[str, int]], data, s3: S3Options,
                row_columns: Callable[[list[str], str], list[str]] | None = None) -> DataFrame:
    """``src, block, text``: the files' lines (text, ids, jsonl) or text column rows (Parquet), read
    in the executors; ``block`` is the split's first byte (text; 0 for a compressed file) or its
    row group (Parquet). A format whose rows are JSON objects (chat, preference, prompts) reads a
    ``.parquet`` object's rows as JSON objects of the columns ``row_columns`` picks, as Spark's
    ``to_json`` makes them of a local file's (``formats.ChatReader``)."""
    if data.format == "parquet":
        tables, pick = [uri for uri, _ in objects], text_column_of(data.text_column)
    else:
        tables = [uri for uri, _ in objects if row_columns and uri.lower().endswith(".parquet")]
        pick = row_columns
    splits, columns = parquet_splits(tables, s3, pick) if tables else ([], {})
    max_bytes = spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes()
    splits += text_splits([(uri, size) for uri, size in objects if uri not in columns], max_bytes)
    as_json = data.format != "parquet"

    def read_split(uri: str, start: int, end: int):
        fs, path = resolve(uri, s3)
        src = uri if is_s3(uri) else Path(path).as_uri()  # named as Spark names a local file
        if uri in columns:
            file = pq.ParquetFile(fs.open_input_file(path))
            for rows in file.iter_batches(LINES_PER_BATCH, row_groups=[start],
                                          columns=columns[uri]):
                text = json_rows(rows) if as_json else rows.column(0).cast(pa.binary())
                yield _rows(src, start, text)
            return
        if end < 0:  # a compressed file, decompressed as it streams in
            with fs.open_input_stream(path, compression="detect") as f:
                yield from _batches(src, start, stream_lines(f))
            return
        with fs.open_input_file(path) as f:
            lines = lines_in_range(f, f.size(), start, end)
        yield from _batches(src, start, iter(lines))

    def read(batches):
        for batch in batches:
            for uri, start, end in zip(
                *(batch.column(c).to_pylist() for c in ("src", "start", "end"))
            ):
                try:
                    yield from read_split(uri, start, end)
                # pyarrow's message may not name the object (a failed GetObject)
                except OSError as err:
                    raise OSError(f"{uri}: {first_line(err)}") from err

    slices = max(1, min(len(splits), spark.sparkContext.defaultParallelism * 4))
    table = spark.createDataFrame(spark.sparkContext.parallelize(splits, slices), "src string, "
                                                                                  "start long, "
                                                                                  "end long")
    return table.mapInArrow(read, SCHEMA)


def json_rows(rows: pa.RecordBatch) -> pa.Array:
    """Each row a JSON object of its columns, as Spark's ``to_json`` writes one: compact, its
    null fields left out."""
    return pa.array([json.dumps({k: v for k, v in row.items() if v is not None},
                                separators=(",", ":"), ensure_ascii=False, default=str).encode()
                     for row in rows.to_pylist()], pa.binary())


def _batches(uri: str, block: int, lines: Iterator[bytes]) -> Iterator[pa.RecordBatch]:
    while batch := list(itertools.islice(lines, LINES_PER_BATCH)):
        yield _rows(uri, block, pa.array(batch, pa.binary()))


def _rows(uri: str, block: int, text: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([uri] * len(text), pa.string()), pa.array([block] * len(text), pa.int64()), text],
        schema=ARROW_SCHEMA,
    )
