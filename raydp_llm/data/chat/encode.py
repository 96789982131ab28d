"""The encode stage of ``data.format=chat``: each conversation (a ``raw`` row, rendered and marked
by ``chat/template.py``) tokenized as ``apply_chat_template(tokenize=True)`` would (no special
tokens added: the template carries them), its tokens flagged (``chat_tokens``: TRAIN where the
loss counts the token, START at its first token), and packed into *records* of ``block_size + 1``
tokens.

``data.packing=true`` packs conversations greedily in order (one that does not fit in what is left
of the record starts the next); ``false`` gives each its own record. The rest of a record is
padding: the end-of-document (or eos) id, TRAIN off, START on its first token. A conversation
longer than a record follows ``data.overlong``: ``drop``, ``truncate`` (its first ``block_size +
1`` tokens) or ``error`` (one line naming its file and row). A conversation without an assistant
turn is dropped and counted (``no_assistant``) when ``data.train_on`` is ``assistant`` or ``last``:
nothing in it is learned. Pieces have the line encoder's columns (``PIECE_SCHEMA``) and their
lengths are multiples of the record, plus the counts of ``CHAT_COUNTS``, which the driver sums."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer, Tokenizer, tokenizer_from_json
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.chat.template import unmarked
from raydp_llm.data.etl.scan import decode_column

PIECE_TOKENS = 1 << 22  # a piece closes past ~4M tokens (whole records)
CHAT_COUNTS = ("conversations", "turns", "tokens_trained", "tokens_masked", "padding_tokens",
               "dropped", "truncated", "no_assistant")


def piece_schema(counts: tuple[str, ...]) -> pa.Schema:
    """A piece of flagged records: the line encoder's columns, then its ``counts``."""
    return pa.schema(
        [("src", pa.string()), ("block", pa.int64()), ("part", pa.int64()), ("docs", pa.int64()),
         ("n", pa.int64()), ("tokens", pa.binary()), ("doc", pa.list_(pa.int64())),
         ("doc_start", pa.list_(pa.int64())), ("doc_end", pa.list_(pa.int64()))]
        + [(name, pa.int64()) for name in counts])


CHAT_PIECE_SCHEMA = piece_schema(CHAT_COUNTS)


def token_starts(tok: Tokenizer, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's ids (no special tokens added) and the character each token starts at."""
    if isinstance(tok, CharTokenizer):  # a token per character
        return [(ids, np.arange(len(ids))) for ids in tok.encode_batch(texts)]
    encodings = tok.tok.encode_batch(texts, add_special_tokens=False)
    return [(np.asarray(e.ids, np.int64), np.array([lo for lo, _ in e.offsets], np.int64))
            for e in encodings]


def trained(starts: np.ndarray, spans: list[tuple[int, int]], train_on: str) -> np.ndarray:
    """Which tokens the loss counts: those starting in an assistant span (``last``: the last one),
    or all (``all``); never the first (nothing before it predicts it)."""
    chosen = spans[-1:] if train_on == "last" else spans
    train = np.zeros(len(starts), bool)
    for lo, hi in chosen:
        train |= (starts >= lo) & (starts < hi)
    if train_on == "all":
        train[:] = True
    train[:1] = False
    return train


class ChatEncoder:
    """The chat encode step of one Spark task (``mapInArrow``): marked conversations in, records of
    ``block_size + 1`` flagged tokens out (``CHAT_PIECE_SCHEMA``), a piece per input split (more
    past ``PIECE_TOKENS``)."""

    counted, schema = CHAT_COUNTS, CHAT_PIECE_SCHEMA

    def __init__(self, tokenizer: Tokenizer, block_size: int, data: DataSettings):
        self.tokenizer_json, self.record = tokenizer.to_json(), block_size + 1
        self.train_on, self.packing, self.overlong = data.train_on, data.packing, data.overlong

    def _start(self) -> None:
        """The task's tokenizer (once per task, in the executor), its padding id, no piece open."""
        self.tok = tokenizer_from_json(self.tokenizer_json)
        separator = self.tok.separator()
        self.pad = separator[0] if separator else 0  # a tokenizer without one: id 0, never trained
        self.key = None

    @staticmethod
    def _rows(batch):
        """A batch's ``src, block, doc, text`` rows."""
        return zip(*(batch.column(c).to_pylist() for c in ("src", "block", "doc")),
                   decode_column(batch.column("raw"))[0].to_pylist())

    def __call__(self, batches):
        self._start()
        for batch in batches:
            rows = self._rows(batch)
            # blank rows hold no conversation; the marks come out before the text is encoded
            kept = [(src, block, doc, *unmarked(text)) for src, block, doc, text in rows
                    if doc >= 0 and text.strip()]
            encoded = token_starts(self.tok, [text for *_, text, _ in kept])
            for (src, block, doc, _, spans), (ids, starts) in zip(kept, encoded):
                if (src, block) != self.key:
                    yield from self._close()
                    self._open(src, block)
                self._add(ids, trained(starts, spans, self.train_on), len(spans), doc)
            if self.key is not None and self.done >= PIECE_TOKENS:
                yield self._piece()
        yield from self._close()

    def _open(self, src: str, block: int) -> None:
        self.key, self.part = (src, block), 0
        self.records: list[np.ndarray] = []  # the piece's records, whole
        self.current: list[np.ndarray] = []  # the open record's conversations
        self.fill = 0  # tokens in the open record
        self.done = 0  # tokens in self.records
        self.spans: list[list[int]] = []  # [doc, start, end] in the piece, in order
        self.counts = dict.fromkeys(self.counted, 0)

    def _add(self, ids: np.ndarray, train: np.ndarray, turns: int, doc: int) -> None:
        """One conversation into the open record (or the next), or counted as dropped."""
        if turns == 0 and self.train_on != "all":
            self.counts["no_assistant"] += 1
            return
        if turns and not train.any():  # every assistant turn holds a token: its end of turn
            src, _ = self.key
            raise InputError(f"{src}: row {doc + 1}: no token of the assistant's turns is found "
                             "where its characters are: the tokenizer's character offsets do not "
                             "match the text (it drops or rewrites characters); use a tokenizer "
                             "that keeps every character (byte-level BPE, or byte fallback)")
        if len(ids) > self.record:
            if self.overlong == "error":
                src, _ = self.key
                raise InputError(f"{src}: row {doc + 1}: the conversation has {len(ids)} "
                                 f"tokens, more than model.block_size + 1 = {self.record}; "
                                 "shorten it, or set data.overlong=drop or truncate")
            self.counts["dropped" if self.overlong == "drop" else "truncated"] += 1
            if self.overlong == "drop":
                return
            ids, train = ids[:self.record], train[:self.record]
        if self.fill + len(ids) > self.record or (self.fill and not self.packing):
            self._end_record()
        start = np.zeros(len(ids), bool)
        start[0] = True
        self.current.append(chat_tokens.pack(ids, train, start))
        place = self.done + self.fill
        self.spans.append([doc, place, place + len(ids)])
        self.fill += len(ids)
        self.counts["conversations"] += 1
        self.counts["turns"] += turns
        self.counts["tokens_trained"] += int(train.sum())
        self.counts["tokens_masked"] += int(len(ids) - train.sum())

    def _end_record(self) -> None:
        """The open record, padded to its length, closed (nothing to close when empty)."""
        if not self.fill:
            return
        padding = self.record - self.fill
        if padding:
            start = np.zeros(padding, bool)
            start[0] = True
            pad = np.full(padding, self.pad, np.int64)
            self.current.append(chat_tokens.pack(pad, np.zeros(padding, bool), start))
        self.counts["padding_tokens"] += padding
        self.records.append(np.concatenate(self.current))
        self.current, self.fill = [], 0
        self.done += self.record

    def _piece(self) -> pa.RecordBatch:
        """The whole records so far as one piece; the open record goes on into the next."""
        words = np.concatenate(self.records) if self.records else np.empty(0, chat_tokens.DTYPE)
        inside = [(d, a, b) for d, a, b in self.spans if b <= self.done]
        docs, starts, ends = (list(c) for c in zip(*inside)) if inside else ([], [], [])
        src, block = self.key
        row = {"src": [src], "block": [block], "part": [self.part], "docs": [len(inside)],
               "n": [len(words)], "tokens": [words.tobytes()],
               "doc": [docs], "doc_start": [starts], "doc_end": [ends]}
        row |= {name: [n] for name, n in self.counts.items()} | self._piece_extra()
        self.part += 1
        self.spans = [[d, a - self.done, b - self.done] for d, a, b in self.spans[len(inside):]]
        self.records, self.done, self.counts = [], 0, dict.fromkeys(self.counted, 0)
        return pa.RecordBatch.from_pydict(row, schema=self.schema)

    def _piece_extra(self) -> dict:
        """A subclass's own columns of the piece closing now."""
        return {}

    def _close(self):
        """The input split's last piece, its open record padded."""
        if self.key is not None:
            self._end_record()
            yield self._piece()


def encode_chat(lines: DataFrame, tokenizer: Tokenizer, block_size: int,
                data: DataSettings) -> DataFrame:
    """The chat stream's pieces, encoded and packed in the executors (``ChatEncoder``)."""
    encoder = ChatEncoder(tokenizer, block_size, data)
    return lines.mapInArrow(encoder, from_arrow_schema(CHAT_PIECE_SCHEMA))


def chat_counts(encoded: DataFrame, counted: tuple[str, ...] = CHAT_COUNTS) -> dict[str, int]:
    """The pieces' ``counted`` (``CHAT_COUNTS``, or a preference stream's), summed."""
    row = encoded.agg(*(F.sum(c).alias(c) for c in counted)).collect()[0]
    return {name: int(row[name] or 0) for name in counted}
