"""The ETL's *tokenizer* stage: the ids as they are (id files), the corpus' character set
(``char``), a BPE loaded from ``tokenizer.path``, or one trained on a sample Spark draws
(``bpe``)."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import (
    CharTokenizer,
    IdsTokenizer,
    Tokenizer,
    load_tokenizer,
    train_bpe,
)
from raydp_llm.data.chat.template import CHATML_SPECIALS, strip_marks
from raydp_llm.data.etl.formats import reader_for
from raydp_llm.data.etl.records import EtlPlan, FileStats
from raydp_llm.data.inputs.files import decode


def build_tokenizer(lines: DataFrame, files: dict[str, FileStats], plan: EtlPlan) -> Tokenizer:
    """Id files: the ids as they are. ``char``: the corpus' character set (newline included).
    ``bpe``: loaded from ``tokenizer.path``, or trained on a sample of at most
    ``tokenizer.sample_mb`` MB that Spark draws (chat: with chatml's two special tokens)."""
    tok_cfg = plan.tokenizer
    if reader_for(plan.data).token_ids:
        return IdsTokenizer(id_vocab_size(files, plan.data.vocab_size))
    if tok_cfg.kind == "char":  # chat's span marks are no characters of the text
        chars = "".join(set().union(*(f.charset for f in files.values())))
        return CharTokenizer("\n" + strip_marks(chars))
    if tok_cfg.path:
        return load_tokenizer(tok_cfg.path)
    total = sum(f.chars for f in files.values())
    texts = sample_lines(lines, min(1.0, tok_cfg.sample_mb * 1e6 / max(total, 1)), plan.seed)
    chat = reader_for(plan.data).chat
    if chat:
        texts = [strip_marks(t) for t in texts]
    return train_bpe(
        (texts[i : i + 10_000] for i in range(0, len(texts), 10_000)), tok_cfg.vocab_size,
        specials=CHATML_SPECIALS if chat else ())


def id_vocab_size(files: dict[str, FileStats], vocab_size: int | None) -> int:
    """The vocabulary of an id corpus: ``data.vocab_size``, or the largest id + 1; bad ids are
    errors."""
    for src, f in sorted(files.items()):
        if f.bad:
            raise InputError(f"{src}: {f.bad!r} is not an integer token id; id files hold "
                             "whitespace-separated integers (or set data.format=text)")
        if f.min_id is not None and f.min_id < 0:
            raise InputError(f"{src}: token id {f.min_id} is negative; ids must lie in [0, "
                             "vocab_size)")
    largest = max((f.max_id for f in files.values() if f.max_id is not None), default=-1)
    if vocab_size is not None and largest >= vocab_size:
        src = next(
            s
            for s, f in sorted(files.items())
            if f.max_id is not None and f.max_id >= vocab_size
        )
        raise InputError(f"{src}: token id {largest} is out of range for "
                         f"data.vocab_size={vocab_size}; raise data.vocab_size or leave it null "
                         "(largest id + 1)")
    return vocab_size or largest + 1


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
