"""The Spark ETL: lines → scan → tokenizer → token ids (in the executors) → chunks of the
token stream, per train/val split.

Everything that touches the corpus runs in Spark executors; the driver collects only per-file
statistics, the tokenizer's training sample (one joined text per batch) and the length and first
``data.halo_tokens`` tokens of each piece of the stream.

1. *read*: one row per line with its file and the start of its input split (``src``, ``block``), so
   huge files are split and read in parallel; markdown is stripped in the JVM.
2. *scan*: per-file lines, characters, NUL bytes (binary files), replaced invalid UTF-8, character
   set.
3. *tokenizer*: the character set (``char``) or a BPE trained on a sample Spark draws (``bpe``).
4. *encode*: ``mapInArrow`` batches through the tokenizer, a paragraph at a time; documents are
   joined by the end-of-document token; each input split becomes pieces of about ``PIECE_TOKENS``
   ids.
5. *chunk*: from the pieces' lengths the driver knows every piece's offset in the stream, and from
   their heads every piece's halo; each piece cuts its own chunks (at most ``data.chunk_tokens``
   tokens of one segment, with up to ``data.halo_tokens`` tokens after them) where it lies, and the
   driver knows the chunks' index by arithmetic (windows.py). Windows are cut when read (stream.py):
   the output holds each token about once, whatever the stride or the block size.
"""

from __future__ import annotations

import functools
import logging
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm.core.config import DataSettings, Settings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import timed
from raydp_llm.core.tokenizer import (
    CharTokenizer,
    IdsTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_json,
    train_bpe,
)
from raydp_llm.data import arrow_reader, contamination, curate, jsonl, windows
from raydp_llm.data.arrow_reader import NATIVE_ONLY
from raydp_llm.data.corpus import Corpus, decode, hadoop_literal, read_head, utf16
from raydp_llm.data.stream import CHUNK_SCHEMA as CHUNK_ARROW
from raydp_llm.data.stream import BlockChunks, ChunkIndex
from raydp_llm.engines import raydp_fixes
from raydp_llm.engines.spark import detached

log = logging.getLogger(__name__)

CHUNK_SCHEMA = "start long, tokens binary"
PIECE_TOKENS = 1 << 22  # an encoded row closes past ~4M ids, whatever the input split's size
PARAGRAPH_LINES = 1000  # lines encoded as one text at most

# Markdown → plain text, line by line in the JVM: **SPEAKER** lines, headings, emphasis, escapes,
# hard breaks.
_MARKDOWN_RULES = [
    (r"^\*\*(.+?)\*\* *$", "$1:"),
    (r"^#+ *", ""),
    (r"[*_]", ""),
    (r"\\(.)", "$1"),
    (r" +$", ""),
]


@dataclass
class EtlOutput:
    chunks: dict[str, DataFrame]  # per split: CHUNK_SCHEMA rows, tokens as raw `token_dtype` bytes
    index: dict[str, ChunkIndex]  # per split: the chunks, by arithmetic
    encoded: DataFrame  # the cached token stream the chunks are cut from
    tokenizer: Tokenizer
    manifest: dict
    phase_s: dict = field(default_factory=dict)
    documents: DataFrame | None = None  # src, doc, start, end, tokens, val: each document's place
    removed: DataFrame | None = None  # src, doc, bytes, reason, kept_src, kept_doc
    removed_sample: list[dict] = field(default_factory=list)  # a few removed documents per reason


def read_lines(spark: SparkSession, corpus: Corpus, data: DataSettings, s3: S3Options) -> DataFrame:
    """``src, block, text``: one row per line (text, ids, jsonl) or per row (Parquet's
    ``data.text_column``), as bytes, tagged with its file and the start of its input split. Spark's
    readers read local files and the URIs Hadoop knows (``.gz`` and ``.bz2`` decompressed);
    ``s3://`` objects and ``.zst`` files are read in the executors with pyarrow (``arrow_reader``).

    Lines stay bytes until the executors decode them (``decode``): Spark does not check UTF-8.
    """
    native_only = [f for f in corpus.files
                   if f.lower().endswith(NATIVE_ONLY) and not arrow_reader.reads(f)]
    if native_only:
        raise InputError(f"{native_only[0]}: Spark's Hadoop reads {NATIVE_ONLY[0]} files only with "
                         "its native library, which pip's pyspark lacks; decompress it, recompress "
                         "it as .gz or .bz2, or copy it to local disk or S3")
    ours = [(f, corpus.sizes.get(f)) for f in corpus.files if arrow_reader.reads(f)]
    sparks = [f for f in corpus.files if not arrow_reader.reads(f)]
    parts = ([spark_read(spark, sparks, data, corpus.name)] if sparks else []) + \
            ([arrow_reader.read_corpus(spark, ours, data, s3)] if ours else [])
    return functools.reduce(DataFrame.unionByName, parts)


def documents(lines: DataFrame, corpus: Corpus, data: DataSettings) -> DataFrame:
    """``src, block, raw``: what the ETL encodes, a line or a document per row, as bytes; JSON
    Lines are parsed (``raw`` is the ``data.text_column`` string) and each line's verdict kept
    (``bad``); markdown is stripped in the JVM."""
    if data.format == "jsonl":
        lines = jsonl.documents(lines, data.text_column)
    text = F.col("text")
    if corpus.markdown:
        text = text.cast("string")
        for pattern, replacement in _MARKDOWN_RULES:
            text = F.regexp_replace(text, pattern, replacement)
    verdicts = ["bad"] if data.format == "jsonl" else []
    return lines.select("src", "block", text.cast("binary").alias("raw"), *verdicts)


def spark_read(spark: SparkSession, files: list[str], data: DataSettings, name: str) -> DataFrame:
    """``src, block, text``: what Spark's own readers (text, Parquet) make of local files and Hadoop
    URIs."""
    if data.format == "parquet":
        df = spark.read.parquet(*map(hadoop_literal, files))
        if data.text_column not in df.columns:
            raise InputError(f"data.text_column={data.text_column}: no such column in {name}; its "
                             f"columns are {', '.join(df.columns)}")
        text = F.col(data.text_column)
    else:
        df = spark.read.text([hadoop_literal(f) for f in files])
        text = F.col("value")
    return df.select(F.input_file_name().alias("src"), F.input_file_block_start().alias("block"),
                     text.cast("binary").alias("text"))


def decode_column(raw: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A batch of lines as Arrow strings (nulls read as empty lines) and the invalid UTF-8 sequences
    replaced in each; valid batches (the usual case) are checked and converted in C++."""
    raw = pc.fill_null(raw, b"")
    try:
        return raw.cast(pa.string()), np.zeros(len(raw), np.int64)
    except pa.ArrowInvalid:
        texts, replaced = zip(*(decode(r) for r in raw.to_pylist()))
        return pa.array(texts, pa.string()), np.array(replaced, np.int64)


_COUNTS = ("lines", "chars", "nonblank", "nul_lines", "replaced", "ids", *jsonl.BAD_KINDS)
_SUMMED = ("chars", "nonblank", "nul_lines", "replaced", *jsonl.BAD_KINDS)  # by Arrow, per batch


def scan_files(lines: DataFrame, want_charset: bool, id_file: bool) -> dict[str, dict]:
    """Per-file statistics, computed in the executors: lines, characters (newlines included),
    non-blank characters, lines with NUL bytes, replaced invalid UTF-8 sequences, bad JSON lines by
    kind (jsonl), the character set (``char``) and, for id files, the id count and range and the
    first token that is not an integer."""

    def scan(batches):
        stats: dict[str, dict] = {}
        for batch in batches:
            _add_batch(stats, batch, want_charset, id_file)
        yield _stats_batch(stats)

    counts = ", ".join(f"{k} long" for k in _COUNTS)
    schema = f"src string, {counts}, min_id long, max_id long, bad string, charset string"
    files: dict[str, dict] = {}
    for row in lines.mapInArrow(scan, schema).collect():
        _merge_row(files.setdefault(row.src, _new_stats()), row)
    return files


def _new_stats() -> dict:
    return dict.fromkeys(_COUNTS, 0) | {"charset": set(), "min_id": None, "max_id": None,
                                        "bad": None}


def _add_batch(stats: dict[str, dict], batch: pa.RecordBatch, want_charset: bool,
               id_file: bool) -> None:
    """One Arrow batch of (src, raw) lines into the per-file ``stats`` (in an executor)."""
    texts, replaced = decode_column(batch.column("raw"))
    verdicts = pa.nulls(len(texts), pa.int8())  # none but in JSON Lines
    if "bad" in batch.schema.names:
        verdicts = batch.column("bad")
    table = pa.table({"src": batch.column("src"), "chars": pc.add(pc.utf8_length(texts), 1),
                      "nonblank": pc.utf8_length(pc.utf8_trim_whitespace(texts)),
                      "nul_lines": pc.cast(pc.match_substring(texts, "\x00"), pa.int64()),
                      "replaced": replaced}
                     | {kind: pc.cast(pc.equal(verdicts, code), pa.int64())
                        for kind, code in jsonl.BAD_KINDS.items()})
    sums = table.group_by("src").aggregate([(k, "sum") for k in _SUMMED] + [("chars", "count")])
    for row in sums.to_pylist():
        s = stats.setdefault(row["src"], _new_stats())
        s["lines"] += row["chars_count"]
        for k in _SUMMED:
            s[k] += row[f"{k}_sum"] or 0
    if not (want_charset or id_file):
        return
    for src, text in zip(batch.column("src").to_pylist(), texts.to_pylist()):
        if want_charset:
            stats[src]["charset"].update(text)
        elif text.strip():
            _scan_ids(text, stats[src])


def _stats_batch(stats: dict[str, dict]) -> pa.RecordBatch:
    """An executor's per-file statistics as one Arrow batch (the schema ``scan_files`` names)."""
    names = ("src",) + _COUNTS + ("min_id", "max_id", "bad", "charset")
    rows = {k: [] for k in names}
    for src, s in stats.items():
        for k in names[:-1]:
            rows[k].append(src if k == "src" else s[k])
        rows["charset"].append("".join(s["charset"]))
    return pa.RecordBatch.from_pydict(rows, schema=pa.schema(
        [("src", pa.string())] + [(k, pa.int64()) for k in _COUNTS + ("min_id", "max_id")]
        + [("bad", pa.string()), ("charset", pa.string())]))


def _merge_row(f: dict, row) -> None:
    """One executor's statistics of a file into the driver's total for it."""
    for k in _COUNTS:
        f[k] += getattr(row, k)
    f["charset"].update(row.charset)
    f["bad"] = f["bad"] or row.bad
    for k, pick in (("min_id", min), ("max_id", max)):
        if getattr(row, k) is not None:
            f[k] = getattr(row, k) if f[k] is None else pick(f[k], getattr(row, k))


def _scan_ids(text: str, s: dict) -> None:
    try:
        ids = np.array(text.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        s["bad"] = (
            s["bad"]
            or next(t for t in text.split() if not t.lstrip("-").isdigit() or len(t) > 18)[:40]
        )
        return
    s["ids"] += len(ids)
    s["min_id"] = int(ids.min()) if s["min_id"] is None else min(s["min_id"], int(ids.min()))
    s["max_id"] = int(ids.max()) if s["max_id"] is None else max(s["max_id"], int(ids.max()))


def id_vocab_size(files: dict[str, dict], vocab_size: int | None) -> int:
    """The vocabulary of an id corpus: ``data.vocab_size``, or the largest id + 1; bad ids are
    errors."""
    for src, f in sorted(files.items()):
        if f["bad"]:
            raise InputError(f"{src}: {f['bad']!r} is not an integer token id; id files hold "
                             "whitespace-separated integers (or set data.format=text)")
        if f["min_id"] is not None and f["min_id"] < 0:
            raise InputError(f"{src}: token id {f['min_id']} is negative; ids must lie in [0, "
                             "vocab_size)")
    largest = max((f["max_id"] for f in files.values() if f["max_id"] is not None), default=-1)
    if vocab_size is not None and largest >= vocab_size:
        src = next(
            s
            for s, f in sorted(files.items())
            if f["max_id"] is not None and f["max_id"] >= vocab_size
        )
        raise InputError(f"{src}: token id {largest} is out of range for "
                         f"data.vocab_size={vocab_size}; raise data.vocab_size or leave it null "
                         "(largest id + 1)")
    return vocab_size or largest + 1


def build_tokenizer(lines: DataFrame, files: dict[str, dict], data: DataSettings, tok_cfg,
                    seed: int) -> Tokenizer:
    """Id files: the ids as they are. ``char``: the corpus' character set (newline included).
    ``bpe``: loaded from ``tokenizer.path``, or trained on a sample of at most
    ``tokenizer.sample_mb`` MB that Spark draws."""
    if data.format == "ids":
        return IdsTokenizer(id_vocab_size(files, data.vocab_size))
    if tok_cfg.kind == "char":
        return CharTokenizer("\n" + "".join(set().union(*(f["charset"] for f in files.values()))))
    if tok_cfg.path:
        return load_tokenizer(tok_cfg.path)
    total = sum(f["chars"] for f in files.values())
    texts = sample_lines(lines, min(1.0, tok_cfg.sample_mb * 1e6 / max(total, 1)), seed)
    return train_bpe(
        (texts[i : i + 10_000] for i in range(0, len(texts), 10_000)), tok_cfg.vocab_size
    )


def sample_lines(lines: DataFrame, fraction: float, seed: int) -> list[str]:
    """A seeded Bernoulli sample of the lines (each with its newline), drawn in the executors; each
    batch's pick travels as one row, so Spark hands the driver a few hundred rows, not millions."""

    def pick(batches):
        for i, batch in enumerate(batches):
            first = batch.slice(0, 1).to_pylist()
            if not first:
                continue
            rng = np.random.default_rng(
                [seed, zlib.crc32(first[0]["src"].encode()), first[0]["block"], i]
            )
            chosen = pc.fill_null(batch.column("raw"), b"").filter(
                pa.array(rng.random(batch.num_rows) < fraction)
            )
            if len(chosen):
                yield pa.RecordBatch.from_pydict({"text": [b"\n".join(chosen.to_pylist()) + b"\n"]})

    blobs = lines.mapInArrow(pick, "text binary").collect()
    return [line + "\n" for r in blobs for line in decode(bytes(r.text))[0].split("\n")[:-1]]


PIECE_SCHEMA = pa.schema(
    [
        ("src", pa.string()),
        ("block", pa.int64()),
        ("part", pa.int64()),
        ("docs", pa.int64()),
        ("n", pa.int64()),
        ("tokens", pa.binary()),
        # the documents (``documents.document_keys``) whose tokens lie in the piece, in order, and
        # where: [start, end) within the piece (a document may go on in the next piece)
        ("doc", pa.list_(pa.int64())),
        ("doc_start", pa.list_(pa.int64())),
        ("doc_end", pa.list_(pa.int64())),
    ]
)


class Piece(NamedTuple):
    """A piece of the token stream as the driver sees it: where it comes from (file, input split,
    part), its length and documents, and its first ``halo_tokens`` tokens (the halo of the piece
    before it)."""

    src: str
    block: int
    part: int
    n: int
    docs: int
    head: bytes


class Encoder:
    """The encode step of one Spark task (``mapInArrow``): lines in, the stream's pieces out
    (``PIECE_SCHEMA``).

    Documents are joined by the end-of-document token: ``file`` puts one before each file,
    ``blank_line`` one at each run of blank lines (and before each file), ``line`` one before each
    non-empty line (and each Parquet row). Id files get no added token. Text is encoded a paragraph
    at a time (its lines joined, at most ``PARAGRAPH_LINES``), which BPE splits as it would the
    whole text; ``file`` keeps blank lines as newlines, ``line`` encodes each line alone without its
    newline. An input split's piece closes past ``PIECE_TOKENS`` ids. Each piece lists where its
    documents' tokens lie (the lines' ``doc`` keys; end-of-document tokens belong to none).
    """

    def __init__(self, tokenizer: Tokenizer, document_split: str):
        self.tokenizer_json, self.dtype, self.split = (
            tokenizer.to_json(),
            tokenizer.token_dtype,
            document_split,
        )

    def __call__(self, batches):
        self.tok = tokenizer_from_json(self.tokenizer_json)  # once per task, in the executor
        self.eod = np.array(
            [self.tok.eod_id] if self.tok.eod_id is not None else [], dtype=self.dtype
        )
        self.key = None
        for batch in batches:
            texts = decode_column(batch.column("raw"))[0].to_pylist()
            columns = (batch.column(c).to_pylist() for c in ("src", "block", "doc"))
            for src, block, doc, text in zip(*columns, texts):
                if (src, block) != self.key:
                    yield from self._close()
                    self._open(src, block)
                self._add(text, doc)
            if self.key is None:  # an empty batch before any line
                continue
            self._encode()
            if sum(map(len, self.encoded)) >= PIECE_TOKENS:
                yield self._piece()
                self.part, self.docs = self.part + 1, 0
        yield from self._close()

    def _open(self, src: str, block: int) -> None:
        """An input split starts (a file starts when its first split does: a document starts)."""
        self.key, self.part, self.docs, self.prev_blank = (src, block), 0, 0, True
        # the piece's texts to encode, each with its document key; (None, None) = an
        # end-of-document token
        self.items: list[tuple[str | None, int | None]] = []
        self.paragraph: list[str] = []
        self.encoded: list[np.ndarray] = []  # the piece's ids so far
        self.spans: list[list[int]] = []  # [doc, start, end] in the piece, in order
        self.length = 0  # tokens in self.encoded
        if block == 0 and self.split != "line":
            self._end_document()

    def _add(self, text: str, doc: int) -> None:
        blank = not text.strip()
        if self.split == "line":
            if not blank:
                self._end_document()
                self.items.append((text, doc))
        elif not blank:
            self.paragraph.append(text)
            self.paragraph_doc = doc
            if len(self.paragraph) == PARAGRAPH_LINES:
                self._end_paragraph()
        else:
            self._end_paragraph()
            if self.split == "file":
                self.items.append((text + "\n", doc))
            elif not self.prev_blank:
                self._end_document()
        self.prev_blank = blank

    def _end_document(self) -> None:
        self.items.append((None, None))
        self.docs += 1

    def _end_paragraph(self) -> None:
        if self.paragraph:
            self.items.append(("\n".join(self.paragraph) + "\n", self.paragraph_doc))
            self.paragraph.clear()

    def _encode(self) -> None:
        ids = iter(self.tok.encode_batch([t for t, _ in self.items if t is not None]))
        for text, doc in self.items:
            encoded = self.eod if text is None else next(ids)
            self.encoded.append(encoded)
            if doc is not None and self.spans and self.spans[-1][0] == doc:
                self.spans[-1][2] += len(encoded)
            elif doc is not None:
                self.spans.append([doc, self.length, self.length + len(encoded)])
            self.length += len(encoded)
        self.items.clear()

    def _piece(self) -> pa.RecordBatch:
        self._encode()
        ids = np.concatenate(self.encoded) if self.encoded else np.empty(0, self.dtype)
        spans = np.array(self.spans, np.int64).reshape(-1, 3).T.tolist()
        self.encoded, self.spans, self.length = [], [], 0
        src, block = self.key
        return pa.RecordBatch.from_pydict(
            {
                "src": [src],
                "block": [block],
                "part": [self.part],
                "docs": [self.docs],
                "n": [len(ids)],
                "tokens": [ids.tobytes()],
                "doc": [spans[0]],
                "doc_start": [spans[1]],
                "doc_end": [spans[2]],
            },
            schema=PIECE_SCHEMA,
        )

    def _close(self):
        """The last piece of the input split that ends, if one was open."""
        if self.key is not None:
            self._end_paragraph()
            yield self._piece()


def encode_lines(lines: DataFrame, tokenizer: Tokenizer, document_split: str) -> DataFrame:
    """``src, block, part, docs, n, tokens``: the stream's pieces, encoded in the executors
    (``Encoder``)."""
    return lines.mapInArrow(Encoder(tokenizer, document_split),
                            "src string, block long, part long, docs long, n long, tokens binary, "
                            "doc array<long>, doc_start array<long>, doc_end array<long>")


def cut_chunks(encoded: DataFrame, stream: Stream, name: str) -> DataFrame:
    """``start, tokens``: the chunks of split ``name``, sorted by start. Each piece cuts the chunks
    that start in it, in its executor, from its tokens and its halo (the tokens after it); a chunk's
    row holds its own tokens and up to ``halo`` tokens after them in its segment."""
    # plain values for the closure Spark ships to the executors (not the pieces' heads)
    placed, dtype, halo = stream.placed, stream.dtype, stream.halo
    segments, chunk_tokens = stream.segments_of, stream.data.chunk_tokens

    def cut(batches):
        for batch in batches:
            for src, block, part, raw in zip(
                *(batch.column(c).to_pylist() for c in ("src", "block", "part", "tokens"))
            ):
                offset, piece_halo = placed[(src, block, part)]
                ids = np.frombuffer(raw, dtype=dtype)
                local = np.concatenate([ids, np.frombuffer(piece_halo, dtype=dtype)])
                spans = windows.chunk_spans(offset, offset + len(ids), segments, chunk_tokens)
                chosen = [s for s in spans if s.split == name]
                if chosen:
                    yield pa.RecordBatch.from_pydict({
                        "start": [s.start for s in chosen],
                        "tokens": [local[s.start - offset:min(s.end + halo, s.seg_end) - offset]
                                   .tobytes() for s in chosen],
                    }, schema=CHUNK_ARROW)

    return encoded.mapInArrow(cut, CHUNK_SCHEMA)


def check_files(files: dict[str, dict], data: DataSettings, s3: S3Options) -> list[str]:
    """UTF-16 text, binary files and invalid UTF-8: errors, or the binary files to skip
    (``data.skip_binary``). A file with NUL bytes is looked at once more, on the driver: UTF-16 text
    has them too, and is named as such."""
    binary = sorted(src for src, f in files.items() if f["nul_lines"])
    for src in binary:
        encoding = utf16(read_head(src, s3))
        if encoding:
            raise InputError(f"{src} is {encoding} text: convert it to UTF-8 (iconv -f UTF-16 -t "
                             "UTF-8 FILE > FILE.txt) and point data.path at the converted file")
    if binary and not data.skip_binary:
        more = f"; {len(binary) - 1} more such files" if len(binary) > 1 else ""
        raise InputError(f"{binary[0]} looks binary (NUL bytes in {files[binary[0]]['nul_lines']} "
                         f"lines{more}): remove it from data.path or set data.skip_binary=true")
    for src in binary:
        log.warning("skipping binary file %s (NUL bytes)", src)
    bad = sorted(src for src, f in files.items() if f["replaced"] and src not in binary)
    if bad and data.strict_utf8:
        raise InputError(f"{bad[0]} has {files[bad[0]]['replaced']} invalid UTF-8 sequences: fix "
                         "its encoding or set data.strict_utf8=false to replace them")
    return binary


def check_json(read: DataFrame, files: dict[str, dict], data: DataSettings) -> None:
    """Bad JSON lines (``read``: the lines as read): with ``data.strict_json`` an error naming the
    first one's file and line, else a warning (``manifest.json`` counts them per file and kind)."""
    bad = json_counts(files)["files"]
    if not bad:
        return
    src = next(iter(bad))
    if data.strict_json:
        line, kind, head = jsonl.first_bad_line(read, src, data.text_column)
        what = jsonl.WHAT[kind].format(column=data.text_column)
        raise InputError(f"{src}: line {line} {what} ({head.decode(errors='replace')[:60]!r}); "
                         "fix it, or set data.strict_json=false to skip and count bad lines")
    log.warning("skipped %d bad JSON lines in %d files, first in %s (manifest.json counts them "
                "per file and kind; data.strict_json=true refuses them)", sum(bad.values()),
                len(bad), src)


def json_counts(files: dict[str, dict]) -> dict:
    """Bad JSON lines by kind, and per file (files with none left out)."""
    per_file = {src: sum(f[k] for k in jsonl.BAD_KINDS) for src, f in sorted(files.items())}
    return {kind: sum(f[kind] for f in files.values()) for kind in jsonl.BAD_KINDS} | {
        "files": {src: n for src, n in per_file.items() if n}}


class Phases:
    """Each phase's wall time into ``seconds``, and ``on_phase(name, seconds)`` told as it ends."""

    def __init__(self, on_phase: Callable[[str, float], None] | None):
        self.on_phase, self.seconds = on_phase, {}

    def run(self, name: str, work: Callable):
        with timed(self.seconds, name):
            result = work()
        if self.on_phase:
            self.on_phase(name, self.seconds[name])
        return result


@dataclass(frozen=True)
class EtlPlan:
    """What the ETL builds: the token stream of ``corpus`` in chunks, read and split as ``data``
    says, tokenized with ``tokenizer`` (settings, or a ``SavedTokenizer``), split with ``seed``;
    ``s3`` reaches ``s3://`` inputs. No window setting: windows are cut when read."""

    corpus: Corpus
    data: DataSettings
    tokenizer: object
    seed: int
    s3: S3Options = S3Options()

    @classmethod
    def of(cls, settings: Settings, corpus: Corpus, tokenizer: object = None) -> EtlPlan:
        """The plan a run's settings make (``tokenizer`` instead of ``settings.tokenizer``)."""
        return cls(corpus, settings.data, tokenizer or settings.tokenizer, settings.seed,
                   S3Options.of(settings.s3))


def run_etl(spark: SparkSession, plan: EtlPlan,
            on_phase: Callable[[str, float], None] | None = None) -> EtlOutput:
    """The whole ETL on ``spark``: read (and scan), curate, tokenizer, encode, contamination,
    chunks, manifest. Returns the chunk DataFrames (cut when written or handed to Ray), their index,
    the documents' places and the removed documents, and the manifest. ``on_phase(name,
    seconds)`` is called as each phase before the chunks ends."""
    phases, data = Phases(on_phase), plan.data
    lines, files, skipped = phases.run("read", lambda: read_and_scan(spark, plan))
    # a Parquet row or a JSON line is a document
    document_split = "line" if data.format in ("parquet", "jsonl") else data.document_split
    curated = phases.run(
        "curate", lambda: curate.curate(spark, lines, data, document_split, plan.seed))
    tokenizer = phases.run(
        "tokenizer",
        lambda: build_tokenizer(curated.lines, files, data, plan.tokenizer, plan.seed),
    )
    encoding = Encoding(tokenizer, document_split, data, plan.seed)
    encoded, stream = phases.run("encode", lambda: encoding.run(curated.lines))
    placed = encoding.placements(encoded, stream)
    if checks_contamination(data):
        found, overlapping = phases.run(
            "contamination", lambda: contamination.check(
                curated.lines, curated.documents, placed, data.decontaminate_ngram))
        curated.report["contamination"] = found | {"action": data.decontaminate}
        if data.decontaminate == "remove" and found["train_documents_overlapping"]:
            curated.drop("decontaminate", overlapping, "contamination")
            encoded.unpersist()
            placed.unpersist()
            encoded, stream = phases.run("encode again", lambda: encoding.run(curated.lines))
            placed = encoding.placements(encoded, stream)
    chunks = {name: cut_chunks(encoded, stream, name) for name in windows.SPLITS}
    manifest = build_manifest(plan.corpus, files, skipped, stream, tokenizer) | {
        "document_split": document_split, "curation": curated.report}
    return EtlOutput(chunks=chunks, index=stream.index, encoded=encoded, tokenizer=tokenizer,
                     manifest=manifest, phase_s=phases.seconds,
                     documents=placed, removed=curated.removed,
                     removed_sample=curated.sample())


def checks_contamination(data: DataSettings) -> bool:
    """The contamination check runs on text (not on id files) unless turned off."""
    return data.decontaminate != "off" and data.format != "ids"


@dataclass(frozen=True)
class Encoding:
    """The encode step and what follows from it: the pieces (cached), the stream they make, the
    documents' places in it."""

    tokenizer: Tokenizer
    document_split: str
    data: DataSettings
    seed: int

    def run(self, lines: DataFrame) -> tuple[DataFrame, Stream]:
        encoded = encode_lines(lines, self.tokenizer, self.document_split).cache()
        head_bytes = self.data.halo_tokens * self.tokenizer.token_dtype.itemsize
        pieces = collect_pieces(encoded, head_bytes)
        return encoded, Stream(pieces, self.data, self.seed, self.tokenizer.token_dtype)

    @staticmethod
    def placements(encoded: DataFrame, stream: Stream) -> DataFrame:
        """Each document's place in the stream (cached: the check and the ETL output read it)."""
        return detached(contamination.placements(encoded, stream.placed, stream.segments_of))


def read_and_scan(spark: SparkSession,
                  plan: EtlPlan) -> tuple[DataFrame, dict[str, dict], list[str]]:
    """The lines (read again by each pass: cheaper than Spark's cache), each file's statistics, and
    the binary files skipped (``data.skip_binary``); one line for a corpus of nothing but
    whitespace."""
    corpus, data = plan.corpus, plan.data
    read = read_lines(spark, corpus, data, plan.s3)
    lines = documents(read, corpus, data)
    want_charset = plan.tokenizer.kind == "char" and data.format != "ids"
    files = scan_files(lines, want_charset=want_charset,
                       id_file=data.format == "ids")
    if data.format == "jsonl":
        check_json(read, files, data)
    skipped = check_files(files, data, plan.s3)
    if skipped:
        lines = lines.where(~F.col("src").isin(skipped))
        files = {k: v for k, v in files.items() if k not in skipped}
    if sum(f["nonblank"] for f in files.values()) == 0:
        raise InputError(f"data.path: the corpus {corpus.name} ({len(corpus.files)} files) holds "
                         "no text, only whitespace or nothing; point data.path at text files")
    return lines, files, skipped


def collect_pieces(encoded: DataFrame, head_bytes: int) -> list[Piece]:
    """Every piece's place, length, documents and first ``head_bytes``, in stream order (the only
    pass that brings anything of the corpus to the driver)."""
    heads = encoded.select(
        "src", "block", "part", "n", "docs", F.substring("tokens", 1, head_bytes).alias("head")
    )
    return sorted(
        Piece(r.src, r.block, r.part, r.n, r.docs, bytes(r.head)) for r in heads.collect()
    )


class Stream:
    """The token stream as the pieces make it: each piece's offset and halo (the ``halo`` tokens
    after it), the train/validation segments, and each split's chunks (``index``), by arithmetic."""

    def __init__(self, pieces: list[Piece], data: DataSettings, seed: int, dtype: np.dtype):
        self.pieces, self.data, self.seed, self.dtype = pieces, data, seed, dtype
        self.halo = data.halo_tokens
        self.n_tokens = sum(p.n for p in pieces)
        offsets = np.concatenate(
            [[0], np.cumsum([p.n for p in pieces], dtype=np.int64)[:-1]]
        ).tolist()
        halos = windows.halos([np.frombuffer(p.head, dtype) for p in pieces], self.halo)
        self.placed = {(p.src, p.block, p.part): (offset, halo.tobytes())
                       for p, offset, halo in zip(pieces, offsets, halos)}
        self.segments_of = functools.partial(
            windows.segments, n=self.n_tokens, split=data.split, val_fraction=data.val_fraction,
            seed=seed, segment_tokens=data.segment_tokens)
        rows = {name: [] for name in windows.SPLITS}
        for p, offset in zip(pieces, offsets):
            for s in windows.chunk_spans(offset, offset + p.n, self.segments_of, data.chunk_tokens):
                rows[s.split].append((s.start, s.end - s.start, s.seg_start, s.seg_end))
        self.index = {name: ChunkIndex.of(r) for name, r in rows.items()}

    def segments(self):
        return self.segments_of(0, self.n_tokens)

    def stored_tokens(self) -> int:
        """Tokens the chunks hold, halos included."""
        total = 0
        for index in self.index.values():
            ends = index.start + index.n
            total += int(np.minimum(ends + self.halo, index.seg_end).sum() - index.start.sum())
        return total


def build_manifest(corpus: Corpus, files: dict[str, dict], skipped: list[str], stream: Stream,
                   tokenizer: Tokenizer) -> dict:
    """What the ETL made, for ``manifest.json``: the inputs, the text, the tokens, the chunks, the
    settings."""
    n, d = stream.n_tokens, stream.data
    tokens_val = stream.index["val"].tokens()
    characters = sum(f["chars"] for f in files.values())
    stored = stream.stored_tokens() * tokenizer.token_dtype.itemsize
    json_lines = {"bad_json_lines": json_counts(files)} if d.format == "jsonl" else {}
    return json_lines | {
        "corpus": corpus.name,
        "files": len(files),
        "skipped_binary_files": skipped,
        "documents": sum(p.docs for p in stream.pieces),
        "bytes": sum(corpus.size_of(src) or 0 for src in files) if corpus.sizes else None,
        "characters": characters,
        "invalid_utf8_replaced": sum(f["replaced"] for f in files.values()),
        "tokens": n,
        "tokens_train": n - tokens_val,
        "tokens_val": tokens_val,
        "chars_per_token": characters / n if tokenizer.kind != "ids" else None,
        "chunks_train": len(stream.index["train"]),
        "chunks_val": len(stream.index["val"]),
        "chunk_tokens": d.chunk_tokens,
        "halo_tokens": d.halo_tokens,
        "token_bytes_stored": stored,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.kind,
        "tokenizer_hash": tokenizer.fingerprint,
        "token_dtype": tokenizer.token_dtype.name,
        "split": d.split,
        "val_fraction": d.val_fraction,
        "format": d.format,
        "seed": stream.seed,
        "inputs": corpus.fingerprints,
    }


def sorted_chunks(df: DataFrame, chunks: int, per_partition: int) -> DataFrame:
    """The chunk rows sorted by start, ``per_partition`` chunks to a partition (a Ray block, or a
    Parquet file), partitions in stream order."""
    parts = max(1, math.ceil(chunks / per_partition))
    return df.repartitionByRange(parts, "start").sortWithinPartitions("start")


def check_chunk_count(name: str, count: int, index: ChunkIndex) -> None:
    """Spark's output against the chunk arithmetic: a mismatch is a bug, never silently trained
    on."""
    if count != len(index):
        raise RuntimeError(f"chunk count mismatch in {name}: Spark cut {count}, the arithmetic "
                           f"says {len(index)}")


def to_object_store(out: EtlOutput) -> dict[str, BlockChunks]:
    """Hand the chunks to Ray (``ray.data.from_spark``, a block per chunk), then release Spark's
    cached copy. The blocks are materialized in the object store, owned by this driver, so they
    outlive Spark; each worker later fetches only the blocks of its own chunks."""
    import ray.data
    from raydp.spark import release_spark_recoverable

    raydp_fixes.install()
    sources = {}
    for name, df in out.chunks.items():
        df = sorted_chunks(df, len(out.index[name]), per_partition=1)
        dataset = ray.data.from_spark(df).materialize()
        release_spark_recoverable(df)
        check_chunk_count(name, dataset.count(), out.index[name])
        sources[name] = BlockChunks(dataset.to_arrow_refs(), out.index[name])
    out.encoded.unpersist()
    return sources
