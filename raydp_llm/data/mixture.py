"""A mixture of sources (``data.sources``): which source each training window comes from, and
which of its windows.

Slot ``g = step·batch_size + j`` of a run (window ``j`` of optimizer step ``step``) belongs to the
source whose share of [0, 1) holds ``frac(g·α + ½)``, α the golden ratio's fraction: a Kronecker
sequence, so over any run of slots each source's count stays within a few slots of its weight's
share (stratified, as Megatron's blend is, not drawn at random). A source's ``k``-th slot takes the
``k``-th window of its own endless sequence: epoch ``k // N`` of its ``N`` windows per epoch, in
that epoch's seeded order (``stream.EpochOrder``), spread over ``batch_size`` lanes as a lone
source's epoch is, so a step's windows come from far-apart places of each source. All of it is a
function of the step and the seed: a step's batch is the same with any number of workers, and a
resumed run seeks to its step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer, Tokenizer
from raydp_llm.data.stream import ChunkReader, EpochOrder, Sampling, SplitChunks

ALPHA = (math.sqrt(5) - 1) / 2  # the golden ratio's fraction: the most even Kronecker sequence
COUNT_BLOCK = 1 << 20  # slots counted at a time when seeking to a step


@dataclass(frozen=True)
class MixtureSpec:
    """A mixture as the workers read it: each source's name, weight (normalized), training
    windows per epoch, the map of its token ids to the mixture's (None: the same ids) and the
    dtype its chunks store them in."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    windows: tuple[int, ...]
    id_maps: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[str, ...] = ()

    def order(self, batch_size: int) -> MixtureOrder:
        return MixtureOrder(self.weights, self.windows, batch_size)


class MixtureOrder:
    """Which source and which of its windows each slot of each step takes (module docstring)."""

    def __init__(self, weights, windows, batch_size: int):
        self.bounds = np.cumsum(weights) / sum(weights)
        self.bounds[-1] = 1.0
        self.windows, self.batch_size = tuple(windows), batch_size
        self._counted, self._counts = 0, np.zeros(len(self.bounds), dtype=np.int64)

    def sources(self, first: int, n: int) -> np.ndarray:
        """The source of each of the slots ``first .. first + n - 1``."""
        g = np.arange(first, first + n, dtype=np.float64)
        return np.searchsorted(self.bounds, np.modf(g * ALPHA + 0.5)[0], side="right")

    def taken(self, slots: int) -> np.ndarray:
        """Per source, the windows the first ``slots`` slots take (counted once as steps go on;
        a resumed run counts up to its step in blocks)."""
        if slots < self._counted:
            self._counted, self._counts = 0, np.zeros_like(self._counts)
        while self._counted < slots:
            n = min(slots - self._counted, COUNT_BLOCK)
            found = self.sources(self._counted, n)
            self._counts += np.bincount(found, minlength=len(self._counts))
            self._counted += n
        return self._counts.copy()

    def step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The source of each slot of ``step``, and which of that source's windows it takes (its
        ``k``-th)."""
        first = step * self.batch_size
        before = self.taken(first)
        sources = self.sources(first, self.batch_size)
        k = np.empty(self.batch_size, dtype=np.int64)
        for s in np.unique(sources):
            rows = sources == s
            k[rows] = before[s] + np.arange(rows.sum())
        return sources, k

    def per_epoch(self, s: int) -> int:
        """The windows of an epoch of source ``s``: as many as ``batch_size`` lanes hold evenly
        (the rest left out, as a lone source's are), or all when there are fewer than lanes."""
        n, lanes = self.windows[s], self.batch_size
        return (n // lanes) * lanes or n

    def place(self, s: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The epoch of source ``s`` and the position in that epoch's order of its ``k``-th
        windows: an epoch's positions dealt over ``batch_size`` lanes."""
        used, lanes = self.per_epoch(s), self.batch_size
        q = k % used
        if used < lanes:  # fewer windows than lanes: in order
            return k // used, q
        per_lane = used // lanes
        return k // used, (q % lanes) * per_lane + q // lanes

    def epochs(self, steps: int) -> list[float]:
        """Per source, the epochs of it that ``steps`` steps train on."""
        taken = self.taken(steps * self.batch_size)
        return [int(t) / self.per_epoch(s) for s, t in enumerate(taken)]


class MixtureReader:
    """One worker's reads of a mixture's training windows: a ``ChunkReader`` per source, each
    source's ids mapped to the mixture's."""

    def __init__(self, spec: MixtureSpec, parts: list[SplitChunks], sampling: Sampling,
                 seed: int, dtypes: list[str], batch_size: int, capacity: int):
        self.spec, self.sampling, self.seed = spec, sampling, seed
        self.order = spec.order(batch_size)
        self.readers = [ChunkReader(p.source, p.index, dtype, capacity)
                        for p, dtype in zip(parts, dtypes)]
        self.maps = [None if m is None else np.asarray(m, dtype=np.int64) for m in spec.id_maps]
        self._orders: dict[tuple[int, int], EpochOrder] = {}

    def windows(self, step: int, slots: slice, dtype: str) -> np.ndarray:
        """The windows of ``step``'s ``slots`` (this worker's share of the batch)."""
        sources, k = self.order.step(step)
        sources, k = sources[slots], k[slots]
        out = np.empty((len(k), self.sampling.block_size + 1), dtype=dtype)
        for s in np.unique(sources):
            rows = np.flatnonzero(sources == s)
            epochs, positions = self.order.place(int(s), k[rows])
            for e in np.unique(epochs):
                mine = epochs == e
                got = self.readers[s].windows(self._epoch(int(s), int(e)), positions[mine])
                out[rows[mine]] = got if self.maps[s] is None else self.maps[s][got]
        return out

    def _epoch(self, s: int, e: int) -> EpochOrder:
        if (s, e) not in self._orders:
            self._orders = {key: o for key, o in self._orders.items() if key[0] != s}
            self._orders[(s, e)] = EpochOrder(self.readers[s].index, self.sampling, self.seed, e)
        return self._orders[(s, e)]

    def counts(self) -> dict:
        """Chunks, tokens and windows read, over every source."""
        totals = [r.counts() for r in self.readers]
        return {k: sum(t[k] for t in totals) for k in totals[0]}


def one_tokenizer(names: list[str], tokenizers: list[Tokenizer]
                  ) -> tuple[Tokenizer, list[tuple[int, ...] | None]]:
    """The mixture's tokenizer and each source's id map to it: the sources' own when they are one
    (a given tokenizer, a model's); for char tokenizers, one over all their characters, each
    source's ids mapped to it (its end of document to the mixture's)."""
    first = tokenizers[0]
    if all(t.to_json() == first.to_json() for t in tokenizers):
        return first, [None] * len(tokenizers)
    if not all(isinstance(t, CharTokenizer) for t in tokenizers):
        differs = next(n for n, t in zip(names, tokenizers) if t.to_json() != first.to_json())
        raise InputError(f"data.sources: {differs} was encoded with another tokenizer than "
                         f"{names[0]}; give tokenizer.path (one tokenizer for all sources)")
    mixed = CharTokenizer("".join(t.chars for t in tokenizers))
    maps = []
    for t in tokenizers:
        ids = [mixed.chars.index(c) for c in t.chars] + [mixed.eod_id]
        maps.append(tuple(ids))
    return mixed, maps
