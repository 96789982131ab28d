"""JSON Lines corpora (``data.format=jsonl``): each line a JSON object whose ``data.text_column``
string is one document, read where the lines are read (Spark's text reader or ``arrow_reader``,
compressed or not) and parsed in the executors.

A line that is not JSON, is not an object with that field, or whose field is not a string is bad:
it yields no document, and the ETL counts it per file and kind (``manifest.json``), or refuses the
corpus naming the file and line (``data.strict_json``). Blank lines are neither documents nor bad.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# a line's verdict, in the ``bad`` column; 0 = a document (or a blank line)
BAD_KINDS = {"not_json": 1, "no_field": 2, "not_string": 3}
WHAT = {"not_json": "is not JSON", "no_field": "has no field {column}",
        "not_string": "has a {column} that is not a string"}
SCHEMA = "src string, block long, text binary, bad byte"


def documents(lines: DataFrame, column: str) -> DataFrame:
    """``src, block, text, bad``: each line's document (empty for blank and bad lines) and verdict,
    parsed in the executors."""

    def parse(batches):
        for batch in batches:
            texts, bad = parse_lines(batch.column("text"), column)
            yield pa.RecordBatch.from_arrays(
                [batch.column("src"), batch.column("block"), texts, pa.array(bad, pa.int8())],
                names=["src", "block", "text", "bad"])

    return lines.mapInArrow(parse, SCHEMA)


def parse_lines(raw: pa.Array, column: str) -> tuple[pa.Array, np.ndarray]:
    """A batch of lines' documents (binary) and verdicts. pyarrow's JSON reader takes the batch's
    non-empty lines whole when each is a document (the usual case); a batch with any other line is
    parsed a line at a time."""
    raw = pc.fill_null(raw, b"")
    filled = pc.greater(pc.binary_length(raw), 0)
    whole = _parse_batch(raw.filter(filled), column)
    if whole is not None:  # empty lines: no document, and not bad
        texts = pc.replace_with_mask(pa.array([b""] * len(raw), pa.binary()), filled, whole)
        return texts, np.zeros(len(raw), np.int8)
    parsed = [parse_line(line, column) for line in raw.to_pylist()]
    return (pa.array([text for text, _ in parsed], pa.binary()),
            np.array([bad for _, bad in parsed], np.int8))


def _parse_batch(raw: pa.Array, column: str) -> pa.Array | None:
    """Every line's ``column`` string, in C++; None unless each line is an object with that string
    (the reader skips blank lines, takes a null for a missing field, and fails on the rest)."""
    if len(raw) == 0:  # parse_lines has read nulls as empty lines
        return None
    joined = pc.binary_join(
        pa.ListArray.from_arrays(pa.array([0, len(raw)], pa.int32()), raw), b"\n"
    )[0].as_buffer()
    try:
        table = pajson.read_json(
            pa.BufferReader(joined),
            # one block: a line may not straddle two
            read_options=pajson.ReadOptions(block_size=max(joined.size, 1 << 16),
                                            use_threads=False),
            parse_options=pajson.ParseOptions(explicit_schema=pa.schema([(column, pa.string())]),
                                              unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    texts = table.column(column)
    if table.num_rows != len(raw) or texts.null_count:
        return None
    return texts.combine_chunks().cast(pa.binary())


def parse_line(line: bytes | None, column: str) -> tuple[bytes, int]:
    """One line's document and verdict. Invalid UTF-8 passes through as it is (as pyarrow's reader
    passes it): the scan replaces and counts it, as in text files (``data.strict_utf8``)."""
    if not line or not line.strip():
        return b"", 0
    try:
        obj = json.loads(line.decode("utf-8", "surrogateescape"))
    except ValueError:
        return b"", BAD_KINDS["not_json"]
    if not isinstance(obj, dict) or column not in obj:
        return b"", BAD_KINDS["no_field"]
    if not isinstance(obj[column], str):
        return b"", BAD_KINDS["not_string"]
    try:
        return obj[column].encode("utf-8", "surrogateescape"), 0
    except UnicodeEncodeError:  # an escaped lone surrogate ("\ud800") has no UTF-8
        return obj[column].encode("utf-8", "replace"), 0


def first_bad_line(lines: DataFrame, src: str, column: str) -> tuple[int, str, bytes]:
    """The first bad line of file ``src`` in ``lines`` (``src, block, text``: the lines as read,
    before ``documents``): its number (from 1), its kind and its first bytes. Each input split
    counts its lines and finds its own first bad one, in the executors; the splits before it place
    it in the file. Run only to refuse a corpus (``data.strict_json``)."""

    def count(batches):
        seen: dict[int, dict] = {}  # per input split, in the order its lines come
        for batch in batches:
            blocks = batch.column("block").to_numpy(zero_copy_only=False)
            bad = parse_lines(batch.column("text"), column)[1]
            for block in dict.fromkeys(blocks.tolist()):
                rows = np.flatnonzero(blocks == block)
                split = seen.setdefault(block, {"block": block, "lines": 0, "first": None})
                hits = rows[bad[rows] > 0]
                if split["first"] is None and hits.size:
                    split |= {"first": split["lines"] + int(np.searchsorted(rows, hits[0])),
                              "kind": int(bad[hits[0]]),
                              "head": batch.column("text")[hits[0]].as_py()[:80]}
                split["lines"] += rows.size
        yield pa.RecordBatch.from_pylist(list(seen.values()), schema=_SPLIT_COUNTS)

    counts = lines.where(F.col("src") == src).mapInArrow(count, _SPLIT_COUNTS_DDL).collect()
    before = 0
    for split in sorted(counts):
        if split.first is not None:
            kind = next(k for k, code in BAD_KINDS.items() if code == split.kind)
            return before + split.first + 1, kind, bytes(split.head)
        before += split.lines
    raise RuntimeError(f"{src}: bad JSON lines were counted, but a second look found none")


_SPLIT_COUNTS_DDL = "block long, lines long, first long, kind long, head binary"
_SPLIT_COUNTS = pa.schema([("block", pa.int64()), ("lines", pa.int64()), ("first", pa.int64()),
                           ("kind", pa.int64()), ("head", pa.binary())])
