"""The encode step's rows (``etl.encode.Encoder``) in one process: a piece longer than
``PIECE_TOKENS`` ids is cut into rows of at most that many, which together hold what one row
would (ids, documents, each document's span)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.data.etl import encode

LINES = ["abcabcabcabc", "", "bcd", "", "", "a" * 40, "dd", "", "c"]


def rows(monkeypatch, piece_tokens: int, split: str) -> list[dict]:
    monkeypatch.setattr(encode, "PIECE_TOKENS", piece_tokens)
    lines = pa.RecordBatch.from_pydict({
        "src": ["f.txt"] * len(LINES),
        "block": [0] * len(LINES),
        "doc": list(range(len(LINES))),
        "raw": [line.encode() for line in LINES],
    })
    encoder = encode.Encoder(CharTokenizer("abcd\n"), split)
    return [row for batch in encoder([lines]) for row in batch.to_pylist()]


def stream(pieces: list[dict]) -> tuple[bytes, int, list[tuple[int, int, int]]]:
    """The pieces joined: their ids, documents, and each document's [start, end) in the stream
    (a document cut across rows joined again)."""
    spans, offset = {}, 0
    for p in pieces:
        for doc, start, end in zip(p["doc"], p["doc_start"], p["doc_end"]):
            lo, hi = spans.get(doc, (offset + start, offset + start))
            assert hi == offset + start  # a document goes on where it stopped
            spans[doc] = (lo, offset + end)
        offset += p["n"]
    ids = b"".join(p["tokens"] for p in pieces)
    return ids, sum(p["docs"] for p in pieces), sorted((d, *s) for d, s in spans.items())


@pytest.mark.parametrize("split,documents", [("blank_line", 4), ("line", 5), ("file", 1)])
def test_a_long_piece_is_cut_into_rows_that_hold_the_same_stream(monkeypatch, split, documents):
    whole = rows(monkeypatch, 1 << 22, split)
    cut = rows(monkeypatch, 7, split)
    assert len(whole) == 1 and len(cut) >= whole[0]["n"] / 7
    assert all(r["n"] <= 7 for r in cut) and [r["part"] for r in cut] == list(range(len(cut)))
    assert stream(cut) == stream(whole)
    assert stream(whole)[1] == documents
