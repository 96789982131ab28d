"""``evaluate per_document=true``: every document of the corpus scored by the model, on the
cluster, into ``document_scores.parquet`` (``path, doc, val, tokens, mean_loss``), which a later
ETL reads as ``data.filters.score_path``.

Ray Data maps the ETL entry's document index (``documents/``: where each document's tokens lie in
the stream) through ``DocumentScorer`` actors, each holding the model once: a document's tokens are
read from the entry's chunks (both splits: a document may cross the boundary) and cut into windows
of ``block_size + 1`` tokens, stride ``block_size``; the first token is predicted from the
end-of-document token before it, so each of a document's tokens is scored once.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from raydp_llm.core.errors import InputError
from raydp_llm.data import cache
from raydp_llm.data.stream import ChunkIndex

SCORES_FILE = "document_scores.parquet"


class TokenRange:
    """Any ``[a, b)`` of the token stream, from the chunks of both splits (their own tokens)."""

    def __init__(self, sources: dict, index: dict[str, ChunkIndex], dtype: str):
        self.sources, self.index, self.dtype = sources, index, np.dtype(dtype)

    def read(self, a: int, b: int) -> np.ndarray:
        parts = []
        for split, idx in self.index.items():
            first = int(np.searchsorted(idx.start + idx.n, a, side="right"))
            last = int(np.searchsorted(idx.start, b))
            for c in range(first, last):
                start = int(idx.start[c])
                own = np.frombuffer(self.sources[split].fetch(c, start), self.dtype)[:idx.n[c]]
                parts.append((start, own[max(a - start, 0):b - start]))
        return np.concatenate([p for _, p in sorted(parts, key=lambda part: part[0])])


class DocumentScorer:
    """Ray Data's ``map_batches`` class: documents (``path, doc, start, end, val``) in, their
    predicted tokens and mean loss (nats) out."""

    def __init__(self, model_dir: str, entry: str, batch_windows: int):
        from raydp_llm.checkpoint.model_dir import load_model_dir

        torch.set_num_threads(1)  # an actor per CPU
        self.model = load_model_dir(model_dir)[0]
        index, _, manifest, _ = cache.read_entry(Path(entry))
        self.tokens = TokenRange(cache.parquet_sources(Path(entry), index), index,
                                 manifest.token_dtype)
        self.block, self.batch = self.model.config.block_size, batch_windows

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        counts, losses = [], []
        for start, end in zip(batch["start"].tolist(), batch["end"].tolist()):
            ids = self.tokens.read(max(start - 1, 0), end)
            nats = self.nats(ids)
            counts.append(len(ids) - 1)
            losses.append(nats / (len(ids) - 1) if len(ids) > 1 else math.nan)
        return {"path": batch["path"], "doc": batch["doc"], "val": batch["val"],
                "tokens": np.array(counts, np.int64), "mean_loss": np.array(losses)}

    @torch.no_grad()
    def nats(self, ids: np.ndarray) -> float:
        """The summed cross-entropy of ``ids[1:]``, each predicted from what comes before it in
        ``ids`` (at most ``block_size`` tokens back, windows of stride ``block_size``)."""
        x = torch.from_numpy(ids.astype(np.int64))
        starts = list(range(0, len(ids) - 1, self.block))
        full = [s for s in starts if s + self.block + 1 <= len(ids)]
        total = 0.0
        for i in range(0, len(full), self.batch):
            windows = torch.stack([x[s:s + self.block + 1] for s in full[i:i + self.batch]])
            total += self._sum(windows)
        for s in starts[len(full):]:  # the last, shorter window
            total += self._sum(x[s:].unsqueeze(0))
        return total

    def _sum(self, windows: torch.Tensor) -> float:
        _, scores = self.model(windows[:, :-1], windows[:, 1:])
        return float(scores.nats.sum())


def score_documents(model_dir: str, entry: Path, out_dir: Path, batch_windows: int,
                    actors: int) -> Path:
    """Score every document of ``entry`` with ``actors`` Ray actors; write and return
    ``out_dir/document_scores.parquet`` (sorted by path and document)."""
    import ray.data

    if not isinstance(entry, Path):
        raise InputError(f"{entry}: per_document=true scores a local ETL cache entry; set "
                         "data.cache_dir to a local directory (or data.cache=false)")
    documents = entry / cache.DOCUMENTS
    if not documents.is_dir():
        raise InputError(f"{entry}: this ETL output has no document index ({cache.DOCUMENTS}/); "
                         "run the ETL again (data.cache=false, or remove the entry)")
    # the index is small (a row per document): read here and handed over in blocks, so every
    # CPU can hold a scorer (read tasks would wait for a CPU the actors hold)
    index = pq.read_table(documents).sort_by("start")
    blocks = max(1, min(index.num_rows, 4 * actors))
    size = -(-index.num_rows // blocks)
    dataset = ray.data.from_arrow([index.slice(i, size) for i in range(0, index.num_rows, size)])
    scored = dataset.map_batches(
        DocumentScorer, fn_constructor_args=(str(Path(model_dir).resolve()), str(entry),
                                             batch_windows),
        batch_size=64, batch_format="numpy", concurrency=actors, num_cpus=1)
    tables = [t for t in ray.get(scored.to_arrow_refs()) if t.num_rows]
    table = pa.concat_tables(tables).sort_by([("path", "ascending"), ("doc", "ascending")])
    path = out_dir / SCORES_FILE
    pq.write_table(table, path)
    return path
