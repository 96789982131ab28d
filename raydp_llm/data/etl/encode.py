"""The ETL's *encode* stage: ``mapInArrow`` batches through the tokenizer, a paragraph at a time,
in the executors; documents are joined by the end-of-document token; each input split becomes
rows of at most ``PIECE_TOKENS`` ids. The driver collects only each piece's length, documents and
head (``records.Piece``), from which ``chunks.lay_out`` lays out the stream."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from raydp_llm.core.config import DataSettings
from raydp_llm.core.tokenizer import Tokenizer, tokenizer_from_json
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.chat.encode import encode_chat
from raydp_llm.data.etl.formats import reader_for
from raydp_llm.data.etl.records import Piece
from raydp_llm.data.etl.scan import decode_column
from raydp_llm.data.preference.encode import encode_pairs

PIECE_TOKENS = 1 << 22  # an encoded row closes past ~4M ids, whatever the input split's size
PARAGRAPH_LINES = 1000  # lines encoded as one text at most
WHOLE_DOCUMENT_LINES = 1 << 20  # Tokenizer.whole_documents: a document's lines as one text

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


class Encoder:
    """The encode step of one Spark task (``mapInArrow``): lines in, the stream's pieces out
    (``PIECE_SCHEMA``).

    Documents are joined by the end-of-document token: ``file`` puts one before each file,
    ``blank_line`` one at each run of blank lines (and before each file), ``line`` one before each
    non-empty line (and each Parquet row). Id files get no added token. Text is encoded a paragraph
    at a time (its lines joined, at most ``PARAGRAPH_LINES``), which BPE splits as it would the
    whole text; ``file`` keeps blank lines as newlines, ``line`` encodes each line alone without its
    newline. An input split's piece closes past ``PIECE_TOKENS`` ids, in rows of at most that many
    (a document may span rows). Each piece lists where its documents' tokens lie (the lines'
    ``doc`` keys; end-of-document tokens belong to none).
    """

    def __init__(self, tokenizer: Tokenizer, document_split: str):
        self.tokenizer_json, self.dtype = tokenizer.to_json(), tokenizer.token_dtype
        self.document_split = document_split

    def __call__(self, batches):
        self.tok = tokenizer_from_json(self.tokenizer_json)  # once per task, in the executor
        self.whole = self.tok.whole_documents  # a model's tokenizer: as AutoTokenizer sees them
        self.paragraph_lines = WHOLE_DOCUMENT_LINES if self.whole else PARAGRAPH_LINES
        self.eod = np.array(self.tok.separator(), dtype=self.dtype)
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
            if self.length >= PIECE_TOKENS:
                yield from self._pieces()
        yield from self._close()

    def _open(self, src: str, block: int) -> None:
        """An input split starts (a file starts when its first split does: a document starts)."""
        self.key, self.part, self.prev_blank = (src, block), 0, True
        # the piece's texts to encode, each with its document key; (None, None) = an
        # end-of-document token
        self.items: list[tuple[str | None, int | None]] = []
        self.paragraph: list[str] = []
        self.encoded: list[np.ndarray] = []  # the piece's ids so far
        self.spans: list[list[int]] = []  # [doc, start, end] in the piece, in order
        self.ends: list[int] = []  # where each end-of-document token lies in the piece
        self.length = 0  # tokens in self.encoded
        if block == 0 and self.document_split != "line":
            self._end_document()

    def _add(self, text: str, doc: int) -> None:
        blank = not text.strip()
        if self.document_split == "line":
            if not blank:
                self._end_document()
                self.items.append((text, doc))
        elif not blank or (self.whole and self.document_split == "file"):
            self.paragraph.append(text)
            self.paragraph_doc = doc
            if len(self.paragraph) == self.paragraph_lines:
                self._end_paragraph()
        else:
            self._end_paragraph()
            if self.document_split == "file":
                self.items.append((text + "\n", doc))
            elif not self.prev_blank:
                self._end_document()
        self.prev_blank = blank

    def _end_document(self) -> None:
        self.items.append((None, None))

    def _end_paragraph(self) -> None:
        if self.paragraph:
            self.items.append(("\n".join(self.paragraph) + "\n", self.paragraph_doc))
            self.paragraph.clear()

    def _encode(self) -> None:
        ids = iter(self.tok.encode_batch([t for t, _ in self.items if t is not None]))
        for text, doc in self.items:
            encoded = self.eod if text is None else next(ids)
            if text is None:
                self.ends.append(self.length)
            self.encoded.append(encoded)
            if doc is not None and self.spans and self.spans[-1][0] == doc:
                self.spans[-1][2] += len(encoded)
            elif doc is not None:
                self.spans.append([doc, self.length, self.length + len(encoded)])
            self.length += len(encoded)
        self.items.clear()

    def _pieces(self):
        """The piece so far, as rows of at most ``PIECE_TOKENS`` ids: one long line (a 50 MB
        document without a newline) must not make one row the size of the split, which a 1 GB
        executor heap cannot cache."""
        self._encode()
        ids = np.concatenate(self.encoded) if self.encoded else np.empty(0, self.dtype)
        ends, spans = np.array(self.ends, np.int64), np.array(self.spans, np.int64).reshape(-1, 3)
        cuts = list(range(0, len(ids), PIECE_TOKENS)) or [0]
        for lo in cuts:
            hi = lo + PIECE_TOKENS
            last = lo == cuts[-1]
            # what starts at the very end (an end-of-document token, an empty document) belongs
            # to the last row; a document's span is in each row it overlaps
            docs = int(((ends >= lo) & ((ends < hi) | last)).sum())
            start, end = spans[:, 1], spans[:, 2]
            here = spans[((start >= lo) & ((start < hi) | last)) | ((start < hi) & (end > lo))]
            yield self._row(ids[lo:hi], docs, here[:, 0], np.clip(here[:, 1:] - lo, 0, hi - lo))
            self.part += 1
        self.encoded, self.spans, self.ends, self.length = [], [], [], 0

    def _row(self, ids: np.ndarray, docs: int, doc: np.ndarray, where: np.ndarray):
        """One piece: its ids, its documents' count, each document's [start, end) in it."""
        src, block = self.key
        return pa.RecordBatch.from_pydict(
            {
                "src": [src],
                "block": [block],
                "part": [self.part],
                "docs": [docs],
                "n": [len(ids)],
                "tokens": [ids.tobytes()],
                "doc": [doc.tolist()],
                "doc_start": [where[:, 0].tolist()],
                "doc_end": [where[:, 1].tolist()],
            },
            schema=PIECE_SCHEMA,
        )

    def _close(self):
        """The last piece of the input split that ends, if one was open."""
        if self.key is not None:
            self._end_paragraph()
            yield from self._pieces()


def encode_lines(lines: DataFrame, tokenizer: Tokenizer, document_split: str) -> DataFrame:
    """``src, block, part, docs, n, tokens``: the stream's pieces, encoded in the executors
    (``Encoder``)."""
    return lines.mapInArrow(Encoder(tokenizer, document_split), from_arrow_schema(PIECE_SCHEMA))


def collect_pieces(encoded: DataFrame, head_bytes: int) -> list[Piece]:
    """Every piece's place, length, documents and first ``head_bytes``, in stream order (the only
    pass that brings anything of the corpus to the driver)."""
    heads = encoded.select(
        "src", "block", "part", "n", "docs", F.substring("tokens", 1, head_bytes).alias("head")
    )
    return sorted(
        Piece(r.src, r.block, r.part, r.n, r.docs, bytes(r.head)) for r in heads.collect()
    )


@dataclass(frozen=True)
class Encoding:
    """The encode step: the tokenizer and settings it runs with, the pieces it makes, and what the
    stream's layout needs of it (its stored token, its record)."""

    tokenizer: Tokenizer
    document_split: str
    data: DataSettings
    seed: int
    block_size: int | None = None  # chat: its records are block_size + 1 tokens (a pair: two)

    @property
    def chat(self) -> bool:
        return reader_for(self.data).chat

    @property
    def dtype(self) -> np.dtype:
        """The stream's stored token: the tokenizer's, or chat's flagged word."""
        return chat_tokens.DTYPE if self.chat else self.tokenizer.token_dtype

    @property
    def pairs(self) -> bool:
        return reader_for(self.data).pairs

    @property
    def record(self) -> int:
        """Tokens the stream's segments are counted in: chat's records (a preference pair's two),
        else one."""
        if not self.chat:
            return 1
        return (self.block_size + 1) * (2 if self.pairs else 1)

    def run(self, lines: DataFrame) -> tuple[DataFrame, list[Piece]]:
        """The pieces (cached) and what the driver collects of each (``Piece``), in stream order."""
        if self.pairs:
            encoded = encode_pairs(lines, self.tokenizer, self.block_size, self.data).cache()
        elif self.chat:
            encoded = encode_chat(lines, self.tokenizer, self.block_size, self.data).cache()
        else:
            encoded = encode_lines(lines, self.tokenizer, self.document_split).cache()
        return encoded, collect_pieces(encoded, self.data.halo_tokens * self.dtype.itemsize)
