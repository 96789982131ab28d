"""The ETL's first stage, *read*: one row per line (or per document) with its file and the start of
its input split (``src``, ``block``), so huge files are split and read in parallel; markdown is
stripped in the JVM. Each ``data.format`` has its reader (``formats.py``)."""

from __future__ import annotations

import functools

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.chat.template import ChatTemplate
from raydp_llm.data.etl.formats import ChatReader, reader_for
from raydp_llm.data.inputs import arrow_reader
from raydp_llm.data.inputs.arrow_reader import NATIVE_ONLY
from raydp_llm.data.inputs.files import Corpus

# Markdown → plain text, line by line in the JVM: **SPEAKER** lines, headings, emphasis, escapes,
# hard breaks.
_MARKDOWN_RULES = [
    (r"^\*\*(.+?)\*\* *$", "$1:"),
    (r"^#+ *", ""),
    (r"[*_]", ""),
    (r"\\(.)", "$1"),
    (r" +$", ""),
]


def read_lines(spark: SparkSession, corpus: Corpus, data: DataSettings, s3: S3Options) -> DataFrame:
    """``src, block, text``: one row per line (text, ids, jsonl) or per row (Parquet's
    ``data.text_column``), as bytes, tagged with its file and the start of its input split. Spark's
    readers read local files and the URIs Hadoop knows (``.gz`` and ``.bz2`` decompressed);
    ``s3://`` objects and ``.zst`` files are read in the executors with pyarrow (``arrow_reader``).

    Lines stay bytes until the executors decode them (``decode``): Spark does not check UTF-8.
    """
    if data.query is not None:  # sql (or chat): no files, the reader reads the query's rows
        return spark_read(spark, [], data, corpus.name)
    native_only = [f for f in corpus.files
                   if f.lower().endswith(NATIVE_ONLY) and not arrow_reader.reads(f)]
    if native_only:
        raise InputError(f"{native_only[0]}: Spark's Hadoop reads {NATIVE_ONLY[0]} files only with "
                         "its native library, which pip's pyspark lacks; decompress it, recompress "
                         "it as .gz or .bz2, or copy it to local disk or S3")
    ours = [(f, corpus.sizes.get(f)) for f in corpus.files if arrow_reader.reads(f)]
    sparks = [f for f in corpus.files if not arrow_reader.reads(f)]
    reader = reader_for(data)
    rows_as_json = isinstance(reader, ChatReader)  # chat, preference, prompts: Parquet as JSON
    picks = (lambda names, uri: reader.columns(names, data, uri)) if rows_as_json else None
    parts = ([spark_read(spark, sparks, data, corpus.name)] if sparks else []) + \
            ([arrow_reader.read_corpus(spark, ours, data, s3, picks)] if ours else [])
    return functools.reduce(DataFrame.unionByName, parts)


def spark_read(spark: SparkSession, files: list[str], data: DataSettings, name: str) -> DataFrame:
    """``src, block, text``: what Spark's own readers (text, Parquet) make of local files and Hadoop
    URIs."""
    return reader_for(data).spark_read(spark, files, data, name)


def documents(lines: DataFrame, corpus: Corpus, data: DataSettings,
              template: ChatTemplate | None = None) -> DataFrame:
    """``src, block, raw``: what the ETL encodes, a line or a document per row, as bytes; JSON
    Lines are parsed (``raw`` is the ``data.text_column`` string) and each line's verdict kept
    (``bad``); chat rows are rendered with ``template``; markdown is stripped in the JVM."""
    reader = reader_for(data)
    lines = reader.parse(lines, data, template)
    text = F.col("text")
    if corpus.markdown:
        text = text.cast("string")
        for pattern, replacement in _MARKDOWN_RULES:
            text = F.regexp_replace(text, pattern, replacement)
    return lines.select("src", "block", text.cast("binary").alias("raw"), *reader.verdicts)
