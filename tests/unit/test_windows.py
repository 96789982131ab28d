"""The stream's arithmetic: segments, chunks cut per piece with halos, and the windows cut from the
chunks, against brute force over the whole stream."""

import functools

import numpy as np
import pytest

from helpers.chunks import chunked
from raydp_llm.data import windows
from raydp_llm.data.stream import ChunkReader, EpochOrder, Sampling


def reference_windows(n, boundary, block, stride):
    """Brute force: every start of each split whose window fits inside the split."""
    out = {}
    for name, lo, hi in (("train", 0, boundary), ("val", boundary, n)):
        out[name] = [s for s in range(lo, hi, stride) if s + block + 1 <= hi]
    return out


@pytest.mark.parametrize("block,stride,chunk", [(10, 7, 16), (10, 10, 5), (10, 1, 64), (40, 3, 8)])
def test_windows_cut_from_chunks_equal_the_whole_stream_cut(block, stride, chunk):
    """Pieces shorter than a block (empty ones too) and chunks shorter than a window: every window
    of every split, cut from its chunk row alone, equals the whole-stream brute force."""
    rng = np.random.default_rng(0)
    lengths = [37, 1, 0, 120, 64, 9, 3, 250]
    stream = rng.integers(0, 60, sum(lengths)).astype(np.uint16)
    n = len(stream)
    boundary = windows.split_boundary(n, 0.2)
    segments_of = functools.partial(windows.segments, n=n, split="tail", val_fraction=0.2, seed=0,
                                    segment_tokens=8192)
    index, sources = chunked(stream, lengths, segments_of, chunk, halo=48)
    expected = reference_windows(n, boundary, block, stride)
    for name in ("train", "val"):
        order = EpochOrder(index[name], Sampling(block, stride), seed=0, epoch=None)
        reader = ChunkReader(sources[name], index[name], "uint16", capacity=2)
        got = reader.windows(order, np.arange(order.total))
        assert got.tolist() == [stream[s:s + block + 1].tolist() for s in expected[name]]


def test_chunks_never_cross_a_segment():
    n = 50_000
    segments_of = functools.partial(windows.segments, n=n, split="hash", val_fraction=0.3, seed=3,
                                    segment_tokens=1000)
    spans = windows.chunk_spans(1234, 40_000, segments_of, 300)
    assert spans[0].start == 1234 and spans[-1].end == 40_000
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))  # they tile the piece
    assert all(s.seg_start <= s.start < s.end <= s.seg_end and s.end - s.start <= 300
               for s in spans)
    assert {s.split for s in spans} == {"train", "val"}


def test_split_boundary_is_the_tail():
    assert windows.split_boundary(1000, 0.1) == 900
    assert windows.split_boundary(1001, 0.1) == 901
