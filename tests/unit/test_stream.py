"""The training order read from chunks (data/stream.py): the same batches with any number of
workers, each worker reading its own share, random windows inside their segment, resume without
reading what came before; evaluation's windows predict every token once."""

import functools

import numpy as np
import pytest

from helpers.chunks import chunked
from raydp_llm.data import windows
from raydp_llm.data.stream import ChunkReader, EpochOrder, Lanes, Sampling, iter_windows

N, BLOCK, BATCH = 40_000, 16, 12


@pytest.fixture(scope="module")
def corpus():
    """A hash-split stream (many segments) in uneven pieces and 500-token chunks; token i = i, so
    a window shows where it was cut from."""
    stream = np.arange(N, dtype=np.uint32)
    segments_of = functools.partial(windows.segments, n=N, split="hash", val_fraction=0.2,
                                    seed=1, segment_tokens=2000)
    lengths = [7000, 13, 9000, 0, 23_987]
    index, sources = chunked(stream, lengths, segments_of, chunk_tokens=500, halo=64)
    return index["train"], sources["train"], segments_of


def step_batch(corpus, sampling, world, step, epoch=0):
    """The global batch of ``step``: every worker's windows, in rank order."""
    index, source, _ = corpus
    order = EpochOrder(index, sampling, seed=5, epoch=epoch)
    steps = order.total // BATCH
    return np.concatenate([
        ChunkReader(source, index, "uint32", 8).windows(
            order, Lanes(BATCH, rank, world).positions(step, steps))
        for rank in range(world)])


@pytest.mark.parametrize("random", [False, True])
def test_the_batch_of_a_step_is_the_same_with_any_number_of_workers(corpus, random):
    sampling = Sampling(BLOCK, 5, random=random)
    steps = EpochOrder(corpus[0], sampling, seed=5, epoch=0).total // BATCH
    for step in (0, 1, 57, steps - 1):
        one = step_batch(corpus, sampling, 1, step)
        assert one.shape == (BATCH, BLOCK + 1)
        for world in (2, 3, 4, 6, 12):
            assert (step_batch(corpus, sampling, world, step) == one).all()
    assert not (step_batch(corpus, sampling, 1, 0, epoch=1) == step_batch(corpus, sampling, 1, 0)
                ).all()  # each epoch has its own order


@pytest.mark.parametrize("random", [False, True])
def test_an_epoch_reads_each_window_once_and_no_window_crosses_a_segment(corpus, random):
    index, source, segments_of = corpus
    sampling = Sampling(BLOCK, 7, random=random)
    order = EpochOrder(index, sampling, seed=5, epoch=2)
    got = ChunkReader(source, index, "uint32", 4).windows(order, np.arange(order.total))
    assert ((got[:, 1:] - got[:, :-1]) == 1).all()  # consecutive stream tokens
    starts, ends = got[:, 0], got[:, -1]
    for start, end in zip(starts, ends):  # inside one training segment
        (name, lo, hi), = segments_of(int(start), int(start) + 1)
        assert name == "train" and lo <= start and end < hi
    if not random:  # exactly the stride windows, each once
        expected = [s for i in range(len(index))
                    for s in index.window_starts(i, BLOCK, 7)]
        assert sorted(starts.tolist()) == sorted(expected)
    else:  # as many as a stride of one block gives, at offsets a stride could not give
        assert len(starts) == int(index.window_counts(BLOCK, BLOCK).sum())
        assert (starts % BLOCK != index.seg_start[0] % BLOCK).any()


def test_each_worker_reads_its_share(corpus):
    """Over an epoch a worker reads S·B/W windows (≤ windows/W) and about 1/W of the chunks."""
    index, source, _ = corpus
    sampling = Sampling(BLOCK, 1)
    order = EpochOrder(index, sampling, seed=5, epoch=0)
    steps = order.total // BATCH
    for world in (1, 2, 4):
        chunks = []
        for rank in range(world):
            source.fetched = []
            reader = ChunkReader(source, index, "uint32", BATCH // world + 2)
            lanes = Lanes(BATCH, rank, world)
            for step in range(steps):
                reader.windows(order, lanes.positions(step, steps))
            assert reader.windows_read == steps * BATCH // world <= order.total / world
            chunks.append(len(set(source.fetched)))
            assert reader.chunks_read == len(source.fetched)  # each chunk fetched once
        assert max(chunks) <= len(index) / world + BATCH // world


def test_resume_reads_nothing_before_its_step(corpus):
    """Seeking to step s fetches only the chunks holding the windows of steps s.. and gives the
    same windows as reading from the start."""
    index, source, _ = corpus
    sampling = Sampling(BLOCK, 3)
    order = EpochOrder(index, sampling, seed=5, epoch=0)
    steps = order.total // BATCH
    lanes = Lanes(BATCH, 0, 1)
    first = ChunkReader(source, index, "uint32", BATCH + 2)
    from_start = [first.windows(order, lanes.positions(s, steps)) for s in range(steps)]
    resume_at = steps - 3
    source.fetched = []
    resumed = ChunkReader(source, index, "uint32", BATCH + 2)
    tail = [resumed.windows(order, lanes.positions(s, steps)) for s in range(resume_at, steps)]
    assert all((a == b).all() for a, b in zip(tail, from_start[resume_at:]))
    assert resumed.windows_read == 3 * BATCH
    needed = set(order.locate(np.concatenate(
        [lanes.positions(s, steps) for s in range(resume_at, steps)]))[0].tolist())
    assert set(source.fetched) == needed and len(source.fetched) == len(needed) < len(index)


def test_evaluation_windows_predict_every_token_of_a_split_once(corpus):
    """With ``partial``, each segment ends in a shorter window (padded, its length beside it):
    every token but a segment's first is predicted once, from its own segment's tokens."""
    index, source, segments_of = corpus
    sampling = Sampling(BLOCK, BLOCK, partial=True)
    parts = list(iter_windows(source, index, sampling, "uint32", batch=50))
    tokens = np.concatenate([p.tokens for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    assert tokens.shape[1] == BLOCK + 1 and lengths.min() >= 2
    assert (lengths < BLOCK + 1).sum() > 0
    predicted = []
    for row, n in zip(tokens, lengths):
        own = row[:n]
        assert ((own[1:] - own[:-1]) == 1).all() and (row[n:] == 0).all()
        (name, lo, hi), = segments_of(int(own[0]), int(own[0]) + 1)
        assert name == "train" and own[-1] < hi
        predicted.append(own[1:])
    predicted = np.sort(np.concatenate(predicted))
    train = [(lo, hi) for name, lo, hi in segments_of(0, N) if name == "train"]
    expected = np.concatenate([np.arange(lo + 1, hi) for lo, hi in train])
    assert np.array_equal(predicted, expected)
    full = Sampling(BLOCK, BLOCK).windows(index)
    assert full < len(tokens) == sampling.windows(index)
