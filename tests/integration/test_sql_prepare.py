"""``python -m raydp_llm.prepare`` with ``data.format=sql``, end to end: apart from
test_sql_input.py, whose module-wide Spark (Hive's catalog in its run directory) would refuse a
job's own."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from helpers.configs import CACHE_DIR, make_config
from helpers.corpora import SQL_DOCS, sql_documents
from helpers.paths import ROOT
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.engines.spark_settings import METASTORE_DIR

pytestmark = pytest.mark.integration


@pytest.fixture
def docs_file(tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(sql_documents(), path)
    return path


@pytest.mark.slow  # an end-to-end run
def test_prepare_runs_a_query_end_to_end_and_a_second_run_hits_the_cache(ray_cluster, docs_file,
                                                                         tmp_path, caplog):
    """``python -m raydp_llm.prepare`` with a query: its own Ray and Spark, Hive's files in its run
    directory; the same query again (a prepare job in this process, on the session's Ray) skips
    the ETL."""
    from raydp_llm.cli.prepare_job import run_checked
    from raydp_llm.core.timing import Stopwatch

    query = f"SELECT text FROM parquet.`{docs_file}` WHERE lang = 'en'"
    overrides = ["data.format=sql", f'data.query="{query}"', f"data.cache_dir={CACHE_DIR}",
                 "data.decontaminate=off"]
    done = subprocess.run(
        [sys.executable, "-m", "raydp_llm.prepare", *overrides,
         f"hydra.run.dir={tmp_path / 'first'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    settings = make_config(*overrides)
    (tmp_path / "second").mkdir()
    with caplog.at_level(logging.INFO, logger="raydp_llm"):
        run_checked(settings, check_inputs(settings), tmp_path / "second", Stopwatch())
    manifests = {run: json.loads(next((tmp_path / run).rglob("manifest.json")).read_text())
                 for run in ("first", "second")}
    assert [m["documents"] for m in manifests.values()] == [SQL_DOCS // 2] * 2
    assert manifests["first"]["etl_key"] == manifests["second"]["etl_key"]
    assert not manifests["first"]["cache_hit"] and manifests["second"]["cache_hit"]
    assert "ETL cache hit" in caplog.text and "the query's ETL skipped" in caplog.text
    assert (tmp_path / "first" / METASTORE_DIR).is_dir()
    assert not (tmp_path / METASTORE_DIR).exists() and not (tmp_path / "derby.log").exists()
