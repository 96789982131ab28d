"""JSON Lines parsing as the executors do it: pyarrow's reader for a batch of good lines, a line
at a time otherwise, with the same documents either way."""

from __future__ import annotations

import json
import random

import pyarrow as pa

from raydp_llm.data.jsonl import BAD_KINDS, _parse_batch, parse_line, parse_lines

GOOD = [json.dumps({"text": t, "n": i}) for i, t in
        enumerate(["plain", "two\nlines", "ünïcode ✓", "", "  spaces  ", "tab\there", "\"q\""])]
GOOD.append(b'{"text": "invalid \xff UTF-8"}')
BAD = {
    "not json": "not_json",
    '{"text": "unterminated': "not_json",
    '{"body": "x"}': "no_field",
    "[1, 2]": "no_field",
    '"just a string"': "no_field",
    '{"text": 5}': "not_string",
    '{"text": null}': "not_string",
    '{"text": {"a": 1}}': "not_string",
}


def as_bytes(line: str | bytes) -> bytes:
    return line if isinstance(line, bytes) else line.encode()


def test_each_kind_of_bad_line_is_named_and_yields_no_document():
    for line, kind in BAD.items():
        assert parse_line(as_bytes(line), "text") == (b"", BAD_KINDS[kind]), line
    assert parse_line(b"   ", "text") == (b"", 0) and parse_line(None, "text") == (b"", 0)
    assert parse_line(b'{"text": "a", "text": "b"}', "text") == (b"b", 0)  # the last, as json does
    assert parse_line(b'{"text": "\\ud800x"}', "text") == (b"?x", 0)  # a lone surrogate
    # invalid UTF-8 passes through, for the scan to replace and count as in text files
    assert parse_line(b'{"text": "a\xffb"}', "text") == (b"a\xffb", 0)


def test_a_batch_reads_the_same_whichever_way_it_is_parsed():
    rng = random.Random(3)
    for _ in range(300):
        lines = [as_bytes(rng.choice(GOOD + list(BAD) + [""])) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.3:
            lines = [as_bytes(rng.choice(GOOD)) for _ in range(rng.randint(1, 12))]  # all good
        texts, bad = parse_lines(pa.array(lines, pa.binary()), "text")
        one_by_one = [parse_line(line, "text") for line in lines]
        assert texts.to_pylist() == [text for text, _ in one_by_one]
        assert bad.tolist() == [verdict for _, verdict in one_by_one]
    good = pa.array([as_bytes(g) for g in GOOD], pa.binary())
    assert _parse_batch(good, "text") is not None  # all good: pyarrow's reader took it whole
    texts, _ = parse_lines(good, "text")
    assert texts.to_pylist()[:-1] == [json.loads(g)["text"].encode() for g in GOOD[:-1]]
