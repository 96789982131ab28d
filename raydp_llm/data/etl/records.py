"""The records the ETL's stages hand one another, in one leaf: what the ETL is asked to build
(``EtlPlan``), what the read phase finds (``FileStats`` per file, ``Scanned``), what the encoder
makes (``Piece``, ``Encoded``), the stream's layout (``StreamLayout``), what the ETL made
(``Manifest``, as ``manifest.json`` holds it) and hands back (``EtlOutput``).

No other module of the ETL is imported here: every stage imports its records from this one, so no
stage needs another to name what it receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np
from pyspark.sql import DataFrame

from raydp_llm.core.config import DataSettings, Settings
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data import jsonl
from raydp_llm.data.chat.template import ChatTemplate, template_for
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.stream import ChunkIndex, RunWindows

# FileStats' counters, summed over the executors' rows (scan.py's schema holds them too)
FILE_COUNTS = ("lines", "chars", "nonblank", "nul_lines", "replaced", "ids", *jsonl.BAD_KINDS)
ID_RANGE = ("min_id", "max_id")


@dataclass(frozen=True)
class EtlPlan:
    """What the ETL builds: the token stream of ``corpus`` in chunks, read and split as ``data``
    says, tokenized with ``tokenizer`` (settings, or a ``SavedTokenizer``), split with ``seed``;
    ``s3`` reaches ``s3://`` inputs. No window setting: windows are cut when read, but for chat
    (``data.format=chat``), whose records are ``block_size + 1`` tokens, rendered with
    ``chat_template``."""

    corpus: Corpus
    data: DataSettings
    tokenizer: object
    seed: int
    s3: S3Options = S3Options()
    block_size: int | None = None
    chat_template: ChatTemplate | None = None  # data.format=chat: what renders the conversations

    @classmethod
    def of(cls, settings: Settings, corpus: Corpus, tokenizer: object = None) -> EtlPlan:
        """The plan a run's settings make (``tokenizer`` instead of ``settings.tokenizer``), its
        chat template resolved once (``chat.template_for``)."""
        tokenizer = tokenizer or settings.tokenizer
        template = template_for(settings.data, getattr(settings.model, "path", None), tokenizer)
        return cls(corpus, settings.data, tokenizer, settings.seed, S3Options.of(settings.s3),
                   getattr(settings.model, "block_size", None), template)


@dataclass
class FileStats:
    """One input file's statistics (``scan.scan_files``)."""

    lines: int = 0
    chars: int = 0  # newlines included
    nonblank: int = 0  # non-blank characters
    nul_lines: int = 0  # lines with NUL bytes: a binary file, or UTF-16 text
    replaced: int = 0  # invalid UTF-8 sequences, replaced
    ids: int = 0  # id files: the token ids
    # JSON Lines: bad lines by kind (the kinds of ``jsonl.BAD_KINDS``)
    not_json: int = 0
    no_field: int = 0
    not_string: int = 0
    charset: set[str] = field(default_factory=set)  # the characters (``char`` tokenizer)
    min_id: int | None = None  # id files: the range of the ids
    max_id: int | None = None
    bad: str | None = None  # id files: the first token that is not an integer

    def bad_json_lines(self) -> int:
        return sum(getattr(self, kind) for kind in jsonl.BAD_KINDS)

    def add_ids(self, text: str) -> None:
        """One line of an id file."""
        try:
            ids = np.array(text.split(), dtype=np.int64)
        except (ValueError, OverflowError):
            self.bad = self.bad or next(
                t for t in text.split() if not t.lstrip("-").isdigit() or len(t) > 18)[:40]
            return
        self.ids += len(ids)
        self._widen(int(ids.min()), int(ids.max()))

    def merge(self, row) -> None:
        """One executor's statistics of this file (a row of scan.py's schema) into the driver's."""
        for k in FILE_COUNTS:
            setattr(self, k, getattr(self, k) + getattr(row, k))
        self.charset.update(row.charset)
        self.bad = self.bad or row.bad
        if row.min_id is not None:
            self._widen(row.min_id, row.max_id)

    def _widen(self, low: int, high: int) -> None:
        self.min_id = low if self.min_id is None else min(self.min_id, low)
        self.max_id = high if self.max_id is None else max(self.max_id, high)


@dataclass
class Scanned:
    """What the read phase hands on."""

    lines: DataFrame  # src, block, raw: read again by each pass (cheaper than Spark's cache)
    files: dict[str, FileStats]  # per file, the binary files skipped left out
    skipped: list[str]  # the binary files skipped (data.skip_binary)


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


@dataclass
class StreamLayout:
    """The token stream as the pieces make it (``chunks.lay_out``): each piece's offset and halo
    (the ``halo`` tokens after it), the train/validation segments, and each split's chunks
    (``index``), by arithmetic."""

    pieces: list[Piece]
    data: DataSettings
    seed: int
    dtype: np.dtype  # the stored token: the tokenizer's, or chat's flagged word
    halo: int  # data.halo_tokens
    n_tokens: int
    placed: dict[tuple[str, int, int], tuple[int, bytes]]  # (src, block, part): offset, halo
    segments_of: Callable  # (start, end) → the segments of that span of the stream
    index: dict[str, ChunkIndex]  # per split: the chunks

    def stored_tokens(self) -> int:
        """Tokens the chunks hold, halos included."""
        total = 0
        for index in self.index.values():
            ends = index.start + index.n
            total += int(np.minimum(ends + self.halo, index.seg_end).sum() - index.start.sum())
        return total


@dataclass
class Encoded:
    """The encode step's output: the pieces (cached), the stream they make, each document's place
    in it (cached: the contamination check and the ETL's output read it)."""

    pieces: DataFrame
    layout: StreamLayout
    placed: DataFrame

    def unpersist(self) -> None:
        self.pieces.unpersist()
        self.placed.unpersist()


@dataclass
class Manifest:
    """What the ETL made, as ``manifest.json`` holds it: the inputs, the text, the tokens, the
    chunks, the settings (``manifest.build_manifest``). The JSON's keys are the fields, in this
    order (``to_json``)."""

    corpus: str  # its name
    files: int  # read (the binary files skipped left out)
    skipped_binary_files: list[str]
    documents: int
    bytes: int | None  # of the files read; None when a file's size is unknown (hdfs://), queries
    characters: int  # newlines included
    invalid_utf8_replaced: int
    tokens: int
    tokens_train: int
    tokens_val: int
    chars_per_token: float | None  # None for id files
    chunks_train: int
    chunks_val: int
    chunk_tokens: int
    halo_tokens: int
    token_bytes_stored: int  # the chunks' tokens, halos included
    vocab_size: int
    tokenizer: str  # its kind
    tokenizer_hash: str
    token_dtype: str
    split: str  # data.split: tail or hash
    val_fraction: float
    format: str
    seed: int
    inputs: list[dict]  # the corpus' fingerprints: path, size, mtime_ns per file
    document_split: str  # as the encoder cut documents (line for Parquet and JSON Lines)
    curation: dict  # what curation removed and found, stage by stage
    etl_key: str | None = None  # the ETL cache key (prepare.py): the inputs and settings read
    bad_json_lines: dict | None = None  # JSON Lines: by kind and per file; first in the JSON
    chat: dict | None = None  # data.format=chat: template, settings, counts; before etl_key
    table: dict | None = None  # data.table's snapshot (data/inputs/tables.py); before etl_key

    def to_json(self) -> dict:
        """The manifest as ``manifest.json`` holds it: keys in field order, the optional ones
        (``bad_json_lines`` first, ``chat``, ``table`` then ``etl_key`` last) only when set."""
        fields = asdict(self)
        bad_json_lines, etl_key = fields.pop("bad_json_lines"), fields.pop("etl_key")
        chat, table = fields.pop("chat"), fields.pop("table")
        head = {} if bad_json_lines is None else {"bad_json_lines": bad_json_lines}
        tail = {} if chat is None else {"chat": chat}
        tail |= {} if table is None else {"table": table}
        tail |= {} if etl_key is None else {"etl_key": etl_key}
        return head | fields | tail

    @classmethod
    def from_json(cls, content: dict) -> Manifest:
        """The ETL's manifest from ``manifest.json`` (a run's adds its windows: left out here;
        any other key is not the ETL's, and fails as before)."""
        return cls(**{k: v for k, v in content.items() if k not in RunWindows.KEYS})

    def chunks(self, split: str) -> int:
        """The chunks of ``split`` (train or val)."""
        return {"train": self.chunks_train, "val": self.chunks_val}[split]


@dataclass
class EtlOutput:
    """What ``run_etl`` hands back: the chunks (cut when written or handed to Ray), their index, the
    tokenizer, the manifest, the documents' places and the removed documents."""

    chunks: dict[str, DataFrame]  # per split: CHUNK_SCHEMA rows, tokens as raw `token_dtype` bytes
    index: dict[str, ChunkIndex]  # per split: the chunks, by arithmetic
    encoded: DataFrame  # the cached token stream the chunks are cut from
    tokenizer: Tokenizer
    manifest: Manifest  # manifest.json (Manifest.to_json)
    phase_s: dict = field(default_factory=dict)
    documents: DataFrame | None = None  # src, doc, start, end, tokens, val: each document's place
    removed: DataFrame | None = None  # src, doc, bytes, reason, kept_src, kept_doc
    removed_sample: list[dict] = field(default_factory=list)  # a few removed documents per reason
