"""The ETL step for a test, and readers of what the ETL made: the windows cut from Spark's chunk
rows (``cut_windows``), the token stream put together from a cache entry (``stream_of``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def prepare(settings, corpus, out_dir: Path, to_ray: bool, store: Path | None):
    """The ETL step (``data.prepare.prepared``) for a test that needs no Spark kept up after it."""
    from raydp_llm.data.prepare import prepared

    with prepared(settings, corpus, out_dir, to_ray=to_ray, store=store) as data:
        return data


class Rows:
    """Chunk rows collected from Spark, as a chunk source."""

    def __init__(self, df):
        self.rows = {r.start: bytes(r.tokens) for r in df.collect()}

    def fetch(self, c, start):
        return self.rows[start]


def cut_windows(out) -> dict[str, list[tuple[int, bytes]]]:
    """Every window of each split, cut from the chunks Spark made, as (start, bytes). ``out``: a
    ``run_etl`` result with the run's settings as ``out.settings`` (test_etl's ``etl``)."""
    from raydp_llm.data.stream import ChunkReader, EpochOrder
    from raydp_llm.training.spec import samplings

    cut, got = samplings(out.settings), {}
    for name, df in out.chunks.items():
        index = out.index[name]
        order = EpochOrder(index, cut[name], seed=0, epoch=None)
        positions = np.arange(order.total)
        cut_here = ChunkReader(Rows(df), index, out.manifest.token_dtype, 2)
        got[name] = sorted(zip(order.window_starts(positions).tolist(),
                               (w.tobytes() for w in cut_here.windows(order, positions))))
    return got


def stream_of(entry: Path, dtype: str) -> np.ndarray:
    """The whole token stream, put together from the chunks the ETL stored (halos dropped)."""
    import pyarrow.parquet as pq

    from raydp_llm.data.stream import read_index

    index = read_index(entry)
    parts = {}
    for split in ("train", "val"):
        own = dict(zip(index[split].start.tolist(), index[split].n.tolist()))
        table = pq.read_table(entry / split)
        for start, tokens in zip(table.column("start").to_pylist(),
                                 table.column("tokens").to_pylist()):
            parts[start] = np.frombuffer(tokens, dtype)[:own[start]]
    return np.concatenate([parts[s] for s in sorted(parts)])


def every_token_scores(logits_of, ids: np.ndarray, splits: list[tuple[int, int]],
                       block: int) -> dict:
    """The mean cross-entropy, top-1 accuracy and count of the tokens predicted when every token
    of each ``[lo, hi)`` of ``ids`` but its first is predicted, computed here without the
    project's windows: ``block + 1``-token windows every ``block`` tokens, the last one shorter;
    ``logits_of`` maps (1, T) ids to (1, T, V) logits."""
    import torch

    nats, correct, count = 0.0, 0, 0
    for lo, hi in splits:
        for s in range(lo, hi - 1, block):
            w = torch.from_numpy(ids[s:min(s + block + 1, hi)].astype(np.int64))[None]
            with torch.no_grad():
                logits = logits_of(w[:, :-1])[0].float()
            nats += torch.nn.functional.cross_entropy(logits, w[0, 1:], reduction="sum").item()
            correct += int((logits.argmax(dim=-1) == w[0, 1:]).sum())
            count += w.shape[1] - 1
    return {"loss": nats / count, "accuracy": correct / count, "tokens": count}
