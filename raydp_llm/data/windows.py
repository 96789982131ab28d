"""Window arithmetic over one token stream: pure functions, used inside the Spark executors.

The stream (all documents, concatenated in order) has ``n`` tokens and is cut into *segments*, each
wholly training or validation data. ``tail`` split: two segments, the last ``val_fraction`` of the
stream is validation (nanoGPT's split). ``hash`` split: segments of ``segment_tokens`` tokens, each
assigned by a seeded hash (for corpora spread over many files). A window is ``block_size + 1``
consecutive tokens (inputs and shifted targets); windows start every ``stride`` tokens from their
segment's first position and never leave their segment, so no window mixes the splits.

To cut windows in parallel, every piece of the stream cuts the windows that *start* in it, so it
needs the ``block_size`` tokens that follow it (its halo), taken from the heads of the next pieces.
"""

from __future__ import annotations

import numpy as np


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


def window_starts(
    seg_start: int, seg_end: int, lo: int, hi: int, block_size: int, stride: int
) -> np.ndarray:
    """Starts of the windows that lie inside segment ``[seg_start, seg_end)`` and start in ``[lo,
    hi)``."""
    last = seg_end - (block_size + 1)  # last allowed start
    if last < seg_start:
        return np.empty(0, dtype=np.int64)
    first_j = max(0, -(-(lo - seg_start) // stride))  # ceil division
    last_j = min((last - seg_start) // stride, (hi - 1 - seg_start) // stride)
    if last_j < first_j:
        return np.empty(0, dtype=np.int64)
    return seg_start + stride * np.arange(first_j, last_j + 1, dtype=np.int64)


def count_windows(seg_start: int, seg_end: int, block_size: int, stride: int) -> int:
    return len(window_starts(seg_start, seg_end, seg_start, seg_end, block_size, stride))


def halos(heads: list[np.ndarray], block_size: int) -> list[np.ndarray]:
    """For the pieces of a stream, in order, given each piece's first ``block_size`` tokens (all of
    them if it is shorter): the ``block_size`` tokens that follow each piece (fewer at the stream's
    end)."""
    out, after = [], np.empty(0, dtype=heads[0].dtype if heads else np.int64)
    for head in reversed(heads):
        out.append(after)
        after = np.concatenate([head, after])[:block_size]
    return out[::-1]


def cut_windows(
    tokens: np.ndarray, tokens_start: int, starts: np.ndarray, block_size: int
) -> np.ndarray:
    """Windows ``[s, s + block_size + 1)`` of a stream slice that begins at position
    ``tokens_start``."""
    idx = (starts - tokens_start)[:, None] + np.arange(block_size + 1)[None, :]
    return tokens[idx]
