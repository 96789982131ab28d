"""A BPE for a whole mixture (``data.sources`` with ``tokenizer=bpe``): trained on a sample that
Spark draws from every source at its weight, so that one tokenizer encodes them all (a BPE trained
per source would differ from source to source).

The sample is as large as ``tokenizer.sample_mb`` allows and the weights keep: a source with less
text than its share of the sample bounds the sample of all (a 0.9 source of 30 KB: 33 KB in all),
so the sample's shares are the weights whatever the sources' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm.core.tokenizer import BPETokenizer, train_bpe
from raydp_llm.data.etl.read import documents, read_lines
from raydp_llm.data.etl.records import EtlPlan
from raydp_llm.data.etl.tokenizer import sample_lines


@dataclass(frozen=True)
class SourceSample:
    """What one source gave the mixture's sample."""

    name: str
    weight: float  # its share of the sample (the weights normalized)
    text_bytes: int  # the source's text, as the ETL reads it
    sampled_bytes: int  # what the sample drew from it


def mixture_bpe(spark: SparkSession, plans: dict[str, EtlPlan], weights: dict[str, float],
                sample_mb: float, vocab_size: int) -> tuple[BPETokenizer, list[SourceSample]]:
    """A BPE of ``vocab_size`` ids trained on a sample of at most ``sample_mb`` MB in which each
    source (its plan, by name) has its share ``weights[name]`` (normalized), and what each
    source gave."""
    total = sum(weights.values())
    lines = {name: documents(read_lines(spark, p.corpus, p.data, p.s3), p.corpus, p.data)
             for name, p in plans.items()}
    sizes = {name: _text_bytes(df) for name, df in lines.items()}
    # the largest sample whose shares are the weights: no source asked for more than it has
    sample = min([sample_mb * 1e6] + [sizes[n] * total / w for n, w in weights.items()])
    texts, drawn = [], []
    for name, df in lines.items():
        share = weights[name] / total
        fraction = min(1.0, share * sample / max(sizes[name], 1))
        picked = sample_lines(df, fraction, plans[name].seed)
        texts += picked
        drawn.append(SourceSample(name, share, sizes[name], sum(len(t.encode()) for t in picked)))
    batches = (texts[i : i + 10_000] for i in range(0, len(texts), 10_000))
    return train_bpe(batches, vocab_size), drawn


def _text_bytes(lines: DataFrame) -> int:
    """The bytes of the lines' text, newlines included (a source's size as the sample counts it:
    a Parquet or JSON Lines file's size on disk is not its text's)."""
    row = lines.select(F.sum(F.length("raw") + 1).alias("n")).first()
    return int(row["n"] or 0)
