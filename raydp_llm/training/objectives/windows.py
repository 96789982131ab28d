"""One worker's windows (``WorkerData``): its lanes of each epoch's training sequence, or its slots
of a mixture's steps (data/mixture.py), and its share of the validation windows, per source for a
mixture (``ValWindows``)."""

from __future__ import annotations

import numpy as np

from raydp_llm.data.mixture import MixtureReader
from raydp_llm.data.stream import ChunkReader, EpochOrder, Lanes, ordered_positions
from raydp_llm.training.spec import TrainSpec


class ValWindows:
    """A worker's contiguous share of the first ``limit`` validation windows of one split (all
    when None: the same windows with any number of workers), a micro-batch at a time; ids mapped
    by ``id_map`` (a mixture's source)."""

    def __init__(self, reader: ChunkReader, order: EpochOrder, limit: int | None, micro: int,
                 rank: int, world: int, id_map: tuple[int, ...] | None = None):
        self.reader, self.order, self.micro = reader, order, micro
        self.positions = ordered_positions(order.total, limit, rank, world)
        self.id_map = None if id_map is None else np.asarray(id_map, dtype=np.int64)

    def val_batches(self):
        for lo in range(0, len(self.positions), self.micro):
            windows = self.reader.windows(self.order, self.positions[lo:lo + self.micro])
            yield windows if self.id_map is None else self.id_map[windows]

    def val_batch_count(self) -> int:
        return -(-len(self.positions) // self.micro)


class WorkerData:
    """One worker's windows, from ``data``: each split's ``SplitChunks`` (data/stream.py), or for a
    mixture (``spec.mixture``) each split's list of them, a source each."""

    def __init__(self, spec: TrainSpec, data: dict, rank: int, world: int):
        self.spec, self.rank, self.world = spec, rank, world
        self.lanes = Lanes(spec.train.batch_size, rank, world)
        self.open_chunks = spec.train.batch_size // world + 2  # one per lane, and some slack
        self.epoch_reads = {"epoch": None, "windows": 0, "chunks": 0}
        micro = spec.micro_batch(world)
        limit = None if spec.train.eval_batches is None else \
            spec.train.eval_batches * micro * world
        if spec.mixture is None:
            self.readers = {name: ChunkReader(split.source, split.index, spec.token_dtype,
                                              self.open_chunks)
                            for name, split in data.items()}
            order = EpochOrder(data["val"].index, spec.sampling["val"], spec.seed, epoch=None)
            self.val = ValWindows(self.readers["val"], order, limit, micro, rank, world)
            self.val_by_source: dict[str, ValWindows] = {}
            return
        mix = spec.mixture
        self.mixture = MixtureReader(mix, data["train"], spec.sampling["train"], spec.seed,
                                     list(mix.dtypes), spec.train.batch_size,
                                     spec.train.batch_size + 2)  # a worker reads every lane
        self.val_by_source = {
            name: ValWindows(ChunkReader(part.source, part.index, dtype, 2),
                             EpochOrder(part.index, spec.sampling["val"], spec.seed, None),
                             limit, micro, rank, world, id_map)
            for name, part, dtype, id_map in zip(mix.names, data["val"], mix.dtypes,
                                                 mix.id_maps)}

    def steps(self, epoch: int, first_step: int):
        """This worker's micro-batches for the optimizer steps ``first_step..`` of ``epoch``,
        ``grad_accum`` at a time (a mixture's run is one epoch of its steps: each source counts
        its own)."""
        if self.spec.mixture is not None:
            yield from self._mixture_steps(first_step)
            return
        spec, reader = self.spec, self.readers["train"]
        order = EpochOrder(reader.index, spec.sampling["train"], spec.seed, epoch)
        before = reader.counts()
        for step in range(first_step, spec.steps_per_epoch):
            windows = reader.windows(order, self.lanes.positions(step, spec.steps_per_epoch))
            self._count_reads(epoch, before, reader.counts())
            yield np.split(windows, spec.train.grad_accum)

    def _mixture_steps(self, first_step: int):
        spec, batch = self.spec, self.spec.train.batch_size
        mine = slice(self.rank * batch // self.world, (self.rank + 1) * batch // self.world)
        before = self.mixture.counts()
        for step in range(first_step, spec.steps_per_epoch):
            windows = self.mixture.windows(step, mine, spec.token_dtype)
            self._count_reads(0, before, self.mixture.counts())
            yield np.split(windows, spec.train.grad_accum)

    def _count_reads(self, epoch: int, before: dict, after: dict) -> None:
        self.epoch_reads = {"epoch": epoch,
                            "windows": after["windows_read"] - before["windows_read"],
                            "chunks": after["chunks_read"] - before["chunks_read"]}

    def every_window(self):
        """This worker's contiguous share of every window of both splits, in stream order, a
        micro-batch at a time."""
        micro = self.spec.micro_batch(self.world)
        for name, reader in self.readers.items():
            order = EpochOrder(reader.index, self.spec.sampling[name], self.spec.seed, epoch=None)
            positions = ordered_positions(order.total, None, self.rank, self.world)
            for lo in range(0, len(positions), micro):
                yield reader.windows(order, positions[lo:lo + micro])

    def val_batches(self):
        """This worker's share of the validation windows (``ValWindows``; one source's)."""
        return self.val.val_batches()

    def val_batch_count(self) -> int:
        return self.val.val_batch_count()
