"""The ETL's chunk rows made without Spark, for the unit tests of the data package (windows, chunk
reads, the worker's data) that have no engine."""

from __future__ import annotations


class StoredChunks:
    """Chunk rows as the ETL stores them: cut per piece, each with the halo after it."""

    def __init__(self, rows: dict[int, bytes]):
        self.rows, self.fetched = rows, []

    def fetch(self, c, start):
        self.fetched.append(c)
        return self.rows[start]


# Why not the ETL's own ``data.etl.chunks.cut_chunks``: it cuts inside a Spark ``mapInArrow`` (a
# closure over the pieces' placement, run by the executors), which unit tests have no Spark for.
# This is the same cut in numpy: ``windows.chunk_spans`` per piece, each chunk's tokens and up to
# ``halo`` tokens after it in its segment, taken from the piece and its halo (``windows.halos``).
# Keep the slice in step with cut_chunks' (tests/integration/test_etl.py checks the real one's
# windows against a single-process reference).
def chunked(stream, lengths, segments_of, chunk_tokens, halo):
    """What the ETL makes of ``stream`` cut into pieces of ``lengths``: each split's index and its
    stored chunks, cut piece by piece from the piece's tokens and its halo (etl.chunks.cut_chunks).
    """
    import numpy as np

    from raydp_llm.data import windows
    from raydp_llm.data.stream import ChunkIndex

    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pieces = [stream[o:o + k] for o, k in zip(offsets, lengths)]
    piece_halos = windows.halos([p[:halo] for p in pieces], halo)
    rows = {"train": [], "val": []}
    stored = {"train": {}, "val": {}}
    for off, piece, after in zip(offsets, pieces, piece_halos):
        local = np.concatenate([piece, after])
        for s in windows.chunk_spans(int(off), int(off) + len(piece), segments_of, chunk_tokens):
            rows[s.split].append((s.start, s.end - s.start, s.seg_start, s.seg_end))
            stored[s.split][s.start] = local[s.start - off:min(s.end + halo, s.seg_end) - off]
    return ({k: ChunkIndex.of(v) for k, v in rows.items()},
            {k: StoredChunks({a: t.tobytes() for a, t in v.items()}) for k, v in stored.items()})
