"""An ``s3://`` corpus read inside Spark's executors with pyarrow: the pip ``pyspark`` has no S3
connector, and Hadoop's jars are not a dependency this project wants.

The driver lists the objects (``corpus.py``) and cuts them into input splits: byte ranges of text
objects, row groups of Parquet objects. Each Spark task reads its splits from S3 and yields the rows
Spark's own readers would: ``src, block, text``. A text split holds the lines that start within its
byte range, ended by ``\\n``, ``\\r\\n`` or ``\\r`` as Hadoop's ``LineReader`` ends them, so every
line is read exactly once.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options, resolve

SCHEMA = "src string, block long, text binary"
ARROW_SCHEMA = pa.schema([("src", pa.string()), ("block", pa.int64()), ("text", pa.binary())])
LINES_PER_BATCH = 8192
READ_AHEAD = 1 << 20  # bytes read at a time past a split's end, to finish its last line


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
    text = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not text:
        return []
    return (text[:-1] if text.endswith(b"\n") else text).split(b"\n")


def text_splits(objects: list[tuple[str, int]], split_bytes: int) -> list[tuple[str, int, int]]:
    """``(uri, start, end)`` byte ranges of at most ``split_bytes`` covering each object."""
    return [(uri, start, min(start + split_bytes, size)) for uri, size in objects
            for start in range(0, size, split_bytes)]


def parquet_splits(uris: list[str], text_column: str, s3: S3Options) -> list[tuple[str, int, int]]:
    """``(uri, row group, 0)`` for every row group; the footers are read here, on the driver."""
    splits = []
    for uri in uris:
        fs, path = resolve(uri, s3)
        meta = pq.ParquetFile(fs.open_input_file(path)).metadata
        if text_column not in meta.schema.names:
            raise InputError(f"data.text_column={text_column}: no such column in {uri}; its "
                             f"columns are {', '.join(meta.schema.names)}")
        splits += [(uri, group, 0) for group in range(meta.num_row_groups)]
    return splits


def read_corpus(
    spark: SparkSession, objects: list[tuple[str, int]], data, s3: S3Options
) -> DataFrame:
    """``src, block, text``: the objects' lines (text, ids) or text column rows (Parquet), read in
    the executors; ``block`` is the split's first byte (text) or its row group (Parquet)."""
    parquet, text_column = data.format == "parquet", data.text_column
    if parquet:
        splits = parquet_splits([uri for uri, _ in objects], text_column, s3)
    else:
        splits = text_splits(
            objects, spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes()
        )

    def read_split(uri: str, start: int, end: int):
        fs, path = resolve(uri, s3)
        if parquet:
            file = pq.ParquetFile(fs.open_input_file(path))
            for rows in file.iter_batches(
                LINES_PER_BATCH, row_groups=[start], columns=[text_column]
            ):
                yield _rows(uri, start, rows.column(0).cast(pa.binary()))
            return
        with fs.open_input_file(path) as f:
            lines = lines_in_range(f, f.size(), start, end)
        for i in range(0, len(lines), LINES_PER_BATCH):
            yield _rows(uri, start, pa.array(lines[i:i + LINES_PER_BATCH], pa.binary()))

    def read(batches):
        for batch in batches:
            for uri, start, end in zip(
                *(batch.column(c).to_pylist() for c in ("src", "start", "end"))
            ):
                try:
                    yield from read_split(uri, start, end)
                # pyarrow's message may not name the object (a failed GetObject)
                except OSError as err:
                    raise OSError(f"{uri}: {str(err).splitlines()[0]}") from err

    slices = max(1, min(len(splits), spark.sparkContext.defaultParallelism * 4))
    table = spark.createDataFrame(spark.sparkContext.parallelize(splits, slices), "src string, "
                                                                                  "start long, "
                                                                                  "end long")
    return table.mapInArrow(read, SCHEMA)


def _rows(uri: str, block: int, text: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([uri] * len(text), pa.string()), pa.array([block] * len(text), pa.int64()), text],
        schema=ARROW_SCHEMA,
    )
