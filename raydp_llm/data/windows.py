"""Segment, chunk and window arithmetic over one token stream: pure functions, used inside the Spark
executors and on the driver.

The stream (all documents, concatenated in order) has ``n`` tokens and is cut into *segments*, each
wholly training or validation data. ``tail`` split: two segments, the last ``val_fraction`` of the
stream is validation (nanoGPT's split). ``hash`` split: segments of ``segment_tokens`` tokens, each
assigned by a seeded hash (for corpora spread over many files). A window is ``block_size + 1``
consecutive tokens (inputs and shifted targets); windows start every ``stride`` tokens from their
segment's first position and never leave their segment, so no window mixes the splits.

The ETL stores *chunks*: each piece of the stream (an encoded part of an input split) is cut where
it meets a segment boundary and every ``chunk_tokens`` tokens; a chunk is stored with the ``halo``
tokens that follow it in its segment, taken (for a piece's last chunk) from the heads of the next
pieces, so that any window of up to ``halo + 1`` tokens that starts in the chunk is cut from it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SPLITS = ("train", "val")


def split_boundary(n_tokens: int, val_fraction: float) -> int:
    """First validation position: the last ``val_fraction`` of the stream is validation."""
    return n_tokens - int(round(n_tokens * val_fraction))


def is_val_segment(index: int, seed: int, val_fraction: float) -> bool:
    """The hash split's seeded, reproducible choice for segment ``index`` (splitmix64)."""
    z = (index + 0x9E3779B97F4A7C15 * (seed + 1)) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return ((z ^ (z >> 31)) / 2**64) < val_fraction


def segments(lo: int, hi: int, n: int, split: str, val_fraction: float, seed: int,
             segment_tokens: int) -> list[tuple[str, int, int]]:
    """``(split_name, start, end)`` of the segments of an ``n``-token stream that overlap ``[lo,
    hi)``."""
    if split == "tail":
        boundary = split_boundary(n, val_fraction)
        both = [("train", 0, boundary), ("val", boundary, n)]
        return [s for s in both if s[1] < min(hi, s[2]) and max(lo, s[1]) < s[2]]
    first, last = lo // segment_tokens, (min(hi, n) - 1) // segment_tokens
    return [("val" if is_val_segment(j, seed, val_fraction) else "train", j * segment_tokens,
             min((j + 1) * segment_tokens, n)) for j in range(first, last + 1)]


def record_segments(lo: int, hi: int, segments_of, record: int) -> list[tuple[str, int, int]]:
    """``segments_of`` (``segments`` over a stream counted in ``record``s) in tokens: a stream of
    records (chat's, a window each) is split between records, never inside one."""
    return [(name, start * record, end * record)
            for name, start, end in segments_of(lo // record, -(-hi // record))]


class Span(NamedTuple):
    split: str
    start: int
    end: int
    seg_start: int
    seg_end: int


def chunk_spans(lo: int, hi: int, segments_of, chunk_tokens: int) -> list[Span]:
    """The chunks of the piece ``[lo, hi)``: each segment's part of it (``segments_of(lo, hi)``, as
    ``segments`` gives them), cut every ``chunk_tokens`` tokens from where the piece enters it."""
    out = []
    for name, seg_start, seg_end in segments_of(lo, hi):
        a, b = max(lo, seg_start), min(hi, seg_end)
        out += [Span(name, start, min(start + chunk_tokens, b), seg_start, seg_end)
                for start in range(a, b, chunk_tokens)]
    return out


def halos(heads: list[np.ndarray], block_size: int) -> list[np.ndarray]:
    """For the pieces of a stream, in order, given each piece's first ``block_size`` tokens (all of
    them if it is shorter): the ``block_size`` tokens that follow each piece (fewer at the stream's
    end)."""
    out, after = [], np.empty(0, dtype=heads[0].dtype if heads else np.int64)
    for head in reversed(heads):
        out.append(after)
        after = np.concatenate([head, after])[:block_size]
    return out[::-1]
