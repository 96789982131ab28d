"""The contamination check (GPT-3, Brown et al. 2020, appendix C): validation documents that share
a word n-gram (13 by default) with a training document, counted after the stream is split, and,
with ``data.decontaminate=remove``, the training documents that share one, which the ETL then
drops before encoding again.

A document is placed by its tokens (the encoder reports where each document's tokens lie in each
piece, ``etl.encode.Encoder``): it is a validation document if any of its tokens falls in the
validation split (a document across the boundary counts as validation). The n-grams are hashed to
64 bits in the executors (``ngrams.py``). A small validation split (``SMALL_VALIDATION_TOKENS``,
the usual case: 10% of a 10 MB corpus) is checked exactly in two passes over the lines: its n-grams
are collected to the driver (16 MB at most), and the training side's pass returns only those it
holds. A larger one's n-grams stay in Spark, and a Bloom filter of them (10 bits each, built in the
executors) lets the training side's pass send Spark only the n-grams that may be among them, which
a join verifies; the driver receives counts and the filter's bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Broadcast
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from raydp_llm.data.etl.curation import ngrams
from raydp_llm.engines.frames import detached

PLACED_SCHEMA = "src string, doc long, start long, end long, val boolean"
PLACED_ARROW = pa.schema([("src", pa.string()), ("doc", pa.int64()), ("start", pa.int64()),
                          ("end", pa.int64()), ("val", pa.bool_())])
GRAMS = "id long, gram long"
# validation documents broadcast to every task of the n-gram pass; beyond, a shuffle join
BROADCAST_DOCUMENTS = 2_000_000
# a validation split of at most this many tokens has at most as many word n-grams (a word is at
# least one token): they are collected to the driver (16 bytes each, 16 MB at most) and the check
# is two passes over the lines (4 Spark jobs); beyond, the Bloom filter and joins (about 10)
SMALL_VALIDATION_TOKENS = 1_000_000
HITS = "id binary, seen binary"


def placements(encoded: DataFrame, placed: dict, segments_of) -> DataFrame:
    """``src, doc, start, end, tokens, val``: each document's tokens in the stream (``[start,
    end)``, end-of-document tokens aside) and whether any lies in the validation split.
    ``placed`` and ``segments_of`` are the ``records.StreamLayout``'s: each piece's offset, the
    splits' segments."""

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
            yield pa.RecordBatch.from_pydict(out, schema=PLACED_ARROW)

    pieces = encoded.select("src", "block", "part", "doc", "doc_start", "doc_end")
    return pieces.mapInArrow(place, PLACED_SCHEMA).groupBy("src", "doc").agg(
        F.min("start").alias("start"), F.max("end").alias("end"),
        F.sum(F.col("end") - F.col("start")).alias("tokens"), F.max("val").alias("val"))


class LineGrams:
    """The executors' pass (``mapInArrow``) over the lines to encode, in file order: each
    document's word ``n``-grams, a row each (``id, gram``), the words of a document's lines joined
    (an n-gram may cross lines) without ever holding a whole document: a batch's words are hashed
    together, and the last ``n - 1`` word hashes carried into the next batch. (A document that
    goes on in the next input split loses the n-grams across that split's start: at most
    ``n - 1``.) With ``keep`` (a Bloom filter), only the n-grams it may hold are written: the
    training side's candidates."""

    def __init__(self, n: int, keep: Broadcast | None = None):
        self.n, self.keep = n, keep

    def __call__(self, batches):
        carry = Words(np.empty(0, np.uint64), np.empty(0, np.int64))
        keep = self.keep.value if self.keep is not None else None
        for batch in batches:
            words = carry.then(Words.of(batch))
            grams, ids = words.grams(self.n)
            if keep is not None and grams.size:
                maybe = keep.may_hold(grams)
                grams, ids = grams[maybe], ids[maybe]
            carry = words.tail(self.n - 1)
            if grams.size:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(ids), pa.array(grams.view(np.int64))], names=["id", "gram"])


class SideGrams:
    """``LineGrams`` over one side's lines (``doc, id, raw``), told apart by ``val_ids`` (the
    validation documents' ids, sorted)."""

    def __init__(self, n: int, val_ids: Broadcast, val: bool, keep: Broadcast | None = None):
        self.grams, self.val_ids, self.val = LineGrams(n, keep), val_ids, val

    def __call__(self, batches):
        val_ids = self.val_ids.value

        def side():
            for batch in batches:
                ids = batch.column("id").to_numpy()
                yield batch.filter(pa.array(np.isin(ids, val_ids) == self.val))

        yield from self.grams(side())


class TrainHits:
    """The training side's pass of the exact check: a row per partition, the ids of its documents
    that share an n-gram with the validation side (``id``, packed) and which of the validation
    n-grams (``keep``: a ``GramSet``) it holds (``seen``, a bit each): bounded by the documents and
    the validation split, however often the same text repeats."""

    def __init__(self, n: int, val_ids: Broadcast, keep: Broadcast):
        self.grams, self.keep = SideGrams(n, val_ids, False, keep), keep

    def __call__(self, batches):
        known = self.keep.value.sorted
        seen, ids = np.zeros(known.size, bool), [np.empty(0, np.int64)]
        for hits in self.grams(batches):
            ids.append(np.unique(hits.column("id").to_numpy()))
            seen[np.searchsorted(known, hits.column("gram").to_numpy())] = True
        yield pa.RecordBatch.from_arrays(
            [pa.array([np.unique(np.concatenate(ids)).tobytes()]),
             pa.array([np.packbits(seen).tobytes()])], names=["id", "seen"])


def packed(batches, columns: tuple[str, ...]):
    """A partition's rows as one row: each int64 column's values as one byte string (the driver
    collects a few rows of bytes, not a Python object per value)."""
    parts = {c: [np.empty(0, np.int64)] for c in columns}
    for batch in batches:
        for c in columns:
            parts[c].append(batch.column(c).to_numpy())
    yield pa.RecordBatch.from_arrays(
        [pa.array([np.concatenate(parts[c]).tobytes()]) for c in columns], names=list(columns))


def collect_packed(frame: DataFrame, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``frame``'s int64 ``columns``, collected to the driver packed (``packed``)."""
    schema = ", ".join(f"{c} binary" for c in columns)
    rows = frame.mapInArrow(lambda batches: packed(batches, columns), schema).collect()
    return {c: unpacked(row[c] for row in rows) for c in columns}


def unpacked(blobs) -> np.ndarray:
    """Byte strings of int64 values (``packed``) as one array."""
    return np.concatenate([np.empty(0, np.int64)] + [np.frombuffer(b, np.int64) for b in blobs])


@dataclass(frozen=True)
class GramSet:
    """An exact set of n-gram hashes, asked as a ``Bloom`` is (``may_hold``): no false
    positives."""

    sorted: np.ndarray  # int64, sorted, distinct

    def may_hold(self, values: np.ndarray) -> np.ndarray:
        values = values.view(np.int64)
        if not self.sorted.size:
            return np.zeros(values.size, bool)
        where = np.searchsorted(self.sorted, values).clip(0, self.sorted.size - 1)
        return self.sorted[where] == values


@dataclass(frozen=True)
class Words:
    """A run of words in file order: each word's hash and its document's ``id`` (a document's
    words are consecutive)."""

    hashes: np.ndarray  # uint64
    ids: np.ndarray  # int64

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Words:
        """The words of a batch's lines (``doc, id, raw``), hashed together (``byte_words``); a
        newline between lines, so no word spans two."""
        keep = pc.and_(pc.greater_equal(batch.column("doc"), 0),
                       pc.greater(pc.binary_length(batch.column("raw")), 0))
        raw = batch.column("raw").filter(keep).to_pylist()
        if not raw:
            return cls(np.empty(0, np.uint64), np.empty(0, np.int64))
        hashes, starts = ngrams.byte_words(b"\n".join(raw))
        line_starts = np.cumsum([0] + [len(r) + 1 for r in raw[:-1]])
        lines = np.searchsorted(line_starts, starts, side="right") - 1
        ids = batch.column("id").filter(keep).to_numpy()
        return cls(hashes, ids[lines])

    def then(self, other: Words) -> Words:
        return Words(np.concatenate([self.hashes, other.hashes]),
                     np.concatenate([self.ids, other.ids]))

    def grams(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The hash and document id of every ``n`` consecutive words of one document."""
        grams = ngrams.rolling(self.hashes, n)
        starts = self.ids[: grams.size]
        within = starts == self.ids[n - 1:][: grams.size]
        return grams[within], starts[within]

    def tail(self, k: int) -> Words:
        """The last ``k`` words (the next batch's n-grams may start in them)."""
        return Words(self.hashes[max(0, len(self.hashes) - k):],
                     self.ids[max(0, len(self.ids) - k):])


def check(lines: DataFrame, documents: DataFrame, placed: DataFrame,
          n: int) -> tuple[dict, DataFrame]:
    """The figures (validation and training documents, and how many of each share an ``n``-gram
    with the other split) and the overlapping training documents (``src, doc, bytes``).
    ``lines``: the lines to encode, with ``doc``, in file order; ``documents``: ``src, doc,
    bytes``; ``placed``: ``placements``."""
    doc_id = F.xxhash64("src", "doc")
    splits = placed.select("src", "doc", "val", "tokens")
    sizes = {r.val: r for r in splits.groupBy("val").agg(
        F.count("*").alias("documents"), F.sum("tokens").alias("tokens")).collect()}
    val, train = sizes.get(True), sizes.get(False)
    lines = lines.withColumn("id", doc_id)
    if val is None:  # nothing to look for (no training side: both paths count zero overlaps)
        found = Overlap(0, 0, 0, lines.sparkSession.createDataFrame([], "id long"))
    elif val.tokens <= SMALL_VALIDATION_TOKENS:
        found = exact_overlap(lines, splits.where("val").select(doc_id.alias("id")), n)
    else:
        found = filtered_overlap(lines, splits.where("val").select("src", "doc"),
                                 val.documents, n)
    # only read by data.decontaminate=remove
    overlapping = documents.withColumn("id", doc_id).join(
        found.train_ids, "id", "left_semi").select("src", "doc", "bytes")
    report = {
        "ngram": n,
        "val_documents": val.documents if val else 0,
        "val_documents_overlapping": found.val_overlapping,
        "train_documents": train.documents if train else 0,
        "train_documents_overlapping": found.train_overlapping,
        "val_ngrams": found.val_ngrams,
    }
    return report, overlapping


@dataclass(frozen=True)
class Overlap:
    """What the check found: the validation split's distinct n-grams, how many validation and
    training documents share one with the other split, and those training documents' ``id``."""

    val_ngrams: int
    val_overlapping: int
    train_overlapping: int
    train_ids: DataFrame


def exact_overlap(lines: DataFrame, val_ids: DataFrame, n: int) -> Overlap:
    """A small validation split's check, in two passes over the lines and no shuffle: its
    documents' ids and n-grams are collected (``SMALL_VALIDATION_TOKENS`` bounds them: a word is
    at least one token), and the training side's pass returns only the n-grams among them."""
    context = lines.sparkSession.sparkContext
    # read once for both passes (a file read and its document keys cost more than the cache)
    lines = detached(lines.select("doc", "id", "raw"))
    val = context.broadcast(np.unique(collect_packed(val_ids, ("id",))["id"]))
    grams = collect_packed(lines.mapInArrow(SideGrams(n, val, True), GRAMS), ("id", "gram"))
    unique = np.unique(grams["gram"])
    keep = context.broadcast(GramSet(unique))
    rows = lines.mapInArrow(TrainHits(n, val, keep), HITS).collect()
    val.unpersist()
    keep.unpersist()
    lines.unpersist()
    train_ids = np.unique(unpacked(row.id for row in rows))
    seen = np.zeros(unique.size, bool)  # the validation n-grams found in training documents
    for row in rows:
        seen |= np.unpackbits(np.frombuffer(row.seen, np.uint8), count=unique.size).astype(bool)
    val_overlapping = np.unique(grams["id"][np.isin(grams["gram"], unique[seen])]).size
    frame = lines.sparkSession.createDataFrame([(int(i),) for i in train_ids], "id long")
    return Overlap(unique.size, val_overlapping, train_ids.size, frame)


def filtered_overlap(lines: DataFrame, val_docs: DataFrame, count: int, n: int) -> Overlap:
    """A large validation split's check: its n-grams are kept in Spark, and a Bloom filter of
    them lets the training side's pass write only the few n-grams that may be among them, which a
    join verifies."""
    # read once for both passes (a file read and its document keys cost more than the cache)
    lines = detached(with_split(lines, val_docs, count).select("doc", "val", "id", "raw"))
    val_grams = detached(lines.where("val").mapInArrow(LineGrams(n), GRAMS).distinct())
    items = val_grams.count()
    keep = lines.sparkSession.sparkContext.broadcast(bloom_of(val_grams, items))
    candidates = lines.where(~F.col("val")).mapInArrow(LineGrams(n, keep), GRAMS)
    hits = detached(candidates.join(val_grams.select("gram").distinct(), "gram",
                                    "left_semi").distinct())
    val_hit = val_grams.join(hits.select("gram").distinct(), "gram", "left_semi")
    found = Overlap(items, val_hit.select("id").distinct().count(),
                    hits.select("id").distinct().count(), hits.select("id"))
    val_grams.unpersist()
    lines.unpersist()
    keep.unpersist()
    return found


def with_split(lines: DataFrame, val_docs: DataFrame, count: int) -> DataFrame:
    """``lines`` with ``val``: whether their document is a validation one, in file order."""
    flagged = val_docs.withColumn("val", F.lit(True))
    if count <= BROADCAST_DOCUMENTS:  # a broadcast join streams the lines in their order
        joined = lines.join(F.broadcast(flagged), ["src", "doc"], "left")
    else:  # a shuffle moves a document's lines together, the sort puts them back in order
        joined = lines.join(flagged, ["src", "doc"], "left").sortWithinPartitions(
            "src", "block", "line")
    return joined.withColumn("val", F.coalesce("val", F.lit(False)))


def bloom_of(grams: DataFrame, items: int) -> ngrams.Bloom:
    """The Bloom filter of ``grams``' n-grams (``items`` of them at most): each partition's built
    in its executor, OR-ed in the executors (``treeReduce``); the driver gets one (10 bits per
    n-gram)."""

    def part(batches):
        bloom = ngrams.Bloom.empty(items)
        for batch in batches:
            bloom.add(batch.column("gram").to_numpy().view(np.uint64))
        yield pa.RecordBatch.from_arrays([pa.array([bloom.bits.tobytes()], pa.binary())],
                                         names=["bits"])

    # a filter per partition: as many as the executors' cores, not one per shuffle partition
    parallel = grams.sparkSession.sparkContext.defaultParallelism
    parts = grams.select("gram").coalesce(parallel).mapInArrow(part, "bits binary").rdd.map(
        lambda row: ngrams.Bloom(np.frombuffer(row.bits, np.uint8)))
    return parts.treeReduce(ngrams.Bloom.union)
