"""The encode stage of ``data.format=preference``: each rendered pair (``pairs.py``) in the
executors, its sides tokenized as TRL tokenizes them (the prompt, then the answer, each
without special tokens added: the template carries them), the answer's tokens flagged TRAIN (only
they count), and each side padded into a record of ``block_size + 1`` tokens. A pair is two
records, the chosen side's then the rejected side's: one window of the stream (training/spec.py),
so the two stay together through the chunks, the cache and the object store.

A pair whose sides tokenize alike is counted (``identical``) and skipped; one the renderer left
without answers (``incomplete``) too. A side longer than a record follows ``data.overlong`` for the
pair: ``drop``, ``truncate`` (each side's first ``block_size + 1`` tokens; a side whose answer is
then gone drops the pair) or ``error`` (one line naming its file and row)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.chat.encode import PIECE_TOKENS, ChatEncoder, piece_schema, token_starts
from raydp_llm.data.preference.pairs import pair_sides

PAIR_COUNTS = ("pairs", "incomplete", "identical", "dropped", "truncated", "chosen_tokens",
               "rejected_tokens", "padding_tokens")
# and each pair's prompt, hashed (its ids, 64 bits): the manifest counts the distinct prompts
PAIR_PIECE_SCHEMA = piece_schema(PAIR_COUNTS).append(pa.field("prompt_hashes", pa.binary()))


class PairEncoder(ChatEncoder):
    """The pair encode step of one Spark task (``mapInArrow``): rendered pairs in, pieces of whole
    pairs out (``PAIR_PIECE_SCHEMA``), a piece per input split (more past ``PIECE_TOKENS``)."""

    counted, schema = PAIR_COUNTS, PAIR_PIECE_SCHEMA

    def __call__(self, batches):
        self._start()
        for batch in batches:
            kept = [(src, block, doc, pair_sides(text)) for src, block, doc, text in
                    self._rows(batch) if doc >= 0 and text.strip()]
            # every side's prompt and answer, tokenized apart in one call
            parts = [part for *_, sides in kept for side in sides or () for part in side]
            ids = iter([found for found, _ in token_starts(self.tok, parts)])
            for src, block, doc, sides in kept:
                if (src, block) != self.key:
                    yield from self._close()
                    self._open(src, block)
                tokens = [(next(ids), next(ids)) for _ in sides or ()]  # (prompt, answer) a side
                if self._add_pair([_flagged(*side) for side in tokens], doc):
                    self.prompts.append(_hashed(tokens[0][0]))
            if self.key is not None and self.done >= PIECE_TOKENS:
                yield self._piece()
        yield from self._close()

    def _open(self, src: str, block: int) -> None:
        super()._open(src, block)
        self.prompts: list[int] = []  # the piece's pairs' prompts, hashed

    def _piece_extra(self) -> dict:
        hashes, self.prompts = np.asarray(self.prompts, np.int64), []
        return {"prompt_hashes": [hashes.tobytes()]}

    def _add_pair(self, sides: list[tuple[np.ndarray, np.ndarray]], doc: int) -> bool:
        """A pair's two sides (each its ids and which the loss counts) as two records (True), or
        counted: without answers, alike, or too long for a record."""
        if not sides:
            self.counts["incomplete"] += 1
            return False
        (chosen, _), (rejected, _) = sides
        if np.array_equal(chosen, rejected):
            self.counts["identical"] += 1
            return False
        if max(len(ids) for ids, _ in sides) > self.record:
            sides = self._overlong(sides, doc)
            if sides is None:
                return False
        place = self.done
        for ids, train in sides:
            padding = self.record - len(ids)
            start = np.zeros(self.record, bool)
            start[0] = True  # one sequence a record: its padding follows it, never counted
            self.records.append(chat_tokens.pack(
                np.concatenate([ids, np.full(padding, self.pad, np.int64)]),
                np.concatenate([train, np.zeros(padding, bool)]), start))
            self.counts["padding_tokens"] += padding
            self.done += self.record
        self.spans.append([doc, place, self.done])
        self.counts["pairs"] += 1
        self.counts["chosen_tokens"] += int(sides[0][1].sum())
        self.counts["rejected_tokens"] += int(sides[1][1].sum())
        return True

    def _overlong(self, sides, doc: int):
        """``data.overlong`` for a pair with a side past the record: None when it is dropped."""
        if self.overlong == "error":
            src, _ = self.key
            longest = max(len(ids) for ids, _ in sides)
            raise InputError(f"{src}: row {doc + 1}: a side of the pair has {longest} tokens, "
                             f"more than model.block_size + 1 = {self.record}; shorten it, or set "
                             "data.overlong=drop or truncate")
        cut = [(ids[:self.record], train[:self.record]) for ids, train in sides]
        if self.overlong == "drop" or not all(train.any() for _, train in cut):
            self.counts["dropped"] += 1
            return None
        self.counts["truncated"] += 1
        return cut


def _hashed(ids: np.ndarray) -> int:
    """A prompt's ids as a 64-bit number (the same prompt, the same number)."""
    digest = hashlib.blake2b(ids.astype(np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def distinct_prompts(encoded: DataFrame) -> int:
    """The distinct prompts of the pairs kept (the pieces' ``prompt_hashes``)."""
    rows = encoded.select("prompt_hashes").collect()
    hashes = [np.frombuffer(row[0], np.int64) for row in rows]
    return int(np.unique(np.concatenate([np.empty(0, np.int64), *hashes])).size)


def _flagged(prompt: np.ndarray, answer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A side's ids and the loss's flags: the answer's tokens count, the prompt's do not (nor the
    first token, which nothing before it predicts)."""
    train = np.concatenate([np.zeros(len(prompt), bool), np.ones(len(answer), bool)])
    train[:1] = False
    return np.concatenate([prompt, answer]).astype(np.int64), train


def encode_pairs(lines: DataFrame, tokenizer: Tokenizer, block_size: int,
                 data: DataSettings) -> DataFrame:
    """The preference stream's pieces, encoded in the executors (``PairEncoder``)."""
    encoder = PairEncoder(tokenizer, block_size, data)
    return lines.mapInArrow(encoder, from_arrow_schema(PAIR_PIECE_SCHEMA))
