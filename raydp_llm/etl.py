"""The Spark ETL: documents → character vocabulary → token ids (in the executors) → windows → splits.

Everything heavy runs in Spark executors; the driver only collects the vocabulary and one length per
document. The stream is cut into chunks that Spark groups and windows in parallel (see windows.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm import windows
from raydp_llm.corpus import Corpus
from raydp_llm.errors import InputError
from raydp_llm.tokenizer import CharTokenizer

log = logging.getLogger(__name__)

WINDOW_SCHEMA = "split string, start long, tokens binary"

# Markdown → plain text, in the JVM: headings, **SPEAKER** lines, emphasis, escapes, hard breaks.
_MARKDOWN_RULES = [
    (r"(?m)^\*\*(.+?)\*\* *$", "$1:"),
    (r"(?m)^#+ *", ""),
    (r"[*_]", ""),
    (r"\\(.)", "$1"),
    (r"(?m) +$", ""),
]


@dataclass
class EtlOutput:
    train: DataFrame  # WINDOW_SCHEMA rows, tokens = (block_size + 1) ids as raw `token_dtype` bytes
    val: DataFrame
    tokenizer: CharTokenizer
    manifest: dict
    phase_s: dict = field(default_factory=dict)


def read_documents(spark: SparkSession, corpus: Corpus) -> DataFrame:
    """One row per file: ``doc`` (its index in the corpus order) and ``text`` (joined by a blank line)."""
    df = spark.read.text(corpus.files, wholetext=True).withColumn("path", F.input_file_name())
    text = F.col("value")
    if corpus.markdown:
        for pattern, replacement in _MARKDOWN_RULES:
            text = F.regexp_replace(text, pattern, replacement)
    text = F.concat(F.regexp_replace(text, r"\s+$", ""), F.lit("\n\n"))
    order = spark.createDataFrame(
        [(i, Path(f).as_uri()) for i, f in enumerate(corpus.files)], "doc long, path string")
    return df.select("path", text.alias("text")).join(F.broadcast(order), "path").select("doc", "text")


def build_char_vocab(docs: DataFrame) -> str:
    """The sorted distinct characters of all documents; each partition reduces to a set in its executor."""
    sets = docs.select("text").rdd.mapPartitions(lambda rows: ["".join(set("".join(r.text for r in rows)))])
    return "".join(sorted(set("".join(sets.collect()))))


def encode_documents(docs: DataFrame, tokenizer: CharTokenizer) -> DataFrame:
    """``doc, n, tokens``: each document's ids as raw bytes, encoded in the executors in Arrow batches."""

    def encode(batches):
        for batch in batches:
            ids = [tokenizer.encode(t) for t in batch.column("text").to_pylist()]
            yield pa.RecordBatch.from_pydict({
                "doc": batch.column("doc"),
                "n": pa.array([len(a) for a in ids], pa.int64()),
                "tokens": pa.array([a.tobytes() for a in ids], pa.binary()),
            })

    return docs.mapInArrow(encode, "doc long, n long, tokens binary")


def cut_all_windows(encoded: DataFrame, offsets: dict[int, int], n_tokens: int, boundary: int,
                    block_size: int, stride: int, chunk: int, dtype: np.dtype) -> DataFrame:
    """Every window of both splits, as WINDOW_SCHEMA rows; chunks of the stream are windowed in parallel."""
    halo = block_size
    segments = [("train", 0, boundary), ("val", boundary, n_tokens)]

    def to_pieces(batches):  # each document's tokens → the chunks that need them
        for batch in batches:
            rows = {"chunk": [], "offset": [], "tokens": []}
            for doc, raw in zip(batch.column("doc").to_pylist(), batch.column("tokens").to_pylist()):
                ids = np.frombuffer(raw, dtype=dtype)
                start = offsets[doc]
                for k in windows.chunks_of_span(start, len(ids), chunk, halo):
                    lo, hi = max(start, k * chunk), min(start + len(ids), (k + 1) * chunk + halo)
                    rows["chunk"].append(k)
                    rows["offset"].append(lo)
                    rows["tokens"].append(ids[lo - start:hi - start].tobytes())
            yield pa.RecordBatch.from_pydict(rows, schema=pa.schema(
                [("chunk", pa.int64()), ("offset", pa.int64()), ("tokens", pa.binary())]))

    def to_windows(pdf):  # one chunk's pieces → the windows that start in it
        import pandas as pd

        pdf = pdf.sort_values("offset")
        k = int(pdf["chunk"].iloc[0])
        stream = np.frombuffer(b"".join(pdf["tokens"]), dtype=dtype)
        first = int(pdf["offset"].iloc[0])
        out = []
        for name, seg_start, seg_end in segments:
            starts = windows.window_starts(seg_start, seg_end, k * chunk, (k + 1) * chunk, block_size, stride)
            if len(starts):
                cut = windows.cut_windows(stream, first, starts, block_size)
                out.append(pd.DataFrame({"split": name, "start": starts, "tokens": [w.tobytes() for w in cut]}))
        return pd.concat(out) if out else pd.DataFrame({"split": [], "start": [], "tokens": []})

    pieces = encoded.mapInArrow(to_pieces, "chunk long, offset long, tokens binary")
    return pieces.groupBy("chunk").applyInPandas(to_windows, WINDOW_SCHEMA)


def run_etl(spark: SparkSession, corpus: Corpus, block_size: int, stride: int | None, val_fraction: float,
            seed: int, parallelism: int) -> EtlOutput:
    """Run the whole ETL on ``spark``; returns the cached window DataFrames and the manifest.

    ``stride`` (default ``block_size``) is the distance between window starts; ``parallelism`` the
    number of Spark tasks to aim for.
    """
    stride = stride or block_size
    phase_s: dict[str, float] = {}
    t = time.perf_counter()

    docs = read_documents(spark, corpus).repartition(max(1, min(parallelism, len(corpus.files))), "doc").cache()
    chars = build_char_vocab(docs)
    phase_s["read_and_vocab"] = time.perf_counter() - t
    if not chars.strip():
        raise InputError(f"corpus {corpus.name}: no text found in {len(corpus.files)} file(s); give a non-empty corpus")
    tokenizer = CharTokenizer(chars)

    t = time.perf_counter()
    encoded = encode_documents(docs, tokenizer).cache()
    lengths = sorted((r.doc, r.n) for r in encoded.select("doc", "n").collect())
    docs.unpersist()
    phase_s["encode"] = time.perf_counter() - t

    offsets, n_tokens = {}, 0
    for doc, n in lengths:
        offsets[doc], n_tokens = n_tokens, n_tokens + n
    boundary = windows.split_boundary(n_tokens, val_fraction)
    n_train = windows.count_windows(0, boundary, block_size, stride)
    n_val = windows.count_windows(boundary, n_tokens, block_size, stride)
    if n_train == 0 or n_val == 0:
        needed = math.ceil((block_size + 1) / min(val_fraction, 1 - val_fraction))
        raise InputError(
            f"corpus {corpus.name}: {n_tokens} tokens give {n_train} training and {n_val} validation windows of "
            f"{block_size + 1} tokens; need at least {needed} tokens: use a larger corpus or a smaller block_size")

    t = time.perf_counter()
    chunk = max(block_size + 1, math.ceil(n_tokens / (parallelism * 4)))
    all_windows = cut_all_windows(encoded, offsets, n_tokens, boundary, block_size, stride, chunk,
                                  tokenizer.token_dtype)
    # A seeded global shuffle of the training windows (Spark sorts by a hash), so that training reads them
    # in random order; validation keeps stream order.
    train = all_windows.where("split = 'train'").orderBy(F.hash("start", F.lit(seed))).cache()
    val = all_windows.where("split = 'val'").orderBy("start").cache()
    counted = {"train": train.count(), "val": val.count()}
    encoded.unpersist()
    phase_s["window"] = time.perf_counter() - t
    if counted != {"train": n_train, "val": n_val}:
        raise RuntimeError(f"window count mismatch: Spark cut {counted}, expected train={n_train} val={n_val}")

    manifest = {
        "corpus": corpus.name,
        "documents": len(corpus.files),
        "characters": n_tokens,  # char tokenizer: one token per character
        "tokens": n_tokens,
        "tokens_train": boundary,
        "tokens_val": n_tokens - boundary,
        "windows_train": n_train,
        "windows_val": n_val,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.kind,
        "token_dtype": tokenizer.token_dtype.name,
        "block_size": block_size,
        "stride": stride,
        "val_fraction": val_fraction,
        "seed": seed,
    }
    return EtlOutput(train=train, val=val, tokenizer=tokenizer, manifest=manifest, phase_s=phase_s)


def to_ray_datasets(out: EtlOutput) -> dict:
    """Hand the windows to Ray (``ray.data.from_spark``), then release Spark's cached copy.

    The Ray datasets are materialized in the object store, owned by this driver, so they outlive Spark.
    """
    import ray.data
    from raydp.spark import release_spark_recoverable

    datasets = {}
    for name, df in (("train", out.train), ("val", out.val)):
        datasets[name] = ray.data.from_spark(df).materialize()
        release_spark_recoverable(df)
        df.unpersist()
    return datasets


def write_parquet(out: EtlOutput, directory: Path) -> None:
    """Write the windows (``train/``, ``val/`` Parquet) and the tokenizer from the executors."""
    for name, df in (("train", out.train), ("val", out.val)):
        df.select("start", "tokens").write.mode("overwrite").parquet(str(directory / name))
    out.tokenizer.save(directory)
