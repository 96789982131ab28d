"""The Spark driver JVM's class archive on the real engines (engines/class_archive.py): the first
session's driver writes it as it exits, the next one maps it, and a truncated archive (which a JVM
that maps it dies of) is deleted and written again rather than mapped. The executor, which never
exits, writes its archive when asked as the first session ends. Also what every driver JVM
leaves behind or trips on outside Spark: Ray's copies of its Java library in /tmp/ray, and a
dangling session_latest link."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from helpers.configs import make_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two Spark sessions of their own


def _driver_jvm(spark) -> tuple[int, list[str]]:
    """The driver JVM's pid and its arguments."""
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    return int(bean.getPid()), list(bean.getInputArguments())


def _executor_jvm(spark) -> int:
    """The executor JVM's pid: the parent of the PySpark daemon that forks its Python workers."""
    def jvm(_):
        with open(f"/proc/{os.getppid()}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])  # the daemon's parent

    (pid,) = set(spark.sparkContext.parallelize([0], 1).map(jvm).collect())
    return pid


def _arguments(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


def _mapped(pid: int, path) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return str(path) in f.read()


@contextlib.contextmanager
def _session_latest_dangling():
    """Ray's session_latest link left pointing nowhere, as it is once a user deletes the
    sessions' directories (and Ray does not replace a dangling link): RayDP's agent in the driver
    JVM wrote its log there, and the JVM exited before Spark started."""
    import ray

    link = Path(ray._private.worker._global_node.get_session_dir_path()).parent / "session_latest"
    target = os.readlink(link)
    os.remove(link)
    os.symlink(link.parent / "session_deleted_by_the_user", link)
    try:
        yield
    finally:
        os.remove(link)
        os.symlink(target, link)


def _assert_rays_library_is_loaded_but_its_copy_gone(pid: int) -> None:
    """Ray's Java runtime copied its library into /tmp/ray/<ms>/ for the driver JVM: the JVM has
    it loaded, and the copy is removed (it would stay there, 40 MB, after the JVM's end)."""
    from raydp_llm.engines.java import RAY_JAVA_LIBRARY

    with open(f"/proc/{pid}/maps") as f:
        loaded = {line.split(None, 5)[5] for line in f.read().splitlines()
                  if RAY_JAVA_LIBRARY in line}
    assert loaded and all(p.startswith("/tmp/ray/") and p.endswith(" (deleted)") for p in loaded)
    (copy,) = {p.removesuffix(" (deleted)") for p in loaded}
    assert not Path(copy).parent.exists()


def test_the_driver_writes_then_maps_its_archive_and_never_maps_a_truncated_one(
        ray_cluster, tmp_path, monkeypatch):
    from raydp_llm.engines.class_archive import CACHE_DIR_ENV, ClassArchive
    from raydp_llm.engines.spark import spark_session

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "jvm"))
    cluster = make_config("cluster.keep_spark=false").cluster  # each driver JVM exits

    def session(name: str):
        return spark_session(cluster, app_name=name, log_dir=tmp_path / name)

    with session("first") as spark:  # no archive yet: this driver writes one at its exit
        _, args = _driver_jvm(spark)
        assert any(a.startswith("-XX:ArchiveClassesAtExit=") for a in args), args
        # the executor never exits: it is asked for its archive as the session ends
        assert "-XX:+RecordDynamicDumpInfo" in _arguments(_executor_jvm(spark))
    (path,) = (tmp_path / "jvm").glob("driver-*.jsa")
    assert path.stat().st_size > 10_000_000  # Spark's classes: over 100 MB
    (executors,) = (tmp_path / "jvm").glob("executor-*.jsa")
    assert executors.stat().st_size > 10_000_000

    with _session_latest_dangling(), session("second") as spark:
        pid, args = _driver_jvm(spark)
        assert f"-XX:SharedArchiveFile={path}" in args and _mapped(pid, path)
        assert spark.range(10).count() == 10
        _assert_rays_library_is_loaded_but_its_copy_gone(pid)
        executor = _executor_jvm(spark)
        assert f"-XX:SharedArchiveFile={executors}" in _arguments(executor)
        assert _mapped(executor, executors)

    with open(path, "r+b") as f:  # truncated: a JVM that mapped it would die of SIGBUS
        f.truncate(path.stat().st_size // 2)
    archive = ClassArchive(path)
    assert not archive.usable() and not path.exists()  # deleted before any JVM maps it
    assert archive.flags()[-1].startswith("-XX:ArchiveClassesAtExit=")  # the next one writes
