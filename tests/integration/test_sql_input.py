"""``data.format=sql``: documents as the rows of a Spark SQL query, on the real engines (Ray + RayDP
Spark with Hive's catalog in a local warehouse)."""

from __future__ import annotations

import contextlib
import logging

import pyarrow.parquet as pq
import pytest

from helpers.configs import make_config
from helpers.corpora import SQL_DOCS, sql_documents
from helpers.paths import ROOT
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.data import cache
from raydp_llm.data.etl.records import EtlPlan
from raydp_llm.data.etl.run import run_etl
from raydp_llm.data.inputs.query import query_corpus
from raydp_llm.data.prepare import EtlJob, etl_tokenizer, query_job
from raydp_llm.engines.spark_settings import METASTORE_DIR, WAREHOUSE_DIR

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def hive_dir(tmp_path_factory):
    """The run directory of the module's Spark: its warehouse and metastore live there."""
    return tmp_path_factory.mktemp("hive_run")


@pytest.fixture(scope="module")
def spark(ray_cluster, hive_dir):
    """One RayDP Spark session with Hive's catalog for the module."""
    from raydp_llm.engines.spark import spark_session

    with spark_session(make_config().cluster, app_name="test_sql_input", log_dir=hive_dir,
                       hive=True) as session:
        yield session


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql") / "docs.parquet"
    pq.write_table(sql_documents(), path)
    return path


def etl(spark, *overrides: str):
    """The ETL of a query's settings, on the corpus ``prepared`` makes of it once Spark runs."""
    cfg = make_config("model.block_size=16", *overrides)
    check_inputs(cfg)
    return run_etl(spark, EtlPlan.of(cfg, query_corpus(spark, cfg.data)))


def sql(query: str) -> tuple[str, str]:
    """The overrides of a query (quoted for Hydra: it has spaces and quotes)."""
    return "data.format=sql", f'data.query="{query}"'


def key_of(spark, *overrides: str) -> str:
    """The ETL cache key of a query's settings, its input files listed by Spark."""
    cfg = make_config(*overrides)
    corpus = query_corpus(spark, cfg.data)
    return cache.cache_key(corpus, cfg.data, etl_tokenizer(cfg.tokenizer), cfg.seed)


def test_a_where_clause_over_a_parquet_file_selects_its_documents(spark, docs_file):
    out = etl(spark, *sql(f"SELECT text FROM parquet.`{docs_file}` WHERE lang = 'en'"))
    manifest = out.manifest.to_json()
    assert manifest["documents"] == SQL_DOCS // 2
    assert manifest["format"] == "sql" and manifest["document_split"] == "line"
    assert manifest["corpus"].startswith("query: SELECT text FROM parquet.")
    every = etl(spark, *sql(f"SELECT text FROM parquet.`{docs_file}`"))
    assert every.manifest.documents == SQL_DOCS
    assert every.manifest.characters > manifest["characters"]


def test_a_catalog_table_lives_in_the_run_directory_and_is_queried(spark, hive_dir, docs_file):
    spark.read.parquet(str(docs_file)).write.mode("overwrite").saveAsTable("docs")
    assert (hive_dir / WAREHOUSE_DIR / "docs").is_dir()
    assert (hive_dir / METASTORE_DIR).is_dir()
    assert not (ROOT / METASTORE_DIR).exists() and not (ROOT / "derby.log").exists()
    out = etl(spark, *sql("SELECT text FROM docs WHERE lang = 'fr' AND id < 40"))
    assert out.manifest.documents == 20
    corpus = query_corpus(spark, make_config(*sql("SELECT text FROM docs")).data)
    assert corpus.fingerprints and all(  # the table's files, for the cache key
        f["path"].startswith(str(hive_dir / WAREHOUSE_DIR / "docs")) and f["size"]
        for f in corpus.fingerprints)


def test_the_cache_key_holds_the_query_and_its_input_files(spark, tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(sql_documents(), path)
    query = f"SELECT text FROM parquet.`{path}` WHERE lang = 'en'"
    key = key_of(spark, *sql(query))
    assert key_of(spark, *sql(query)) == key
    assert key_of(spark, *sql(query.replace("'en'", "'fr'"))) != key
    corpus = query_corpus(spark, make_config(*sql(query)).data)
    assert [f["path"] for f in corpus.fingerprints] == [str(path)]
    pq.write_table(sql_documents(SQL_DOCS + 2), path)  # the input file changes
    assert key_of(spark, *sql(query)) != key


def test_a_query_without_files_to_list_is_not_cached_with_one_line(spark, tmp_path, caplog):
    cfg = make_config(*sql("SELECT concat('document ', id) AS text FROM range(50)"),
                      f"data.cache_dir={tmp_path}")
    job = EtlJob(cfg, EtlPlan.of(cfg, None, etl_tokenizer(cfg.tokenizer)), None, tmp_path)
    with caplog.at_level(logging.INFO), contextlib.ExitStack() as held:
        job = query_job(spark, job, None, held)
    assert job.cache_dir is None and job.key
    lines = [r.getMessage() for r in caplog.records if "ETL cache" in r.getMessage()]
    assert lines == ["ETL cache not used: Spark cannot list the files data.query reads (a view of "
                     "no files, or a source that is not files)"]
    assert etl(spark, *sql("SELECT concat('document ', id) AS text FROM range(50)")
               ).manifest.documents == 50


@pytest.mark.parametrize("query,message", [
    ("SELEC text FROM docs", r"^data\.query: \[PARSE_SYNTAX_ERROR\] Syntax error at or near "
                             r"'SELEC'.*; fix the query$"),
    ("SELECT text FROM no_such_table", r"^data\.query: \[TABLE_OR_VIEW_NOT_FOUND\] The table or "
                                       r"view `no_such_table` cannot be found.*; fix the query$"),
    ("SELECT raise_error('no documents today') AS text",
     r"^data\.query failed as it ran: RuntimeException: no documents today; fix the query$"),
    ("SELECT id, lang FROM parquet.`{docs}`", r"^data\.query: its result has no column text \(it "
                                              r"has id, lang\); select one AS text, or set"),
    ("SELECT text FROM parquet.`{docs}` WHERE id < 0", r"^data\.query: the query returns no rows "
                                                        r"\(SELECT text FROM parquet.*\); check"),
])
def test_bad_queries_are_one_line(spark, docs_file, query, message):
    with pytest.raises(InputError, match=message) as caught:
        etl(spark, *sql(query.format(docs=docs_file)))
    assert "\n" not in str(caught.value)
