"""The curation stage of the ETL, between the scan and the tokenizer: quality filters, the score
filter, exact and near deduplication, on whole documents, in Spark (docs/data-curation.md).

1. Every line gets its document's key (``documents.document_keys``); the documents are assembled
   by a ``groupBy`` and measured in the executors, one pass (``Measure``): bytes, text, the exact
   key, the MinHash signature and its LSH band keys, the first quality rule it fails.
2. The score filter joins a score file (``evaluate per_document=true``) by document.
3. Exact duplicates: per exact key, all but the least ``(path, doc)`` go.
4. Near duplicates: documents sharing a band key are candidates; a candidate pair whose signatures
   agree on at least ``dedup_threshold`` of the hash functions is an edge; clusters are the
   connected components (least-label propagation, Spark joins) and keep their least document.
5. The removed documents' lines are dropped by an anti-join; the lines are put back in file order.

The driver receives only counts: nothing per document.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.data.etl.curation import minhash, quality
from raydp_llm.data.etl.curation.documents import document_keys
from raydp_llm.data.inputs.files import decode, hadoop_literal
from raydp_llm.engines.frames import detached

log = logging.getLogger(__name__)

DOC_SCHEMA = ("src string, doc long, bytes long, exact binary, signature binary, "
              "bands array<binary>, rule string")
# the same in Arrow: a batch whose column is all None must not get Arrow's null type
DOC_ARROW = pa.schema([("src", pa.string()), ("doc", pa.int64()), ("bytes", pa.int64()),
                       ("exact", pa.binary()), ("signature", pa.binary()),
                       ("bands", pa.list_(pa.binary())), ("rule", pa.string())])
MAX_ROUNDS = 30  # label propagation rounds; clusters are near-stars, they settle in 2-3


class Rule(NamedTuple):
    """A quality filter: ``data.filters.<setting>`` bounds ``quality.quality``'s ``measure``."""

    setting: str
    measure: str
    is_min: bool  # the setting is a lower bound


RULES = (
    Rule("min_words", "words", True),
    Rule("max_words", "words", False),
    Rule("max_non_alpha_words", "non_alpha_words", False),
    Rule("max_symbol_word_ratio", "symbol_word_ratio", False),
    Rule("max_dup_lines", "dup_lines", False),
    Rule("max_dup_line_chars", "dup_line_chars", False),
    Rule("max_top_2gram_chars", "top_2gram_chars", False),
    Rule("max_dup_5gram_chars", "dup_5gram_chars", False),
    Rule("max_mean_line_length", "mean_line_length", False),
)


@dataclass(frozen=True)
class Measure:
    """The executors' pass over whole documents (``mapInArrow``): ``src, doc, lines`` (the lines'
    bytes in order) in, ``DOC_SCHEMA`` out. Plain values only: Spark pickles it."""

    rules: tuple[tuple[str, str, bool, float], ...]  # active filters: setting, measure, min, bound
    exact: bool
    lower: bool
    whitespace: bool
    near: bool
    shingle: str
    ngram: int
    num_perm: int
    seed: int
    banding: minhash.Banding | None

    @classmethod
    def of(cls, data: DataSettings, seed: int) -> Measure:
        filters = data.filters
        rules = tuple((r.setting, r.measure, r.is_min, float(getattr(filters, r.setting)))
                      for r in RULES if getattr(filters, r.setting) is not None)
        near = data.dedup == "near"
        banding = minhash.Banding.for_threshold(data.dedup_threshold, data.dedup_num_perm)
        # near runs exact first: equal documents need no MinHash to be found
        return cls(rules, data.dedup != "none", data.dedup_lowercase, data.dedup_whitespace,
                   near, data.dedup_shingle, data.dedup_ngram, data.dedup_num_perm, seed,
                   banding if near else None)

    def __call__(self, batches):
        a, b = minhash.permutations(self.num_perm, self.seed)
        for batch in batches:
            out = {name: [] for name in ("src", "doc", "bytes", "exact", "signature", "bands",
                                         "rule")}
            for src, doc, lines in zip(*(batch.column(c).to_pylist()
                                         for c in ("src", "doc", "lines"))):
                raw = b"\n".join(line["raw"] or b"" for line in lines)
                text = decode(raw)[0]
                signature = None
                if self.near:
                    signature = minhash.minhash(
                        minhash.shingles(text, self.ngram, self.shingle), a, b)
                out["src"].append(src)
                out["doc"].append(doc)
                out["bytes"].append(len(raw))
                out["exact"].append(minhash.exact_key(text, self.lower, self.whitespace)
                                    if self.exact else None)
                out["signature"].append(None if signature is None else signature.tobytes())
                out["bands"].append(None if signature is None else self.banding.keys(signature))
                out["rule"].append(self.failed_rule(text))
            yield pa.RecordBatch.from_pydict(out, schema=DOC_ARROW)

    def failed_rule(self, text: str) -> str | None:
        """The first active filter ``text`` fails, or None."""
        if not self.rules:
            return None
        measures = quality.quality(text)
        for setting, measure, is_min, bound in self.rules:
            value = measures[measure]
            if (value < bound) if is_min else (value > bound):
                return setting
        return None


@dataclass
class Curated:
    """What curation hands on: every line with its ``doc`` (``keyed``), the kept documents
    (``documents``: ``src, doc, bytes``, and their measures when a rule is on), the removed ones
    (``src, doc, bytes, reason, kept_src, kept_doc``: the kept copy of a duplicate) and the
    figures, stage by stage."""

    keyed: DataFrame
    documents: DataFrame
    removed: DataFrame | None = None
    report: dict = field(default_factory=lambda: {"stages": []})

    @property
    def lines(self) -> DataFrame:
        """The lines to encode, with their ``doc``, in file order (the encoder reads them so)."""
        if self.removed is None:  # keyed keeps the read's order (a broadcast join, no shuffle)
            return self.keyed
        kept = self.keyed.join(self.removed.select("src", "doc"), ["src", "doc"], "left_anti")
        return kept.repartition("src", "block").sortWithinPartitions("src", "block", "line")

    def drop(self, stage: str, gone: DataFrame, reason: str | None = None) -> None:
        """Remove the documents ``gone`` (``src, doc, bytes``, with ``reason, kept_src,
        kept_doc`` unless ``reason`` names one for all), counted as ``stage``."""
        if reason is not None:
            gone = gone.select("src", "doc", "bytes", F.lit(reason).alias("reason"), *_no_copy())
        gone = detached(gone)
        before = self.documents
        total = before.agg(F.count("*").alias("n"), F.sum("bytes").alias("bytes")).first()
        reasons = sorted(gone.groupBy("reason").agg(
            F.count("*").alias("n"), F.sum("bytes").alias("bytes")).collect())
        self.documents = detached(before.join(gone.select("src", "doc"), ["src", "doc"],
                                              "left_anti"))
        self.removed = gone if self.removed is None else self.removed.unionByName(gone)
        bytes_in = total.bytes or 0
        figures = {"stage": stage, "documents_in": total.n, "bytes_in": bytes_in,
                   "documents_out": total.n - sum(r.n for r in reasons),
                   "bytes_out": bytes_in - sum(r.bytes for r in reasons),
                   "removed": {r.reason: r.n for r in reasons},
                   "removed_bytes": {r.reason: r.bytes for r in reasons}}
        if stage in ("exact", "near"):
            figures["clusters"] = cluster_figures(gone)
        stages = self.report["stages"]
        stages.append(figures)
        self.report |= {"documents_in": stages[0]["documents_in"],
                        "bytes_in": stages[0]["bytes_in"],
                        "documents_out": figures["documents_out"],
                        "bytes_out": figures["bytes_out"]}

    def sample(self, per_reason: int = 3, lines: int = 8) -> list[dict]:
        """A few removed documents per reason (the least ``(src, doc)``), their first ``lines``
        lines: for a person to look at."""
        if self.removed is None:
            return []
        first = Window.partitionBy("reason").orderBy("src", "doc")
        picked = self.removed.withColumn("rank", F.row_number().over(first)).where(
            F.col("rank") <= per_reason).drop("rank", "bytes")
        texts = picked.join(self.keyed, ["src", "doc"]).groupBy(*picked.columns).agg(
            F.slice(F.sort_array(F.collect_list(F.struct("block", "line", "raw"))), 1, lines)
            .alias("lines"))
        out = [{name: row[name] for name in picked.columns}
               | {"text": decode(b"\n".join(line.raw or b"" for line in row.lines))[0]}
               for row in texts.collect()]
        return sorted(out, key=lambda r: (r["reason"], r["src"], r["doc"]))


def active(data: DataSettings) -> bool:
    """Whether any rule can remove a document (else curation only numbers them)."""
    filters = data.filters
    return (data.dedup != "none" or filters.score_path is not None
            or any(getattr(filters, r.setting) is not None for r in RULES))


def curate(spark: SparkSession, lines: DataFrame, data: DataSettings, document_split: str,
           seed: int) -> Curated:
    """The curation stage: ``lines`` (``src, block, raw``) in; see ``Curated``."""
    keyed = document_keys(spark, lines, document_split)
    by_document = keyed.where(F.col("doc") >= 0).groupBy("src", "doc")
    if not active(data):  # only counted: no document is put together
        return Curated(keyed, by_document.agg(F.sum(F.length("raw") + 1).alias("bytes")))
    grouped = by_document.agg(F.sort_array(F.collect_list(F.struct("line", "raw"))).alias("lines"))
    docs = with_score_rule(spark, grouped.mapInArrow(Measure.of(data, seed), DOC_SCHEMA), data)
    curated = Curated(keyed, detached(docs))
    curated.drop("filters", curated.documents.where(F.col("rule").isNotNull()).select(
        "src", "doc", "bytes", F.col("rule").alias("reason"), *_no_copy()))
    if data.dedup != "none":
        curated.drop("exact", exact_duplicates(curated.documents))
    if data.dedup == "near":
        curated.drop("near", near_duplicates(curated.documents, data.dedup_threshold))
    return curated


def _no_copy() -> list:
    """A filtered document is no copy: no kept document."""
    return [F.lit(None).cast("string").alias("kept_src"),
            F.lit(None).cast("long").alias("kept_doc")]


def cluster_figures(gone: DataFrame) -> dict:
    """Duplicate clusters (a kept document and its removed copies): how many, their sizes."""
    sizes = gone.groupBy("kept_src", "kept_doc").agg((F.count("*") + 1).alias("size"))
    hist = {r.size: r.n for r in sizes.groupBy("size").agg(F.count("*").alias("n")).collect()}
    return {"count": sum(hist.values()), "largest": max(hist, default=0),
            "documents": sum(size * n for size, n in hist.items()),
            "sizes": {str(size): hist[size] for size in sorted(hist)}}


def with_score_rule(spark: SparkSession, docs: DataFrame, data: DataSettings) -> DataFrame:
    """``docs`` whose ``rule`` is also ``score`` where the score file's mean loss is above the
    bound (``max_score``, or the ``max_score_quantile`` of the file's losses)."""
    filters = data.filters
    if filters.score_path is None:
        return docs
    scores = read_scores(spark, filters.score_path)
    bound = filters.max_score
    if bound is None:
        bound = scores.approxQuantile("mean_loss", [filters.max_score_quantile], 0.0)[0]
    log.info("score filter: documents with a mean loss above %.4f go (%s)", bound,
             filters.score_path)
    joined = docs.join(scores, ["src", "doc"], "left")
    over = F.when(F.col("mean_loss") > bound, F.lit("score"))
    return joined.select(*[c for c in docs.columns if c != "rule"],
                         F.coalesce(F.col("rule"), over).alias("rule"))


SCORE_COLUMNS = ("path", "doc", "mean_loss")


def read_scores(spark: SparkSession, path: str) -> DataFrame:
    """``src, doc, mean_loss`` of a score file, or one line saying what it lacks."""
    try:
        scores = spark.read.parquet(hadoop_literal(path))
    except Exception as err:  # Spark's AnalysisException: no such path, not Parquet
        raise InputError(f"data.filters.score_path={path}: cannot be read as Parquet "
                         f"({first_line(err)}); give the document_scores.parquet "
                         "of python -m raydp_llm.evaluate per_document=true") from None
    missing = [c for c in SCORE_COLUMNS if c not in scores.columns]
    if missing:
        raise InputError(f"data.filters.score_path={path}: no {', '.join(missing)} column; give "
                         "the document_scores.parquet of python -m raydp_llm.evaluate "
                         "per_document=true")
    return scores.select(F.col("path").alias("src"), "doc", "mean_loss")


def exact_duplicates(docs: DataFrame) -> DataFrame:
    """All but the least ``(src, doc)`` of each exact key, with the kept one."""
    order = Window.partitionBy("exact").orderBy("src", "doc")
    ranked = docs.select("src", "doc", "bytes", "exact",
                         F.row_number().over(order).alias("rank"),
                         F.first("src").over(order).alias("kept_src"),
                         F.first("doc").over(order).alias("kept_doc"))
    return ranked.where(F.col("rank") > 1).select(
        "src", "doc", "bytes", F.lit("exact_duplicate").alias("reason"), "kept_src", "kept_doc")


def near_duplicates(docs: DataFrame, threshold: float) -> DataFrame:
    """All but the least member of each cluster of near duplicates, with that member."""
    doc_id = F.struct("src", "doc")
    members = docs.select(doc_id.alias("id"), F.posexplode("bands").alias("band", "key"))
    buckets = members.groupBy("band", "key").agg(
        F.min("id").alias("head"), F.collect_set("id").alias("ids")).where(F.size("ids") > 1)
    candidates = buckets.select("head", F.explode("ids").alias("id")).where(
        F.col("head") != F.col("id")).distinct()
    signatures = docs.select(doc_id.alias("id"), "signature")
    pairs = (candidates
             .join(signatures.withColumnRenamed("id", "head")
                   .withColumnRenamed("signature", "head_signature"), "head")
             .join(signatures, "id"))
    pair = "head struct<src:string,doc:long>, id struct<src:string,doc:long>"
    edges = detached(pairs.mapInArrow(_agreeing(threshold), pair))
    labels = components(edges)
    sizes = docs.select(doc_id.alias("id"), "src", "doc", "bytes")
    return labels.where(F.col("label") != F.col("id")).join(sizes, "id").select(
        "src", "doc", "bytes", F.lit("near_duplicate").alias("reason"),
        F.col("label.src").alias("kept_src"), F.col("label.doc").alias("kept_doc"))


def _agreeing(threshold: float):
    """The candidate pairs whose MinHash signatures agree on at least ``threshold`` of their
    values (the estimate of their Jaccard similarity)."""

    def keep(batches):
        for batch in batches:
            if batch.num_rows == 0:
                continue
            width = len(batch.column("signature")[0].as_py())
            mine = np.frombuffer(b"".join(batch.column("signature").to_pylist()), np.uint32)
            theirs = np.frombuffer(b"".join(batch.column("head_signature").to_pylist()),
                                   np.uint32)
            agree = (mine == theirs).reshape(batch.num_rows, width // 4).mean(axis=1)
            chosen = pa.array(agree >= threshold)
            yield pa.RecordBatch.from_arrays(
                [batch.column("head").filter(chosen), batch.column("id").filter(chosen)],
                names=["head", "id"])

    return keep


def components(edges: DataFrame) -> DataFrame:
    """``id, label``: each node of the undirected ``edges`` (``head, id``) and the least node of
    its connected component, by least-label propagation (a Spark join per round)."""
    both = edges.select(F.col("head").alias("a"), F.col("id").alias("b")).unionByName(
        edges.select(F.col("id").alias("a"), F.col("head").alias("b")))
    labels = detached(both.groupBy("a").agg(F.min("b").alias("b")).select(
        F.col("a").alias("id"), F.least("a", "b").alias("label")))
    for _ in range(MAX_ROUNDS):
        heard = both.join(labels.withColumnRenamed("id", "a"), "a").groupBy(
            F.col("b").alias("id")).agg(F.min("label").alias("heard"))
        new = detached(labels.join(heard, "id", "left").select(
            "id", F.least("label", F.coalesce("heard", "label")).alias("label")))
        changed = new.join(labels.withColumnRenamed("label", "old"), "id").where(
            F.col("label") != F.col("old")).count()
        labels = new
        if changed == 0:
            return labels
    log.warning("near-duplicate clusters still merging after %d rounds: some clusters may keep "
                "more than one member", MAX_ROUNDS)
    return labels
