"""The ETL's *scan*, computed in the executors in one pass over the lines: per file, lines,
characters, NUL bytes (binary files), replaced invalid UTF-8, bad JSON lines, the character set and,
for id files, the ids' count and range. The driver receives one row per file and executor."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from raydp_llm.data import jsonl
from raydp_llm.data.etl.records import FILE_COUNTS, ID_RANGE, FileStats
from raydp_llm.data.inputs.files import decode

_SUMMED = ("chars", "nonblank", "nul_lines", "replaced", *jsonl.BAD_KINDS)  # by Arrow, per batch
_SCHEMA = pa.schema([("src", pa.string())] + [(k, pa.int64()) for k in FILE_COUNTS + ID_RANGE]
                    + [("bad", pa.string()), ("charset", pa.string())])


def decode_column(raw: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A batch of lines as Arrow strings (nulls read as empty lines) and the invalid UTF-8 sequences
    replaced in each; valid batches (the usual case) are checked and converted in C++."""
    raw = pc.fill_null(raw, b"")
    try:
        return raw.cast(pa.string()), np.zeros(len(raw), np.int64)
    except pa.ArrowInvalid:
        texts, replaced = zip(*(decode(r) for r in raw.to_pylist()))
        return pa.array(texts, pa.string()), np.array(replaced, np.int64)


def scan_files(lines: DataFrame, want_charset: bool, id_file: bool) -> dict[str, FileStats]:
    """Per-file statistics, computed in the executors (``FileStats``): the character set only when
    ``want_charset``, the ids only for an ``id_file``."""

    def scan(batches):
        stats: dict[str, FileStats] = {}
        for batch in batches:
            _add_batch(stats, batch, want_charset, id_file)
        yield _stats_batch(stats)

    files: dict[str, FileStats] = {}
    for row in lines.mapInArrow(scan, from_arrow_schema(_SCHEMA)).collect():
        files.setdefault(row.src, FileStats()).merge(row)
    return files


def _add_batch(stats: dict[str, FileStats], batch: pa.RecordBatch, want_charset: bool,
               id_file: bool) -> None:
    """One Arrow batch of (src, raw) lines into the per-file ``stats`` (in an executor)."""
    texts, replaced = decode_column(batch.column("raw"))
    verdicts = pa.nulls(len(texts), pa.int8())  # none but in JSON Lines
    if "bad" in batch.schema.names:
        verdicts = batch.column("bad")
    table = pa.table({"src": batch.column("src"), "chars": pc.add(pc.utf8_length(texts), 1),
                      "nonblank": pc.utf8_length(pc.utf8_trim_whitespace(texts)),
                      "nul_lines": pc.cast(pc.match_substring(texts, "\x00"), pa.int64()),
                      "replaced": replaced}
                     | {kind: pc.cast(pc.equal(verdicts, code), pa.int64())
                        for kind, code in jsonl.BAD_KINDS.items()})
    sums = table.group_by("src").aggregate([(k, "sum") for k in _SUMMED] + [("chars", "count")])
    for row in sums.to_pylist():
        s = stats.setdefault(row["src"], FileStats())
        s.lines += row["chars_count"]
        for k in _SUMMED:
            setattr(s, k, getattr(s, k) + (row[f"{k}_sum"] or 0))
    if not (want_charset or id_file):
        return
    for src, text in zip(batch.column("src").to_pylist(), texts.to_pylist()):
        if want_charset:
            stats[src].charset.update(text)
        elif text.strip():
            stats[src].add_ids(text)


def _stats_batch(stats: dict[str, FileStats]) -> pa.RecordBatch:
    """An executor's per-file statistics as one Arrow batch (``_SCHEMA``)."""
    rows = {k: [] for k in _SCHEMA.names}
    for src, s in stats.items():
        rows["src"].append(src)
        for k in _SCHEMA.names[1:-1]:
            rows[k].append(getattr(s, k))
        rows["charset"].append("".join(s.charset))
    return pa.RecordBatch.from_pydict(rows, schema=_SCHEMA)
