"""One reader per ``data.format``: how Spark's own readers read its files into ``src, block, text``
rows, what a row is (a line, or a whole document), and the facts the later stages need of it. The
stages ask the reader (``reader_for``), never ``data.format``."""

from __future__ import annotations

import functools
import logging

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.data import jsonl
from raydp_llm.data.chat.template import ChatTemplate, Renderer
from raydp_llm.data.etl.records import FileStats
from raydp_llm.data.inputs import query
from raydp_llm.data.inputs.files import hadoop_literal
from raydp_llm.data.preference.pairs import PairRenderer

log = logging.getLogger(__name__)


def tagged(df: DataFrame, text: Column) -> DataFrame:
    """``src, block, text``: each row's file, the start of its input split, its text as bytes."""
    return df.select(F.input_file_name().alias("src"), F.input_file_block_start().alias("block"),
                     text.cast("binary").alias("text"))


class TextReader:
    """``data.format=text``: lines of text; documents end as ``data.document_split`` says."""

    rows_are_documents = False  # a Parquet row or a JSON line is a document
    token_ids = False  # the lines hold token ids: no tokenizer to build, no text to check
    chat = False  # rows are rendered conversations: encoded, masked and packed into records
    pairs = False  # rows are rendered preference pairs: each two records
    verdicts: tuple[str, ...] = ()  # columns the parse adds for the scan to count

    def spark_read(self, spark: SparkSession, files: list[str], data: DataSettings,
                   name: str) -> DataFrame:
        """``src, block, text``: what Spark's text reader makes of local files and Hadoop URIs."""
        return tagged(spark.read.text([hadoop_literal(f) for f in files]), F.col("value"))

    def parse(self, lines: DataFrame, data: DataSettings,
              template: ChatTemplate | None = None) -> DataFrame:
        """The lines as read (``src, block, text``) → one text per row, plus ``verdicts``
        (``template``: the chat reader's)."""
        return lines

    def document_split(self, data: DataSettings) -> str:
        return "line" if self.rows_are_documents else data.document_split

    def check(self, read: DataFrame, files: dict[str, FileStats], data: DataSettings) -> None:
        """What only this format can find wrong in the scanned files (``read``: the lines as
        read)."""

    def manifest_facts(self, files: dict[str, FileStats]) -> dict:
        """This format's own entries of ``manifest.json``, placed before the others."""
        return {}


class IdsReader(TextReader):
    """``data.format=ids``: lines of whitespace-separated integer token ids, read as text."""

    token_ids = True


class ParquetReader(TextReader):
    """``data.format=parquet``: each row's ``data.text_column`` is a document."""

    rows_are_documents = True

    def spark_read(self, spark: SparkSession, files: list[str], data: DataSettings,
                   name: str) -> DataFrame:
        df = spark.read.parquet(*map(hadoop_literal, files))
        if data.text_column not in df.columns:
            raise InputError(f"data.text_column={data.text_column}: no such column in {name}; its "
                             f"columns are {', '.join(df.columns)}")
        return tagged(df, F.col(data.text_column))


class SqlReader(TextReader):
    """``data.format=sql``: each row of ``data.query`` is a document, its ``data.text_column`` the
    text (``query.py``)."""

    rows_are_documents = True

    def spark_read(self, spark: SparkSession, files: list[str], data: DataSettings,
                   name: str) -> DataFrame:
        return query.read_query(spark, data)


class JsonLinesReader(TextReader):
    """``data.format=jsonl``: each line a JSON object whose ``data.text_column`` is a document,
    parsed in the executors (``jsonl.py``); each line's verdict is kept (``bad``) and counted."""

    rows_are_documents = True
    verdicts = ("bad",)

    def parse(self, lines: DataFrame, data: DataSettings,
              template: ChatTemplate | None = None) -> DataFrame:
        return jsonl.documents(lines, data.text_column)

    def check(self, read: DataFrame, files: dict[str, FileStats], data: DataSettings) -> None:
        """Bad JSON lines: with ``data.strict_json`` an error naming the first one's file and line,
        else a warning (``manifest.json`` counts them per file and kind)."""
        bad = json_counts(files)["files"]
        if not bad:
            return
        src = next(iter(bad))
        if data.strict_json:
            line, kind, head = jsonl.first_bad_line(read, src, data.text_column)
            what = jsonl.WHAT[kind].format(column=data.text_column)
            raise InputError(f"{src}: line {line} {what} ({head.decode(errors='replace')[:60]!r}); "
                             "fix it, or set data.strict_json=false to skip and count bad lines")
        log.warning("skipped %d bad JSON lines in %d files, first in %s (manifest.json counts them "
                    "per file and kind; data.strict_json=true refuses them)", sum(bad.values()),
                    len(bad), src)

    def manifest_facts(self, files: dict[str, FileStats]) -> dict:
        return {"bad_json_lines": json_counts(files)}


def json_counts(files: dict[str, FileStats]) -> dict:
    """Bad JSON lines by kind, and per file (files with none left out)."""
    per_file = {src: f.bad_json_lines() for src, f in sorted(files.items())}
    return {kind: sum(getattr(f, kind) for f in files.values()) for kind in jsonl.BAD_KINDS} | {
        "files": {src: n for src, n in per_file.items() if n}}


class ChatReader(TextReader):
    """``data.format=chat``: each row a conversation (a JSON line, or a Parquet row, by the
    ``.parquet`` extension), rendered with the chat template in the executors (``chat.Renderer``):
    ``text`` is the rendered conversation, its assistant turns' spans marked (``chat.OPEN``)."""

    rows_are_documents = True
    chat = True

    def spark_read(self, spark: SparkSession, files: list[str], data: DataSettings,
                   name: str) -> DataFrame:
        """JSON lines as text; Parquet rows (and ``data.query``'s) as JSON objects of the chat
        columns (Spark's ``to_json``), so all render alike."""
        if data.query is not None:
            return query.read_query(spark, data, lambda rows: F.to_json(F.struct(
                *self.columns(rows.columns, data, "data.query's result"))))
        parquet = [f for f in files if f.lower().endswith(".parquet")]
        lines = [f for f in files if f not in parquet]
        parts = [tagged(spark.read.text([hadoop_literal(f) for f in lines]), F.col("value"))]
        parts = parts if lines else []
        if parquet:
            df = spark.read.parquet(*map(hadoop_literal, parquet))
            parts.append(tagged(df, F.to_json(F.struct(*self.columns(df.columns, data, name)))))
        return functools.reduce(DataFrame.unionByName, parts)

    def columns(self, columns: list[str], data: DataSettings, name: str) -> list[str]:
        """The columns a table's rows are rendered from (``chat_columns``)."""
        return chat_columns(columns, data, name)

    def parse(self, lines: DataFrame, data: DataSettings,
              template: ChatTemplate | None = None) -> DataFrame:
        if template is None:  # the ETL resolves it (chat_template); a caller forgot
            raise ValueError("the chat reader renders with a template: pass it to parse")
        return lines.mapInArrow(self.renderer(data, template),
                                "src string, block long, text binary")

    def renderer(self, data: DataSettings, template: ChatTemplate):
        """What renders each row in the executors."""
        return Renderer(template, data.messages_column, data.prompt_column, data.response_column)


class PreferenceReader(ChatReader):
    """``data.format=preference``: each row a prompt and two answers (a JSON line, or a Parquet
    row), rendered with the chat template in the executors (``preference.PairRenderer``): ``text``
    is the pair, its sides marked."""

    pairs = True

    def columns(self, columns: list[str], data: DataSettings, name: str) -> list[str]:
        return preference_columns(columns, data, name)

    def renderer(self, data: DataSettings, template: ChatTemplate):
        return PairRenderer(template, data.prompt_column, data.chosen_column,
                            data.rejected_column, strict=data.strict_json)


class PromptsReader(ChatReader):
    """``data.format=prompts``: each row a prompt and the columns the rewards read (a JSON line, or
    a Parquet or query row with all its columns), rendered and tokenized by the prompts' encoder
    (``prompts/encode.py``): not chat records, so not ``chat``."""

    chat = False

    def columns(self, columns: list[str], data: DataSettings, name: str) -> list[str]:
        if data.prompt_column in columns or data.messages_column in columns:
            return columns
        raise InputError(f"data.prompt_column={data.prompt_column}: no such column in {name}, nor "
                         f"data.messages_column={data.messages_column}; its columns are "
                         f"{', '.join(columns)}; name the prompt's column with one of them")


def preference_columns(columns: list[str], data: DataSettings, name: str) -> list[str]:
    """The columns a preference table's rows are rendered from: the chosen and rejected columns,
    and the prompt column when there is one; one line naming the columns found when not."""
    if data.chosen_column in columns and data.rejected_column in columns:
        prompt = [data.prompt_column] if data.prompt_column in columns else []
        return prompt + [data.chosen_column, data.rejected_column]
    raise InputError(f"data.chosen_column={data.chosen_column} and data.rejected_column="
                     f"{data.rejected_column}: {name} lacks them; its columns are "
                     f"{', '.join(columns)}; name the preference columns with those settings "
                     "(and data.prompt_column)")


def chat_columns(columns: list[str], data: DataSettings, name: str) -> list[str]:
    """The columns a chat table's rows are rendered from: the messages column, or the prompt and
    response columns; one line when it has neither."""
    if data.messages_column in columns:
        return [data.messages_column]
    if data.prompt_column in columns and data.response_column in columns:
        return [data.prompt_column, data.response_column]
    raise InputError(f"data.messages_column={data.messages_column}: no such column in {name}, "
                     f"nor data.prompt_column={data.prompt_column} and data.response_column="
                     f"{data.response_column}; its columns are {', '.join(columns)}; name the "
                     "chat columns with those settings")


READERS = {"text": TextReader(), "ids": IdsReader(), "parquet": ParquetReader(),
           "jsonl": JsonLinesReader(), "chat": ChatReader(), "sql": SqlReader(),
           "preference": PreferenceReader(), "prompts": PromptsReader()}


def reader_for(data: DataSettings) -> TextReader:
    """The reader of ``data.format`` (the settings' validation has checked its name)."""
    return READERS[data.format]
