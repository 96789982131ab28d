"""The ETL's *chunk* stage: from the pieces' lengths the driver knows every piece's offset in the
stream, and from their heads every piece's halo (``lay_out``, a ``records.StreamLayout``); each
piece cuts its own chunks (at most ``data.chunk_tokens`` tokens of one segment, with up to
``data.halo_tokens`` tokens after them) where it lies, and the driver knows the chunks' index by
arithmetic (windows.py). Windows are cut when read (stream.py): the output holds each token about
once, whatever the stride or the block size. ``handoff.py`` writes them or hands them to Ray."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from raydp_llm.core.config import DataSettings
from raydp_llm.data import windows
from raydp_llm.data.etl.records import Piece, StreamLayout
from raydp_llm.data.stream import CHUNK_SCHEMA, ChunkIndex
from raydp_llm.data.windows import SPLITS

CHUNK_DDL = from_arrow_schema(CHUNK_SCHEMA)  # the chunks' rows as Spark types them


def lay_out(pieces: list[Piece], data: DataSettings, seed: int, dtype: np.dtype,
            record: int = 1) -> StreamLayout:
    """The stream the pieces make (in stream order): each piece's offset and halo, the
    train/validation segments (counted in ``record``s of tokens) and each split's chunks."""
    halo = data.halo_tokens
    n_tokens = sum(p.n for p in pieces)
    offsets = np.concatenate(
        [[0], np.cumsum([p.n for p in pieces], dtype=np.int64)[:-1]]
    ).tolist()
    halos = windows.halos([np.frombuffer(p.head, dtype) for p in pieces], halo)
    placed = {(p.src, p.block, p.part): (offset, piece_halo.tobytes())
              for p, offset, piece_halo in zip(pieces, offsets, halos)}
    # counted in records (chat's windows, whole in one segment; else a token each)
    in_records = functools.partial(
        windows.segments, n=n_tokens // record, split=data.split,
        val_fraction=data.val_fraction, seed=seed,
        segment_tokens=max(1, data.segment_tokens // record))
    segments_of = functools.partial(windows.record_segments, segments_of=in_records,
                                    record=record)
    rows = {name: [] for name in SPLITS}
    for p, offset in zip(pieces, offsets):
        for s in windows.chunk_spans(offset, offset + p.n, segments_of, data.chunk_tokens):
            rows[s.split].append((s.start, s.end - s.start, s.seg_start, s.seg_end))
    index = {name: ChunkIndex.of(r) for name, r in rows.items()}
    return StreamLayout(pieces, data, seed, dtype, halo, n_tokens, placed, segments_of, index)


def cut_chunks(encoded: DataFrame, layout: StreamLayout, name: str) -> DataFrame:
    """``start, tokens``: the chunks of split ``name``, sorted by start. Each piece cuts the chunks
    that start in it, in its executor, from its tokens and its halo (the tokens after it); a chunk's
    row holds its own tokens and up to ``halo`` tokens after them in its segment."""
    # plain values for the closure Spark ships to the executors (not the pieces' heads)
    placed, dtype, halo = layout.placed, layout.dtype, layout.halo
    segments, chunk_tokens = layout.segments_of, layout.data.chunk_tokens

    def cut(batches):
        for batch in batches:
            for src, block, part, raw in zip(
                *(batch.column(c).to_pylist() for c in ("src", "block", "part", "tokens"))
            ):
                offset, piece_halo = placed[(src, block, part)]
                ids = np.frombuffer(raw, dtype=dtype)
                local = np.concatenate([ids, np.frombuffer(piece_halo, dtype=dtype)])
                spans = windows.chunk_spans(offset, offset + len(ids), segments, chunk_tokens)
                chosen = [s for s in spans if s.split == name]
                if chosen:
                    yield pa.RecordBatch.from_pydict({
                        "start": [s.start for s in chosen],
                        "tokens": [local[s.start - offset:min(s.end + halo, s.seg_end) - offset]
                                   .tobytes() for s in chosen],
                    }, schema=CHUNK_SCHEMA)

    return encoded.mapInArrow(cut, CHUNK_DDL)
