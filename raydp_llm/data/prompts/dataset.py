"""The prompts of learning from rewards (``data.format=prompts``, ``train.objective=grpo``): read by
Spark, rendered and tokenized in the executors (``prompts/encode.py``), numbered, split into
training and validation, and handed to Ray's object store (``ray.data.from_spark``) for the workers,
each of which reads a split whole (``PromptSource.table``): prompts are rows, not a token stream.

A prompt's number (``index``) is its place in the table's order (file name, input split, row), the
same on every run over the same inputs: it seeds its answers' random streams
(training/objectives/rollout.py)
and places it in the validation split (a seeded draw per number, ``data.val_fraction``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from raydp_llm.core.config import DataSettings, Settings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import Tokenizer, load_tokenizer
from raydp_llm.data.chat.template import ChatTemplate, model_template, resolve_template
from raydp_llm.data.etl.read import read_lines
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.left_out import LeftOut
from raydp_llm.data.prompts import encode as prompt_encode

log = logging.getLogger(__name__)

# a numbered prompt as the workers read it: its number, its ids (int32 bytes), its rendered text,
# its other columns (a JSON object)
TABLE_SCHEMA = pa.schema([("index", pa.int64()), ("ids", pa.binary()), ("text", pa.string()),
                          ("columns", pa.string())])
SPLITS = ("train", "val")
# what the prompts' ETL reads of data.* (in the manifest: the run's fingerprint holds it)
ETL_SETTINGS = ("path", "query", "prompt_column", "messages_column", "chat_template",
                "val_fraction", "overlong")


@dataclass(frozen=True)
class PromptSource:
    """One split's prompts in Ray's object store: its Arrow blocks and its count."""

    refs: list
    count: int

    def table(self) -> pa.Table:
        """The split whole, in the table's order."""
        import ray

        tables = [t for t in ray.get(self.refs) if t.num_rows]
        table = pa.concat_tables(tables) if tables else TABLE_SCHEMA.empty_table()
        return table.sort_by("index")


@dataclass
class PromptManifest:
    """What the prompts' ETL made (``manifest.json``): the rows read and kept, why the others were
    left out, the split's counts, the template and tokenizer."""

    corpus: str
    counts: dict  # verdict -> rows (prompt_encode's verdicts)
    splits: dict  # split -> prompts
    template: str | None
    tokenizer: str
    vocab_size: int
    limit: int = 0  # the most tokens a prompt keeps
    settings: dict = field(default_factory=dict)  # the data settings the ETL read
    etl_key: str | None = None  # the trackers' data key (None: the prompts are not cached)
    table: dict | None = None  # data.table's snapshot (inputs/tables.py), as the ETL manifest's

    @property
    def chat(self) -> dict:
        """The left-out counts as ``left_out.LeftOut`` reads them."""
        c = self.counts
        return {"prompts": c.get("kept", 0) + c.get("truncated", 0), "record_tokens": self.limit,
                "too_long": c.get("overlong", 0), "no_prompt": c.get("no_prompt", 0),
                "not_json": c.get("not_json", 0)}

    def to_json(self) -> dict:
        return {"format": "prompts", "corpus": self.corpus, "rows": self.counts,
                "prompts": self.splits, "template": self.template, "tokenizer": self.tokenizer,
                "vocab_size": self.vocab_size, "prompt_tokens_limit": self.limit,
                "settings": self.settings,
                "left_out": LeftOut.of(self.chat).to_json()} | (
                    {} if self.table is None else {"table": self.table})


@dataclass
class PromptData:
    """A GRPO run's data: the tokenizer, the manifest, each split's prompts in the object store."""

    tokenizer: Tokenizer
    manifest: PromptManifest
    sources: dict[str, PromptSource]
    template: ChatTemplate | None
    cache_hit: bool = False
    stats: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def splits(self) -> dict[str, PromptSource]:
        return self.sources

    def manifest_json(self) -> dict:
        return self.manifest.to_json()


def prompt_template(data: DataSettings, model_dir: str | None) -> ChatTemplate | None:
    """What renders the prompts: ``data.chat_template`` when given, else the model's own (its
    directory's), else none (the prompt column's raw text)."""
    if data.chat_template is not None:
        return resolve_template(data.chat_template, model_dir)
    return model_template(model_dir) if model_dir else None


def model_dir_of(settings: Settings) -> str | None:
    """The directory of the model's tokenizer (and template): model=hf's, or tokenizer.path's."""
    path = getattr(settings.model, "path", None) or settings.tokenizer.path
    if path and Path(path).is_file():
        return str(Path(path).parent)
    return path


def prompt_limit(settings: Settings) -> int:
    """The most tokens a prompt keeps: the block, less the answer's room."""
    return settings.model.block_size - settings.grpo.max_new_tokens


def prompt_tools(settings: Settings) -> tuple[Tokenizer, ChatTemplate | None]:
    """The tokenizer and the template the prompts are rendered and tokenized with."""
    tokenizer = load_tokenizer(Path(settings.tokenizer.path))
    return tokenizer, prompt_template(settings.data, model_dir_of(settings))


def run_prompts_etl(spark: SparkSession, settings: Settings, corpus: Corpus, tokenizer: Tokenizer,
                    template: ChatTemplate | None) -> PromptData:
    """The prompts read, rendered by ``template`` and tokenized in the executors, numbered and
    split, and handed to Ray's object store; Spark's copy released."""
    data = settings.data
    limit = prompt_limit(settings)
    lines = read_lines(spark, corpus, data, S3Options.of(settings.s3))
    encoder = prompt_encode.PromptEncoder(tokenizer, template, data, limit)
    encoded = lines.mapInArrow(encoder, from_arrow_schema(prompt_encode.PROMPT_SCHEMA)).persist()
    try:
        counts = {r["verdict"]: r["count"] for r in encoded.groupBy("verdict").count().collect()}
        table = numbered(spark, encoded, settings.seed, data.val_fraction)
        sources = {name: handed_to_ray(table.where(F.col("val") == (name == "val")))
                   for name in SPLITS}
    finally:
        encoded.unpersist()
    read = {k: getattr(data, k) for k in ETL_SETTINGS} | {"seed": settings.seed,
                                                          "inputs": corpus.fingerprints}
    manifest = PromptManifest(corpus.name, counts, {k: s.count for k, s in sources.items()},
                              template and template.name, tokenizer.kind, tokenizer.vocab_size,
                              limit=limit, settings=read, table=corpus.table)
    log_counts(sources, counts)
    return PromptData(tokenizer, manifest, sources, template)


def log_counts(sources: dict[str, PromptSource], counts: dict) -> None:
    """The line saying how many prompts each split holds, and what became of the rows read."""
    log.info("prompts: %s training, %s validation (rows: %s)", sources["train"].count,
             sources["val"].count, json.dumps(counts))


def numbered(spark: SparkSession, encoded: DataFrame, seed: int, val_fraction: float
             ) -> DataFrame:
    """The kept prompts in the table's order (file, input split, row), numbered from 0, each with
    its split: validation where a draw seeded by (seed, number) falls below ``val_fraction``."""
    kept = encoded.where(F.col("verdict").isin(prompt_encode.KEPT, prompt_encode.TRUNCATED))
    ordered = kept.orderBy("src", "block", "row").select("ids", "text", "columns")

    def placed(pair):
        row, index = pair
        return (index, in_validation(seed, index, val_fraction), row.ids, row.text, row.columns)

    rows = ordered.rdd.zipWithIndex().map(placed)
    return spark.createDataFrame(rows, "index long, val boolean, ids binary, text string, "
                                       "columns string")


def in_validation(seed: int, index: int, val_fraction: float) -> bool:
    """Whether prompt ``index`` is held out: a uniform draw seeded by (seed, index)."""
    return bool(np.random.default_rng([seed, index]).random() < val_fraction)


def handed_to_ray(split: DataFrame) -> PromptSource:
    """A split's rows (``TABLE_SCHEMA``) materialized in Ray's object store, Spark's copy
    released."""
    import ray.data
    from raydp.spark import release_spark_recoverable

    from raydp_llm.engines import raydp_fixes

    raydp_fixes.install()
    df = split.select(*TABLE_SCHEMA.names)
    dataset = ray.data.from_spark(df).materialize()
    release_spark_recoverable(df)
    return PromptSource(dataset.to_arrow_refs(), dataset.count())


def check_train_prompts(data: PromptData, batch_size: int) -> None:
    """One line when the training split has fewer prompts than a batch."""
    found = data.sources["train"].count
    if found < batch_size:
        raise InputError(f"train.batch_size={batch_size}: data.path has {found} training "
                         "prompts, fewer than one batch; lower train.batch_size or give more "
                         "prompts")
