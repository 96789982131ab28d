"""Documents as curation sees them: each line of the ETL (``src, block, raw``) gets the key of the
document it belongs to, as the encoder will cut documents (``data.document_split``).

- ``line`` (every JSONL line and Parquet row too): a non-blank line is a document; its key is its
  number in the file.
- ``file``: a file is a document; key 0 for every line, blank ones too (a removed file leaves
  nothing).
- ``blank_line``: runs of non-blank lines; a key per paragraph, numbered in the file. An input
  split numbers its own paragraphs; one that starts inside a paragraph (its first line not blank,
  the previous split's last line not blank) continues the previous split's last one. Each split
  reports its line and paragraph counts and its edges (one row per split, to the driver), and the
  driver's offsets, broadcast back, number the paragraphs in the file.

Otherwise blank lines belong to no document (key -1): removing documents never removes them, so
what remains still splits where it did.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

LOCAL = "src string, block long, raw binary, line long, local long"


def _blank(raw: pa.Array) -> np.ndarray:
    """Lines that are empty or white space only (as bytes: the decode comes later)."""
    trimmed = pc.utf8_trim_whitespace(pc.cast(pc.fill_null(raw, b""), pa.string(), safe=False))
    return pc.equal(pc.binary_length(trimmed), 0).to_numpy(zero_copy_only=False)


def numbered(lines: DataFrame, document_split: str) -> DataFrame:
    """``src, block, raw, line, local``: each line's number in its input split, and its document's
    number in the split (-1 for a blank line; the line itself for ``line``; 0 for ``file``, blank
    lines too)."""

    def number(batches):
        # (src, block) -> [lines so far, paragraphs so far, whether the last line was blank]
        state: dict[tuple, list] = {}
        for batch in batches:
            raw = batch.column("raw")
            blank = _blank(raw)
            line = np.empty(len(raw), np.int64)
            local = np.full(len(raw), -1, np.int64)
            keys = zip(batch.column("src").to_pylist(), batch.column("block").to_pylist())
            for i, key in enumerate(keys):
                s = state.setdefault(key, [0, 0, True])
                line[i] = s[0]
                if document_split == "file":
                    local[i] = 0
                elif not blank[i]:
                    s[1] += s[2]  # a paragraph starts after a blank line (or the split's start)
                    local[i] = s[0] if document_split == "line" else s[1] - 1
                s[0], s[2] = s[0] + 1, bool(blank[i])
            yield pa.RecordBatch.from_arrays(
                [batch.column("src"), batch.column("block"), raw, pa.array(line), pa.array(local)],
                names=["src", "block", "raw", "line", "local"])

    return lines.select("src", "block", "raw").mapInArrow(number, LOCAL)


def document_keys(spark: SparkSession, lines: DataFrame, document_split: str) -> DataFrame:
    """``src, block, raw, line, doc``: each line and the number in its file of the document it
    belongs to (-1: blank)."""
    local = numbered(lines, document_split)
    if document_split == "file":
        return local.withColumnRenamed("local", "doc")
    offsets = (_line_offsets(local) if document_split == "line"
               else _paragraph_offsets(spark, local))
    joined = local.join(F.broadcast(offsets), ["src", "block"])
    doc = F.when(F.col("local") < 0, -1).otherwise(F.col("local") + F.col("offset"))
    return joined.select("src", "block", "raw", "line", doc.alias("doc"))


def _line_offsets(local: DataFrame) -> DataFrame:
    """Per input split, the lines of the splits before it in its file."""
    counts = local.groupBy("src", "block").count()
    before = F.sum("count").over(_file_order()).cast("long") - F.col("count")
    return counts.select("src", "block", before.alias("offset"))


def _paragraph_offsets(spark: SparkSession, local: DataFrame) -> DataFrame:
    """Per input split, the number in its file of its first paragraph: the paragraphs of the splits
    before it, less one when it continues the last of them."""
    blank = F.col("local") < 0
    edges = local.groupBy("src", "block").agg(
        F.max("local").alias("top"),
        F.min_by(blank, "line").alias("first_blank"),
        F.max_by(blank, "line").alias("last_blank"),
    )
    rows = sorted(edges.collect())  # one row per input split
    offsets, file, next_number, last_blank = [], None, 0, True
    for row in rows:
        if row.src != file:
            file, next_number, last_blank = row.src, 0, True
        continues = not last_blank and not row.first_blank
        first = next_number - continues
        offsets.append((row.src, row.block, first))
        next_number = first + row.top + 1
        last_blank = row.last_blank
    return spark.createDataFrame(offsets, "src string, block long, offset long")


def _file_order():
    from pyspark.sql import Window

    return Window.partitionBy("src").orderBy("block").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
