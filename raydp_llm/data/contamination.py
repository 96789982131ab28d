"""The contamination check (GPT-3, Brown et al. 2020, appendix C): validation documents that share
a word n-gram (13 by default) with a training document, counted after the stream is split, and,
with ``data.decontaminate=remove``, the training documents that share one, which the ETL then
drops before encoding again.

A document is placed by its tokens (the encoder reports where each document's tokens lie in each
piece, ``etl.Encoder``): it is a validation document if any of its tokens falls in the validation
split (a document across the boundary counts as validation). The n-grams are hashed to 64 bits in
the executors and joined in Spark; the driver receives four counts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from raydp_llm.data import curation
from raydp_llm.data.corpus import decode
from raydp_llm.engines.spark import detached

PLACED_SCHEMA = "src string, doc long, start long, end long, val boolean"


def placements(encoded: DataFrame, placed: dict, segments_of) -> DataFrame:
    """``src, doc, start, end, tokens, val``: each document's tokens in the stream (``[start,
    end)``, end-of-document tokens aside) and whether any lies in the validation split.
    ``placed`` and ``segments_of`` are the ``etl.Stream``'s: each piece's offset, the splits'
    segments."""

    def place(batches):
        for batch in batches:
            out = {"src": [], "doc": [], "start": [], "end": [], "val": []}
            columns = (batch.column(c).to_pylist()
                       for c in ("src", "block", "part", "doc", "doc_start", "doc_end"))
            for src, block, part, docs, starts, ends in zip(*columns):
                offset = placed[(src, block, part)][0]
                for doc, start, end in zip(docs, starts, ends):
                    lo, hi = offset + start, offset + end
                    out["src"].append(src)
                    out["doc"].append(doc)
                    out["start"].append(lo)
                    out["end"].append(hi)
                    out["val"].append(any(s[0] == "val" for s in segments_of(lo, hi)))
            yield pa.RecordBatch.from_pydict(out)

    pieces = encoded.select("src", "block", "part", "doc", "doc_start", "doc_end")
    return pieces.mapInArrow(place, PLACED_SCHEMA).groupBy("src", "doc").agg(
        F.min("start").alias("start"), F.max("end").alias("end"),
        F.sum(F.col("end") - F.col("start")).alias("tokens"), F.max("val").alias("val"))


class LineGrams:
    """The executors' pass (``mapInArrow``) over the lines to encode, in file order: each
    document's word ``n``-grams, a row each (``id, gram``), the words of a document's lines joined
    (an n-gram may cross lines) without ever holding a whole document: a line's grams take the
    ``n - 1`` word hashes before it. (A document that goes on in the next input split loses the
    n-grams across that split's start: at most ``n - 1``.)"""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, batches):
        key, carry = None, np.empty(0, np.uint64)
        for batch in batches:
            ids, grams = [], []
            columns = (batch.column(c).to_pylist() for c in ("src", "block", "doc", "id", "raw"))
            for src, block, doc, doc_id, raw in zip(*columns):
                if doc < 0 or not raw:
                    continue
                if (src, block, doc) != key:
                    key, carry = (src, block, doc), np.empty(0, np.uint64)
                hashes = np.concatenate([carry, curation.word_hashes(decode(raw)[0])])
                g = curation.rolling(hashes, self.n)
                carry = hashes[len(hashes) - (self.n - 1):] if self.n > 1 else carry
                ids.append(np.full(len(g), doc_id, np.int64))
                grams.append(g.view(np.int64))
            if ids:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(np.concatenate(ids)), pa.array(np.concatenate(grams))],
                    names=["id", "gram"])


def check(lines: DataFrame, documents: DataFrame, placed: DataFrame,
          n: int) -> tuple[dict, DataFrame]:
    """The figures (validation and training documents, and how many of each share an ``n``-gram
    with the other split) and the overlapping training documents (``src, doc, bytes``).
    ``lines``: the lines to encode, with ``doc``, in file order; ``documents``: ``src, doc,
    bytes``; ``placed``: ``placements``."""
    doc_id = F.xxhash64("src", "doc")
    splits = placed.select("src", "doc", "val")
    # each line knows its document's split; a shuffle join moves a document's lines together, and
    # the sort puts them back in order (the n-grams cross lines)
    lines = lines.join(splits, ["src", "doc"]).sortWithinPartitions("src", "block", "line")
    lines = detached(lines.select("src", "block", "doc", "val", doc_id.alias("id"), "raw"))

    def grams(val: bool) -> DataFrame:
        return lines.where(F.col("val") == val).mapInArrow(LineGrams(n), "id long, gram long")

    # the validation side is the small one: its n-grams are kept, the training side's streamed
    # past them (a broadcast join while they fit spark.sql.adaptive.autoBroadcastJoinThreshold)
    val_grams = detached(grams(True).distinct())
    hits = detached(grams(False).join(val_grams.select("gram").distinct(), "gram",
                                      "left_semi").distinct())
    val_hit = val_grams.join(hits.select("gram").distinct(), "gram", "left_semi")
    hits_by_split = {True: val_hit.select("id").distinct().count(),
                     False: hits.select("id").distinct().count()}
    # only read by data.decontaminate=remove
    overlapping = documents.withColumn("id", doc_id).join(
        hits.select("id"), "id", "left_semi").select("src", "doc", "bytes")
    documents_by_split = {r.val: r["count"] for r in splits.groupBy("val").count().collect()}
    val_grams.unpersist()
    lines.unpersist()
    report = {
        "ngram": n,
        "val_documents": documents_by_split.get(True, 0),
        "val_documents_overlapping": hits_by_split.get(True, 0),
        "train_documents": documents_by_split.get(False, 0),
        "train_documents_overlapping": hits_by_split.get(False, 0),
    }
    return report, overlapping
