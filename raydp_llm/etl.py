"""The Spark ETL: lines → scan → tokenizer → token ids (in the executors) → windows → train/val splits.

Everything that touches the corpus runs in Spark executors; the driver collects only per-file statistics,
the tokenizer's training sample and one length per piece of the stream.

1. *read*: one row per line with its file and the start of its input split (``src``, ``block``), so
   huge files are split and read in parallel; markdown is stripped in the JVM.
2. *scan*: per-file lines, characters, NUL bytes (binary files), replaced invalid UTF-8, character set.
3. *tokenizer*: the character set (``char``) or a BPE trained on a sample Spark draws (``bpe``).
4. *encode*: ``mapInArrow`` batches through the tokenizer; documents are joined by the end-of-document
   token; each input split becomes pieces of at most ``PIECE_TOKENS`` ids.
5. *window*: from the pieces' lengths the driver knows every piece's offset in the stream; pieces go to
   the chunks that need them and Spark cuts each chunk's windows in parallel (see windows.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from omegaconf import DictConfig
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm import raydp_fixes, windows
from raydp_llm.corpus import Corpus
from raydp_llm.errors import InputError
from raydp_llm.tokenizer import (
    CharTokenizer,
    IdsTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_json,
    train_bpe,
)

log = logging.getLogger(__name__)

WINDOW_SCHEMA = "split string, start long, tokens binary"
PIECE_TOKENS = 1 << 22  # at most ~4M ids per encoded row, whatever the input split's size
REPLACEMENT = "\ufffd"  # what invalid UTF-8 sequences are decoded to

# Markdown → plain text, line by line in the JVM: **SPEAKER** lines, headings, emphasis, escapes, hard breaks.
_MARKDOWN_RULES = [
    (r"^\*\*(.+?)\*\* *$", "$1:"),
    (r"^#+ *", ""),
    (r"[*_]", ""),
    (r"\\(.)", "$1"),
    (r" +$", ""),
]


@dataclass
class EtlOutput:
    train: DataFrame  # WINDOW_SCHEMA rows, tokens = (block_size + 1) ids as raw `token_dtype` bytes
    val: DataFrame
    tokenizer: Tokenizer
    manifest: dict
    phase_s: dict = field(default_factory=dict)


def read_lines(spark: SparkSession, corpus: Corpus, data: DictConfig) -> DataFrame:
    """``src, block, raw``: one row per line (text, ids) or per row (Parquet's ``data.text_column``), as bytes,
    tagged with its file and the start of its input split.

    Lines stay bytes until the executors decode them (``decode``): Spark does not check UTF-8.
    """
    if data.format == "parquet":
        df = spark.read.parquet(*corpus.files)
        if data.text_column not in df.columns:
            raise InputError(f"data.text_column={data.text_column}: no such column in {corpus.name}; its columns "
                             f"are {', '.join(df.columns)}")
        text = F.col(data.text_column)
    else:
        df = spark.read.text(corpus.files)
        text = F.col("value")
    if corpus.markdown:
        for pattern, replacement in _MARKDOWN_RULES:
            text = F.regexp_replace(text, pattern, replacement)
    return df.select(F.input_file_name().alias("src"), F.input_file_block_start().alias("block"),
                     text.cast("binary").alias("raw"))


def decode(raw: bytes) -> tuple[str, int]:
    """A line's text and how many invalid UTF-8 sequences were replaced by U+FFFD."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        return text, text.count(REPLACEMENT) - raw.count(REPLACEMENT.encode())


_COUNTS = ("lines", "chars", "nonblank", "nul_lines", "replaced", "ids")


def scan_files(lines: DataFrame, want_charset: bool, id_file: bool) -> dict[str, dict]:
    """Per-file statistics, computed in the executors: lines, characters (newlines included), non-blank
    characters, lines with NUL bytes, replaced invalid UTF-8 sequences, the character set (``char``) and,
    for id files, the id count and range and the first token that is not an integer."""

    def new() -> dict:
        return dict.fromkeys(_COUNTS, 0) | {"charset": set(), "min_id": None, "max_id": None, "bad": None}

    def scan(batches):
        stats: dict[str, dict] = {}
        for batch in batches:
            for src, raw in zip(batch.column("src").to_pylist(), batch.column("raw").to_pylist()):
                text, replaced = decode(raw)
                s = stats.setdefault(src, new())
                s["lines"] += 1
                s["chars"] += len(text) + 1
                s["nonblank"] += len(text.strip())
                s["nul_lines"] += "\x00" in text
                s["replaced"] += replaced
                if want_charset:
                    s["charset"].update(text)
                if id_file and text.strip():
                    _scan_ids(text, s)
        names = ("src",) + _COUNTS + ("min_id", "max_id", "bad", "charset")
        rows = {k: [] for k in names}
        for src, s in stats.items():
            for k in names[:-1]:
                rows[k].append(src if k == "src" else s[k])
            rows["charset"].append("".join(s["charset"]))
        yield pa.RecordBatch.from_pydict(rows, schema=pa.schema(
            [("src", pa.string())] + [(k, pa.int64()) for k in _COUNTS + ("min_id", "max_id")]
            + [("bad", pa.string()), ("charset", pa.string())]))

    schema = f"src string, {', '.join(f'{k} long' for k in _COUNTS)}, min_id long, max_id long, bad string, " \
             "charset string"
    files: dict[str, dict] = {}
    for row in lines.mapInArrow(scan, schema).collect():
        f = files.setdefault(row.src, new())
        for k in _COUNTS:
            f[k] += getattr(row, k)
        f["charset"].update(row.charset)
        f["bad"] = f["bad"] or row.bad
        for k, pick in (("min_id", min), ("max_id", max)):
            if getattr(row, k) is not None:
                f[k] = getattr(row, k) if f[k] is None else pick(f[k], getattr(row, k))
    return files


def _scan_ids(text: str, s: dict) -> None:
    try:
        ids = np.array(text.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        s["bad"] = s["bad"] or next(t for t in text.split() if not t.lstrip("-").isdigit() or len(t) > 18)[:40]
        return
    s["ids"] += len(ids)
    s["min_id"] = int(ids.min()) if s["min_id"] is None else min(s["min_id"], int(ids.min()))
    s["max_id"] = int(ids.max()) if s["max_id"] is None else max(s["max_id"], int(ids.max()))


def id_vocab_size(files: dict[str, dict], vocab_size: int | None) -> int:
    """The vocabulary of an id corpus: ``data.vocab_size``, or the largest id + 1; bad ids are errors."""
    for src, f in sorted(files.items()):
        if f["bad"]:
            raise InputError(f"{src}: {f['bad']!r} is not an integer token id; id files hold whitespace-separated "
                             "integers (or set data.format=text)")
        if f["min_id"] is not None and f["min_id"] < 0:
            raise InputError(f"{src}: token id {f['min_id']} is negative; ids must lie in [0, vocab_size)")
    largest = max((f["max_id"] for f in files.values() if f["max_id"] is not None), default=-1)
    if vocab_size is not None and largest >= vocab_size:
        src = next(s for s, f in sorted(files.items()) if f["max_id"] is not None and f["max_id"] >= vocab_size)
        raise InputError(f"{src}: token id {largest} is out of range for data.vocab_size={vocab_size}; raise "
                         "data.vocab_size or leave it null (largest id + 1)")
    return vocab_size or largest + 1


def build_tokenizer(lines: DataFrame, files: dict[str, dict], data: DictConfig, tok_cfg: DictConfig,
                    seed: int) -> Tokenizer:
    """Id files: the ids as they are. ``char``: the corpus' character set (newline included). ``bpe``: loaded
    from ``tokenizer.path``, or trained on a sample of at most ``tokenizer.sample_mb`` MB that Spark draws."""
    if data.format == "ids":
        return IdsTokenizer(id_vocab_size(files, data.vocab_size))
    if tok_cfg.kind == "char":
        return CharTokenizer("\n" + "".join(set().union(*(f["charset"] for f in files.values()))))
    if tok_cfg.path:
        return load_tokenizer(tok_cfg.path)
    total = sum(f["chars"] for f in files.values())
    fraction = min(1.0, tok_cfg.sample_mb * 1e6 / max(total, 1))
    sample = lines.select("raw").sample(fraction=fraction, seed=seed) if fraction < 1 else lines.select("raw")
    texts = [decode(r.raw)[0] + "\n" for r in sample.collect()]
    return train_bpe((texts[i:i + 10_000] for i in range(0, len(texts), 10_000)), tok_cfg.vocab_size)


def encode_lines(lines: DataFrame, tokenizer: Tokenizer, document_split: str) -> DataFrame:
    """``src, block, part, docs, n, tokens``: the stream's pieces, encoded in the executors.

    Documents are joined by the end-of-document token: ``file`` puts one before each file, ``blank_line``
    one at each run of blank lines (and before each file), ``line`` one before each non-empty line (and
    each Parquet row). Id files get no added token.
    """
    tok_json = tokenizer.to_json()
    dtype = tokenizer.token_dtype
    schema = pa.schema([("src", pa.string()), ("block", pa.int64()), ("part", pa.int64()), ("docs", pa.int64()),
                        ("n", pa.int64()), ("tokens", pa.binary())])

    def encode(batches):
        tok = tokenizer_from_json(tok_json)  # once per task
        eod = np.array([tok.eod_id] if tok.eod_id is not None else [], dtype=dtype)
        key, part, pieces, size, docs, prev_blank = None, 0, [], 0, 0, True

        def flush():
            ids = np.concatenate(pieces) if pieces else np.empty(0, dtype)
            return pa.RecordBatch.from_pydict({"src": [key[0]], "block": [key[1]], "part": [part], "docs": [docs],
                                               "n": [len(ids)], "tokens": [ids.tobytes()]}, schema=schema)

        for batch in batches:
            srcs, blocks = batch.column("src").to_pylist(), batch.column("block").to_pylist()
            texts = [decode(raw)[0] for raw in batch.column("raw").to_pylist()]
            blank = [not t.strip() for t in texts]
            keep = [document_split == "file" or not b for b in blank]  # lines that become tokens
            newline = "" if document_split == "line" else "\n"
            encoded = iter(tok.encode_batch([t + newline for t, k in zip(texts, keep) if k]))
            for src, block, is_blank, is_kept in zip(srcs, blocks, blank, keep):
                if (src, block) != key:
                    if key is not None:
                        yield flush()
                    key, part, pieces, size, docs, prev_blank = (src, block), 0, [], 0, 0, True
                    if block == 0 and document_split != "line":  # a file starts: a document starts
                        pieces.append(eod)
                        docs += 1
                if document_split == "blank_line" and is_blank and not prev_blank:
                    pieces.append(eod)
                    docs += 1
                elif document_split == "line" and is_kept:
                    pieces.append(eod)
                    docs += 1
                prev_blank = is_blank
                if is_kept:
                    ids = next(encoded)
                    pieces.append(ids)
                    size += len(ids)
                if size >= PIECE_TOKENS:
                    yield flush()
                    part, pieces, size, docs = part + 1, [], 0, 0
        if key is not None:
            yield flush()

    return lines.mapInArrow(encode, "src string, block long, part long, docs long, n long, tokens binary")


def cut_all_windows(encoded: DataFrame, offsets: dict[tuple, int], n_tokens: int, data: DictConfig, block_size: int,
                    stride: int, chunk: int, dtype: np.dtype, seed: int) -> DataFrame:
    """Every window of both splits, as WINDOW_SCHEMA rows; chunks of the stream are windowed in parallel."""
    halo = block_size
    seg = dict(n=n_tokens, split=data.split, val_fraction=data.val_fraction, seed=seed,
               segment_tokens=data.segment_tokens)

    def to_pieces(batches):  # each piece's tokens → the chunks that need them
        schema = pa.schema([("chunk", pa.int64()), ("offset", pa.int64()), ("tokens", pa.binary())])
        for batch in batches:
            rows = {"chunk": [], "offset": [], "tokens": []}
            for src, block, part, raw in zip(*(batch.column(c).to_pylist() for c in ("src", "block", "part",
                                                                                       "tokens"))):
                ids = np.frombuffer(raw, dtype=dtype)
                start = offsets[(src, block, part)]
                for k in windows.chunks_of_span(start, len(ids), chunk, halo):
                    lo, hi = max(start, k * chunk), min(start + len(ids), (k + 1) * chunk + halo)
                    rows["chunk"].append(k)
                    rows["offset"].append(lo)
                    rows["tokens"].append(ids[lo - start:hi - start].tobytes())
            yield pa.RecordBatch.from_pydict(rows, schema=schema)

    def to_windows(pdf):  # one chunk's pieces → the windows that start in it
        import pandas as pd

        pdf = pdf.sort_values("offset")
        k = int(pdf["chunk"].iloc[0])
        stream = np.frombuffer(b"".join(pdf["tokens"]), dtype=dtype)
        first = int(pdf["offset"].iloc[0])
        out = []
        for name, seg_start, seg_end in windows.segments(k * chunk, (k + 1) * chunk, **seg):
            starts = windows.window_starts(seg_start, seg_end, k * chunk, (k + 1) * chunk, block_size, stride)
            if len(starts):
                cut = windows.cut_windows(stream, first, starts, block_size)
                out.append(pd.DataFrame({"split": name, "start": starts, "tokens": [w.tobytes() for w in cut]}))
        return pd.concat(out) if out else pd.DataFrame({"split": [], "start": [], "tokens": []})

    pieces = encoded.mapInArrow(to_pieces, "chunk long, offset long, tokens binary")
    return pieces.groupBy("chunk").applyInPandas(to_windows, WINDOW_SCHEMA)


def count_windows(n_tokens: int, data: DictConfig, block_size: int, stride: int, seed: int) -> dict[str, int]:
    counts = {"train": 0, "val": 0}
    for name, lo, hi in windows.segments(0, n_tokens, n_tokens, data.split, data.val_fraction, seed,
                                         data.segment_tokens):
        counts[name] += windows.count_windows(lo, hi, block_size, stride)
    return counts


def check_files(files: dict[str, dict], data: DictConfig) -> list[str]:
    """Binary files and invalid UTF-8: errors, or the binary files to skip (``data.skip_binary``)."""
    binary = sorted(src for src, f in files.items() if f["nul_lines"])
    if binary and not data.skip_binary:
        raise InputError(f"{binary[0]} looks binary (NUL bytes in {files[binary[0]]['nul_lines']} lines"
                         f"{f'; {len(binary) - 1} more such files' if len(binary) > 1 else ''}): remove it from "
                         "data.path or set data.skip_binary=true")
    for src in binary:
        log.warning("skipping binary file %s (NUL bytes)", src)
    bad = sorted(src for src, f in files.items() if f["replaced"] and src not in binary)
    if bad and data.strict_utf8:
        raise InputError(f"{bad[0]} has {files[bad[0]]['replaced']} invalid UTF-8 sequences: fix its encoding "
                         "or set data.strict_utf8=false to replace them")
    return binary


def run_etl(spark: SparkSession, corpus: Corpus, data: DictConfig, tok_cfg: DictConfig, block_size: int,
            seed: int) -> EtlOutput:
    """Run the whole ETL on ``spark``; returns the cached window DataFrames and the manifest."""
    stride = data.stride or block_size
    phase_s: dict[str, float] = {}

    t = time.perf_counter()
    lines = read_lines(spark, corpus, data).cache()
    files = scan_files(lines, want_charset=tok_cfg.kind == "char" and data.format != "ids",
                       id_file=data.format == "ids")
    skipped = check_files(files, data)
    if skipped:
        lines = lines.where(~F.col("src").isin(skipped))
        files = {k: v for k, v in files.items() if k not in skipped}
    if sum(f["nonblank"] for f in files.values()) == 0:
        raise InputError(f"data.path: the corpus {corpus.name} ({len(corpus.files)} files) holds no text, only "
                         "whitespace or nothing; point data.path at text files")
    phase_s["read"] = time.perf_counter() - t

    t = time.perf_counter()
    tokenizer = build_tokenizer(lines, files, data, tok_cfg, seed)
    phase_s["tokenizer"] = time.perf_counter() - t

    t = time.perf_counter()
    document_split = "line" if data.format == "parquet" else data.document_split  # a row is a document
    encoded = encode_lines(lines, tokenizer, document_split).cache()
    pieces = sorted((r.src, r.block, r.part, r.n, r.docs) for r in encoded.select("src", "block", "part", "n", "docs")
                    .collect())
    lines.unpersist()
    phase_s["encode"] = time.perf_counter() - t

    offsets, n_tokens = {}, 0
    for src, block, part, n, _ in pieces:
        offsets[(src, block, part)], n_tokens = n_tokens, n_tokens + n
    expected = count_windows(n_tokens, data, block_size, stride, seed)
    if expected["train"] == 0 or expected["val"] == 0:
        needed = math.ceil((block_size + 1) / min(data.val_fraction, 1 - data.val_fraction))
        raise InputError(
            f"data.path: the corpus {corpus.name} has {n_tokens} tokens, giving {expected['train']} training and "
            f"{expected['val']} validation windows of {block_size + 1} tokens; at least {needed} tokens are needed:"
            " use a larger corpus or a smaller model.block_size")

    t = time.perf_counter()
    chunk = data.segment_tokens * max(1, math.ceil(n_tokens / (4 * spark.sparkContext.defaultParallelism)
                                                   / data.segment_tokens))
    all_windows = cut_all_windows(encoded, offsets, n_tokens, data, block_size, stride, chunk,
                                  tokenizer.token_dtype, seed).cache()  # cut once, for both splits
    # A seeded global shuffle of the training windows (Spark sorts by a hash), so that training reads them
    # in random order; validation keeps stream order.
    train = all_windows.where("split = 'train'").orderBy(F.hash("start", F.lit(seed))).cache()
    val = all_windows.where("split = 'val'").orderBy("start").cache()
    counted = {"train": train.count(), "val": val.count()}
    encoded.unpersist()
    all_windows.unpersist()
    phase_s["window"] = time.perf_counter() - t
    if counted != expected:
        raise RuntimeError(f"window count mismatch: Spark cut {counted}, the arithmetic says {expected}")

    tokens_val = sum(hi - lo for name, lo, hi in windows.segments(
        0, n_tokens, n_tokens, data.split, data.val_fraction, seed, data.segment_tokens) if name == "val")
    characters = sum(f["chars"] for f in files.values())
    manifest = {
        "corpus": corpus.name,
        "files": len(files),
        "skipped_binary_files": skipped,
        "documents": sum(p[4] for p in pieces),
        "bytes": sum(corpus.sizes.get(src, 0) for src in files) if corpus.sizes else None,
        "characters": characters,
        "invalid_utf8_replaced": sum(f["replaced"] for f in files.values()),
        "tokens": n_tokens,
        "tokens_train": n_tokens - tokens_val,
        "tokens_val": tokens_val,
        "chars_per_token": characters / n_tokens if tokenizer.kind != "ids" else None,
        "windows_train": counted["train"],
        "windows_val": counted["val"],
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.kind,
        "tokenizer_hash": tokenizer.fingerprint,
        "token_dtype": tokenizer.token_dtype.name,
        "block_size": block_size,
        "stride": stride,
        "split": data.split,
        "val_fraction": data.val_fraction,
        "document_split": document_split,
        "format": data.format,
        "seed": seed,
        "inputs": corpus.fingerprints,
    }
    return EtlOutput(train=train, val=val, tokenizer=tokenizer, manifest=manifest, phase_s=phase_s)


def to_ray_datasets(out: EtlOutput) -> dict:
    """Hand the windows to Ray (``ray.data.from_spark``), then release Spark's cached copy.

    The Ray datasets are materialized in the object store, owned by this driver, so they outlive Spark.
    """
    import ray.data
    from raydp.spark import release_spark_recoverable

    raydp_fixes.install()
    datasets = {}
    for name, df in (("train", out.train), ("val", out.val)):
        datasets[name] = ray.data.from_spark(df).materialize()
        release_spark_recoverable(df)
        df.unpersist()
    return datasets
