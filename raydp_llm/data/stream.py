"""Windows cut from the token stream as it is read: the chunk index, the epoch's order, and what
each worker reads.

The ETL stores tokens, not windows. Each split is a list of *chunks*: consecutive tokens of one
segment (never crossing a split or segment boundary), stored as one row with up to ``halo`` tokens
that follow it in its segment, so every window that starts in a chunk is cut from that row alone.
Windows (``block_size + 1`` tokens) are cut here, when read, at any stride or at seeded random
offsets (``Sampling``): the same ETL output serves every stride and every block up to the halo.

The order of an epoch is a seeded function of (seed, epoch) alone (``EpochOrder``): the chunks are
permuted, the windows within each chunk are permuted (or drawn at random offsets), and the resulting
sequence of ``N`` windows is cut into ``batch_size`` *lanes* of ``S = N // batch_size`` windows.
Optimizer step ``s`` trains on window ``s`` of every lane. Worker ``r`` of ``W`` owns lanes
``r·B/W .. (r+1)·B/W - 1``: one contiguous ``1/W`` of the sequence, so it reads about ``1/W`` of
the chunks, and exactly ``S·B/W`` windows per epoch. The batch of a step is the same with any
number of workers, and a resumed run seeks to its step without reading anything before it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raydp_llm.core.storage import S3Options, resolve
from raydp_llm.data.windows import SPLITS

INDEX_FILE = "index.parquet"
# a chunk's row: its first position in the stream, its tokens (raw ``token_dtype`` bytes, the halo
# included); the ETL's Spark schema is derived from this one (etl/chunks.py)
CHUNK_SCHEMA = pa.schema([("start", pa.int64()), ("tokens", pa.binary())])
_INDEX_COLUMNS = ("start", "n", "seg_start", "seg_end")


@dataclass(frozen=True)
class ChunkIndex:
    """The chunks of one split, in stream order: first position, own tokens (without the halo) and
    the segment each lies in. Built by the ETL's driver from arithmetic alone (etl/chunks.py)."""

    start: np.ndarray  # int64, ascending
    n: np.ndarray
    seg_start: np.ndarray
    seg_end: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def of(cls, rows: list[tuple[int, int, int, int]]) -> ChunkIndex:
        """From ``(start, n, seg_start, seg_end)`` rows, sorted by start."""
        cols = np.array(sorted(rows), dtype=np.int64).reshape(-1, 4)
        return cls(*(np.ascontiguousarray(cols[:, i]) for i in range(4)))

    def window_counts(self, block_size: int, stride: int, partial: bool = False) -> np.ndarray:
        """Per chunk: the windows that start in it every ``stride`` tokens from its segment's start
        and end inside the segment (``partial``: or are cut short by its end, with at least one
        token to predict)."""
        first_k = -((self.seg_start - self.start) // stride)  # ceil((start - seg_start) / stride)
        shortest = 2 if partial else block_size + 1
        last = np.minimum(self.seg_end - shortest, self.start + self.n - 1)
        last_k = (last - self.seg_start) // stride
        return np.maximum(0, last_k - first_k + 1)

    def window_starts(self, c: int, block_size: int, stride: int,
                      partial: bool = False) -> np.ndarray:
        """The starts counted by ``window_counts`` for chunk ``c``, ascending."""
        first_k = -((int(self.seg_start[c]) - int(self.start[c])) // stride)
        count = int(self.window_counts(block_size, stride, partial)[c])
        return int(self.seg_start[c]) + stride * np.arange(first_k, first_k + count, dtype=np.int64)

    def tokens(self) -> int:
        return int(self.n.sum())


def write_index(directory, indexes: dict[str, ChunkIndex]) -> None:
    table = pa.table({
        "split": [name for name in SPLITS for _ in range(len(indexes[name]))],
        **{col: np.concatenate([getattr(indexes[name], col) for name in SPLITS])
           for col in _INDEX_COLUMNS},
    })
    pq.write_table(table, f"{directory}/{INDEX_FILE}")


def read_index(directory) -> dict[str, ChunkIndex]:
    table = pq.read_table(f"{directory}/{INDEX_FILE}")
    split = np.array(table.column("split").to_pylist())
    cols = {col: table.column(col).to_numpy() for col in _INDEX_COLUMNS}
    return {name: ChunkIndex(**{col: v[split == name] for col, v in cols.items()})
            for name in SPLITS}


@dataclass(frozen=True)
class Sampling:
    """How windows are cut: ``block_size + 1`` tokens every ``stride`` tokens, or (``random``) at
    seeded random offsets, as many per chunk as a stride of ``block_size`` gives (nanoGPT's
    sampling, with no window crossing a split or segment boundary)."""

    block_size: int
    stride: int
    random: bool = False
    # also the windows a segment's end cuts short (evaluate: every token scored); a short window
    # is read padded to ``block_size + 1`` tokens, its length beside it (``EpochOrder.lengths``)
    partial: bool = False

    def counts(self, index: ChunkIndex) -> np.ndarray:
        stride = self.block_size if self.random else self.stride
        return index.window_counts(self.block_size, stride, self.partial)

    def windows(self, index: ChunkIndex) -> int:
        """The windows of all the chunks of ``index``: an epoch's."""
        return int(self.counts(index).sum())

    def starts(self, index: ChunkIndex, c: int, rng: np.random.Generator | None) -> np.ndarray:
        """Chunk ``c``'s window starts in the order they are taken: ascending without ``rng``,
        permuted (stride) or drawn (random) with it."""
        if not self.random:
            starts = index.window_starts(c, self.block_size, self.stride, self.partial)
            return starts if rng is None else starts[rng.permutation(len(starts))]
        count = int(self.counts(index)[c])
        lo = int(index.start[c])
        hi = min(lo + int(index.n[c]), int(index.seg_end[c]) - self.block_size)  # last start + 1
        rng = rng or np.random.default_rng([int(index.start[c])])
        return rng.integers(lo, hi, size=count, dtype=np.int64)


class EpochOrder:
    """The windows of one epoch in training order (see the module's docstring): position ``p`` of
    the sequence is window ``p - ends[k-1]`` of the ``k``-th chunk of the permutation."""

    def __init__(self, index: ChunkIndex, sampling: Sampling, seed: int, epoch: int | None):
        self.index, self.sampling, self.seed, self.epoch = index, sampling, seed, epoch
        counts = sampling.counts(index)
        shuffled = epoch is not None
        self.chunks = (np.random.default_rng([seed, epoch]).permutation(len(index)) if shuffled
                       else np.arange(len(index)))
        self.ends = np.cumsum(counts[self.chunks])
        self.total = int(self.ends[-1]) if len(self.ends) else 0

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chunk and the window within it of each sequence position."""
        k = np.searchsorted(self.ends, positions, side="right")
        before = np.where(k > 0, self.ends[np.maximum(k - 1, 0)], 0)
        return self.chunks[k], positions - before

    def window_starts(self, positions: np.ndarray) -> np.ndarray:
        """The stream position each window at ``positions`` starts at."""
        chunks, inner = self.locate(positions)
        out = np.empty(len(positions), dtype=np.int64)
        for c in np.unique(chunks):
            rows = chunks == c
            out[rows] = self.starts(int(c))[inner[rows]]
        return out

    def lengths(self, positions: np.ndarray) -> np.ndarray:
        """The tokens of each window at ``positions``: ``block_size + 1``, or fewer where its
        segment ends first (``Sampling.partial``)."""
        chunks, _ = self.locate(positions)
        ends = self.index.seg_end[chunks] - self.window_starts(positions)
        return np.minimum(self.sampling.block_size + 1, ends)

    def starts(self, c: int) -> np.ndarray:
        """Chunk ``c``'s window starts in the order this epoch takes them."""
        rng = None if self.epoch is None else np.random.default_rng([self.seed, self.epoch, c])
        return self.sampling.starts(self.index, c, rng)


def steps_per_epoch(windows: int, batch_size: int) -> int:
    """Optimizer steps in one pass over ``windows`` (an incomplete last step is dropped)."""
    return windows // batch_size


class ChunkReader:
    """One worker's reads of one split: each chunk fetched from its source once while it is in
    use (the ``capacity`` most recently used are kept), its window starts computed once per epoch;
    counts the chunks, tokens and windows it read."""

    def __init__(self, source, index: ChunkIndex, dtype: str, capacity: int):
        self.source, self.index, self.dtype = source, index, np.dtype(dtype)
        self.capacity, self.cache = capacity, {}
        self.chunks_read = self.tokens_read = self.windows_read = 0

    def windows(self, order: EpochOrder, positions: np.ndarray) -> np.ndarray:
        """The windows at ``positions`` of ``order``: (len(positions), block_size + 1) token ids."""
        width = order.sampling.block_size + 1
        chunks, inner = order.locate(positions)
        out = np.empty((len(positions), width), dtype=self.dtype)
        for c in np.unique(chunks):
            tokens, starts = self._chunk(order, int(c))
            rows = np.flatnonzero(chunks == c)
            at = (starts[inner[rows]] - int(self.index.start[c]))[:, None] + np.arange(width)
            if order.sampling.partial:  # a short window runs past its row (its segment's end):
                inside = at < len(tokens)  # padded with id 0, which its length leaves out
                out[rows] = np.where(inside, tokens[np.minimum(at, len(tokens) - 1)], 0)
            else:
                out[rows] = tokens[at]
        self.windows_read += len(positions)
        return out

    def _chunk(self, order: EpochOrder, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``c``'s tokens (fetched once while cached, whatever the epoch) and its window
        starts in ``order``'s epoch."""
        if c not in self.cache:
            tokens = np.frombuffer(self.source.fetch(c, int(self.index.start[c])), self.dtype)
            self.chunks_read += 1
            self.tokens_read += len(tokens)
            self.cache[c] = (tokens, None, None)
            while len(self.cache) > self.capacity:
                self.cache.pop(next(iter(self.cache)))
        tokens, epoch, starts = self.cache.pop(c)
        if starts is None or epoch != order.epoch:
            epoch, starts = order.epoch, order.starts(c)
        self.cache[c] = (tokens, epoch, starts)  # most recently used last
        return tokens, starts

    def counts(self) -> dict:
        return {"chunks_read": self.chunks_read, "tokens_read": self.tokens_read,
                "windows_read": self.windows_read}


@dataclass(frozen=True)
class Lanes:
    """Worker ``rank`` of ``world``'s lanes of a ``batch_size``-lane epoch of ``steps`` steps."""

    batch_size: int
    rank: int
    world: int

    def positions(self, step: int, steps: int) -> np.ndarray:
        """Sequence positions of this worker's windows of ``step``: window ``step`` of each of its
        lanes (lane ``b`` holds positions ``b·steps .. (b+1)·steps - 1``)."""
        per = self.batch_size // self.world
        lanes = np.arange(self.rank * per, (self.rank + 1) * per, dtype=np.int64)
        return lanes * steps + step


def ordered_positions(total: int, limit: int | None, rank: int, world: int) -> np.ndarray:
    """Worker ``rank``'s contiguous share of the first ``limit`` (all when None) positions of a
    sequence read in order (validation)."""
    n = total if limit is None else min(limit, total)
    return np.arange(n * rank // world, n * (rank + 1) // world, dtype=np.int64)


# ------------------------------------------------------------------------------ chunk sources


class ParquetChunks:
    """A split's chunks in the Parquet files of an ETL cache entry (local or s3://): one row group
    read per chunk fetched (the ETL writes a row group per chunk). ``groups[c]`` = (file, row group,
    row) of chunk ``c``, found on the driver from the files' footers."""

    def __init__(self, split_dir: str, index: ChunkIndex, s3: S3Options = S3Options()):
        self.fs, path = resolve(split_dir, s3)
        self.files = sorted(f.path for f in self.fs.get_file_info(pafs.FileSelector(path))
                            if f.path.endswith(".parquet"))
        where = {}
        # the footers, read once here: a worker opens a file with its footer in hand
        self.footers = [pq.ParquetFile(f, filesystem=self.fs).metadata for f in self.files]
        for i, meta in enumerate(self.footers):
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                first = group.column(0).statistics.min
                ids = np.searchsorted(index.start, first) + np.arange(group.num_rows)
                where.update({int(c): (i, g, r) for r, c in enumerate(ids)})
        self.where, self._open = where, None

    def fetch(self, c: int, start: int) -> bytes:
        i, g, r = self.where[c]
        if self._open is None or self._open[0] != (i, g):
            parquet = pq.ParquetFile(self.files[i], metadata=self.footers[i], filesystem=self.fs)
            table = parquet.read_row_group(g)
            self._open = ((i, g), table)
        return _row(self._open[1], r, start, f"{self.files[i]} row group {g}")

    def __getstate__(self):
        return self.__dict__ | {"_open": None}


class BlockChunks:
    """A split's chunks in Ray's object store, as ``ray.data.from_spark`` left them (Arrow blocks):
    one block fetched per chunk read. ``where[c]`` = (block, row).

    A block lost with its node cannot be made again by Ray once Spark has stopped (RayDP rebuilds
    it through its executors). ``on_lost``, set by the driver that can run the ETL again, gives
    the same chunks from elsewhere (``replacement(error)``: it waits until they are there),
    which this source reads from then on; without it a lost block is the worker's error."""

    def __init__(self, refs: list, index: ChunkIndex):
        import ray  # here, not at the top: Spark's executors import this module for its records
        import ray.experimental

        held = ray.experimental.get_object_locations(refs)
        starts = ray.get([_block_starts_task().options(scheduling_strategy=_near(held[ref]))
                          .remote(ref) for ref in refs])
        self.refs, self.where, self._open = refs, {}, None
        for b, block_starts in enumerate(starts):
            ids = np.searchsorted(index.start, block_starts)
            self.where.update({int(c): (b, r) for r, c in enumerate(ids)})
        self.on_lost, self.instead = None, None

    def fetch(self, c: int, start: int) -> bytes:
        import ray

        if self.instead is not None:
            return self.instead.fetch(c, start)
        try:
            table, r = self._block_of(c)
        except ray.exceptions.RayError as err:
            if self.on_lost is None:
                raise
            self.instead = self.on_lost.replacement(err)
            return self.instead.fetch(c, start)
        return _row(table, r, start, f"object store block {self.where[c][0]}")

    def _block_of(self, c: int) -> tuple[pa.Table, int]:
        """The block that holds chunk ``c`` (the one open, or fetched now), and its row there."""
        b, r = self.where[c]
        if self._open is None or self._open[0] != b:
            import ray

            self._open = (b, ray.get(self.refs[b]))
        return self._open[1], r

    def __getstate__(self):
        return self.__dict__ | {"_open": None}


def _row(table: pa.Table, r: int, start: int, where: str) -> bytes:
    """Row ``r``'s tokens, checked against the index: a chunk read from the wrong place is an
    error, never trained on."""
    found = table.column("start")[r].as_py()
    if found != start:
        raise RuntimeError(f"{where}: row {r} holds the chunk at {found}, the index expects "
                           f"{start}")
    return table.column("tokens")[r].as_py()


def _block_starts(table: pa.Table) -> np.ndarray:
    """A block's chunk starts, read where the block lies."""
    return table.column("start").to_numpy()


def _near(held: dict):
    """Where a task reading a block runs, from the block's locations (``held``: Ray's
    ``get_object_locations`` of it): on a node that holds it (soft), so that reading it makes no
    copy elsewhere (the driver's node would get every block); Ray's choice for a block held in
    its owner's memory."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = held["node_ids"]
    return NodeAffinitySchedulingStrategy(nodes[0], soft=True) if nodes else "DEFAULT"


@functools.cache
def _block_starts_task():
    """``_block_starts`` as a Ray task, made once per process."""
    import ray

    return ray.remote(num_cpus=0)(_block_starts)


@dataclass(frozen=True)
class Windows:
    """Windows read together: their tokens (n, block_size + 1), and how many of each row's tokens
    are the window's (the rest padding: ``Sampling.partial``)."""

    tokens: np.ndarray
    lengths: np.ndarray


def iter_windows(source, index: ChunkIndex, sampling: Sampling, dtype: str,
                 batch: int) -> Iterator[Windows]:
    """Every window of a split in stream order, ``batch`` at a time (offline evaluation)."""
    order = EpochOrder(index, sampling, seed=0, epoch=None)
    reader = ChunkReader(source, index, dtype, capacity=2)
    for lo in range(0, order.total, batch):
        positions = np.arange(lo, min(lo + batch, order.total), dtype=np.int64)
        yield Windows(reader.windows(order, positions), order.lengths(positions))


@dataclass(frozen=True)
class SplitChunks:
    """Where a worker reads one split's chunks: ``source`` (Parquet files or object-store blocks,
    ``ChunkReader``) and their ``index``."""

    source: object
    index: ChunkIndex


@dataclass(frozen=True)
class RunWindows:
    """A run's windows on the ETL's chunks, as its ``manifest.json`` adds them: how they are cut
    and how many each split has per epoch."""

    block_size: int
    sampling: str  # data.sampling
    stride: int
    val_stride: int
    train: int  # training windows per epoch
    val: int

    # the keys a run's manifest.json adds to the ETL's
    KEYS = ("block_size", "sampling", "stride", "val_stride", "windows_train", "windows_val")

    def to_json(self) -> dict:
        return {"block_size": self.block_size, "sampling": self.sampling, "stride": self.stride,
                "val_stride": self.val_stride, "windows_train": self.train,
                "windows_val": self.val}

    @classmethod
    def from_json(cls, content: dict) -> RunWindows:
        """The windows of a run's ``manifest.json`` (the ETL's keys beside them are left)."""
        return cls(content["block_size"], content["sampling"], content["stride"],
                   content["val_stride"], content["windows_train"], content["windows_val"])
