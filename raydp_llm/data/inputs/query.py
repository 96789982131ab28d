"""``data.query``: documents (``data.format=sql``) or conversations (chat) as the rows of a Spark
SQL query, over the session's catalog (Hive support on: ``engines/spark.py``) or files
(``parquet.`/path```). The query is checked (``query_rows``), its input files listed with their
sizes and modification times for the ETL cache key (``query_corpus``), and its rows tagged
``src, block`` as the file readers tag theirs (``read_query``)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from typing import Callable, Iterable, Iterator

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from raydp_llm.core.config import DataSettings, PromptTable
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.data.inputs.files import Corpus, local_path

log = logging.getLogger(__name__)

SRC = "query"  # every row's ``src``: the manifest's one "file"
NAME_CHARS = 80  # of the query's text in the corpus name


def query_rows(spark: SparkSession, data: DataSettings | PromptTable,
               columns: Iterable[str] = ()) -> DataFrame:
    """The rows of ``data.query``, planned and checked: a query Spark rejects, a result without one
    of ``columns``, or one without rows is one line. A chat reader passes its own columns, batch
    answers (``generate``'s ``PromptTable``) its prompt column."""
    with rejected():
        rows = spark.sql(data.query)
    for column in columns:
        if column not in rows.columns:
            raise InputError(f"data.query: its result has no column {column} (it has "
                             f"{', '.join(rows.columns)}); select one AS {column}, or set the "
                             "column's setting (data.text_column) to one of those")
    with rejected():  # runs the query until its first row: errors at run time show here
        empty = rows.isEmpty()
    if empty:
        raise InputError(f"data.query: the query returns no rows ({short(data.query)}); check its "
                         "tables and its WHERE clause")
    return rows


@contextlib.contextmanager
def rejected() -> Iterator[None]:
    """An error Spark raised for the query as one line: parsing and analysis (a
    ``CapturedException``: Spark's first line says what), or its tasks failing (the JVM's
    innermost cause, under the stage's failure)."""
    try:
        yield
    except CapturedException as err:
        raise InputError(f"data.query: {first_line(err, 300)}; fix the query") from None
    except Py4JJavaError as err:
        cause = err.java_exception
        while cause.getCause() is not None:
            cause = cause.getCause()
        what = f"{cause.getClass().getSimpleName()}: {cause.getMessage()}"
        raise InputError(f"data.query failed as it ran: {first_line(what, 300)}; fix the "
                         "query") from None


def read_query(spark: SparkSession, data: DataSettings,
               text: Callable[[DataFrame], Column] | None = None) -> DataFrame:
    """``src, block, text``: each row's ``data.text_column`` a document (or what ``text`` makes of
    the rows: a chat reader's conversation), ``src`` the query, ``block`` the row's partition (the
    later stages number documents per ``src, block``)."""
    rows = query_rows(spark, data, [] if text else [data.text_column])
    column = text(rows) if text else F.col(data.text_column)
    block = F.spark_partition_id().cast("long")
    tagged = rows.select(F.lit(SRC).alias("src"), block.alias("block"),
                         column.cast("binary").alias("text"))
    # The ETL reads its lines in several passes, and numbers documents by their order within a
    # partition: a query with a shuffle (a join, a GROUP BY) need not give the same order twice, and
    # may be costly to run again. Its result is kept, spilling to disk, and made now: an error as
    # its rows are made (the text column's expression) is one line here, not the scan's traceback.
    tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
    with rejected():
        tagged.count()
    return tagged


def query_corpus(spark: SparkSession, data: DataSettings) -> Corpus:
    """The query as the ETL's corpus: no files to read, but the files its tables are made of as its
    fingerprints (the ETL cache key), or none where Spark cannot list them (``listed`` false).
    Planned only: ``read_query`` runs and checks it, on a cache miss."""
    with rejected():
        inputs = spark.sql(data.query).inputFiles()
    fingerprints = [] if not inputs else input_fingerprints(spark, inputs)
    return Corpus(files=[], markdown=False, name=f"query: {short(data.query)}",
                  fingerprints=fingerprints)


def listed(corpus: Corpus) -> bool:
    """Whether a query's corpus has its input files' fingerprints (else no cache key holds it)."""
    return bool(corpus.fingerprints) and corpus.fingerprinted


def input_fingerprints(spark: SparkSession, uris: list[str]) -> list[dict]:
    """Path, size and modification time of each input file: local files from the OS (as the file
    readers' corpus has them), other URIs from Hadoop's FileSystem (milliseconds); a file Hadoop
    cannot describe has none (the cache is then off)."""
    out = []
    for uri in sorted(set(uris)):
        if uri.startswith("file:"):
            path = local_path(uri)
            st = os.stat(path)
            out.append({"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        else:
            out.append(_hadoop_fingerprint(spark, uri))
    return out


def _hadoop_fingerprint(spark: SparkSession, uri: str) -> dict:
    jvm, context = spark.sparkContext._jvm, spark.sparkContext._jsc
    path = jvm.org.apache.hadoop.fs.Path(uri)
    try:
        status = path.getFileSystem(context.hadoopConfiguration()).getFileStatus(path)
    except Exception as err:  # noqa: BLE001 - any failure (py4j's): unlisted, so no cache
        log.debug("no fingerprint for %s: %s", uri, first_line(err, 200))
        return {"path": uri, "size": None, "mtime_ns": None}
    return {"path": uri, "size": status.getLen(), "mtime_ns": status.getModificationTime() * 10**6}


def short(query: str) -> str:
    """The query's text on one line, cut to ``NAME_CHARS`` characters (with its hash when cut)."""
    text = " ".join(query.split())
    if len(text) <= NAME_CHARS:
        return text
    return f"{text[:NAME_CHARS]}… #{hashlib.sha256(query.encode()).hexdigest()[:8]}"

