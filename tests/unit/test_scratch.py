"""cluster.scratch_dir: one setting puts a run's scratch on a large volume: Spark's local
directories, the copies of s3:// models, and the embedded Ray's session and spilled objects. The
run that uses it end to end: tests/integration/test_monitoring.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.configs import make_config
from raydp_llm.core.checks import validate
from raydp_llm.core.errors import InputError
from raydp_llm.engines.ray_cluster import init_options, scratch_environment
from raydp_llm.engines.spark_settings import spark_configs
from raydp_llm.models import files


def test_the_embedded_run_keeps_its_scratch_under_the_directory(tmp_path):
    cluster = make_config("cluster.scratch_dir=/mnt/x").cluster
    assert scratch_environment(cluster) == {"RAYDP_LLM_MODEL_CACHE": "/mnt/x/models",
                                            "RAY_TMPDIR": "/mnt/x"}
    assert spark_configs(cluster, tmp_path)["spark.local.dir"] == "/mnt/x/spark"
    mine = make_config("cluster.scratch_dir=/mnt/x",
                       "+cluster.spark_conf={spark.local.dir: /fast}").cluster
    assert spark_configs(mine, tmp_path)["spark.local.dir"] == "/fast"  # the user's wins
    plain = make_config().cluster
    assert scratch_environment(plain) == {} and "spark.local.dir" not in spark_configs(
        plain, tmp_path)


def test_a_cluster_s_workers_get_the_model_copies_place_and_ray_keeps_its_own():
    cluster = make_config("cluster.address=auto", "cluster.scratch_dir=/mnt/x").cluster
    assert scratch_environment(cluster) == {"RAYDP_LLM_MODEL_CACHE": "/mnt/x/models"}
    assert init_options(cluster, "run", 0)["runtime_env"] == {
        "env_vars": {"RAYDP_LLM_MODEL_CACHE": "/mnt/x/models"}}
    assert "runtime_env" not in init_options(make_config("cluster.address=auto").cluster, "r", 0)


def test_a_path_too_long_for_ray_s_sockets_is_one_line():
    deep = "/mnt/" + "d" * 40
    with pytest.raises(InputError, match=r"^cluster.scratch_dir=/mnt/d+: Ray's sockets under it "
                                         r"would have paths of 113 characters, over Linux's 107; "
                                         r"use a path of at most 39$"):
        scratch_environment(make_config(f"cluster.scratch_dir={deep}").cluster)
    with pytest.raises(InputError, match="cluster.scratch_dir=scratch .*an absolute local path"):
        validate(make_config("cluster.scratch_dir=scratch"))


def test_model_copies_go_where_the_environment_says_when_used(monkeypatch, tmp_path):
    monkeypatch.delenv(files.MODEL_CACHE_ENV, raising=False)
    assert files.model_cache() == Path.home() / ".cache" / "raydp_llm" / "models"
    monkeypatch.setenv(files.MODEL_CACHE_ENV, str(tmp_path))
    assert files.model_cache() == tmp_path
