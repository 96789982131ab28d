"""The Spark driver's and executors' class archives (engines/class_archive.py): sealed only when
the JVM that wrote it ran its exit sequence (or a running one dumped it) and it is an archive; a
sealed one used only at its recorded size (a JVM that maps a truncated archive dies of SIGBUS)."""

from __future__ import annotations

import os

from raydp_llm.core.config import ClusterSettings
from raydp_llm.engines.class_archive import CACHE_DIR_ENV, DYNAMIC_MAGIC, ClassArchive
from raydp_llm.engines.java import ensure_java

ARCHIVE_BYTES = DYNAMIC_MAGIC.to_bytes(4, "little") + b"\0" * 4092


def _archive(tmp_path, monkeypatch) -> ClassArchive:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "jvm"))
    archive = ClassArchive.for_driver(ensure_java())
    assert archive is not None and archive.path.parent == tmp_path / "jvm"
    return archive


def _written(archive: ClassArchive, content: bytes = ARCHIVE_BYTES) -> str:
    """What the driver JVM does at exit: the archive written to the file its flag names."""
    flag = archive.flags()[-1]
    assert flag.startswith("-XX:ArchiveClassesAtExit=")
    path = flag.split("=", 1)[1]
    with open(path, "wb") as f:
        f.write(content)
    return path


def test_a_whole_archive_is_sealed_then_mapped(tmp_path, monkeypatch):
    archive = _archive(tmp_path, monkeypatch)
    pending = _written(archive)
    archive.seal(143)  # the JVM handled SIGTERM and ran its exit sequence
    assert not os.path.exists(pending) and archive.usable()
    assert archive.flags()[-1] == f"-XX:SharedArchiveFile={archive.path}"
    assert "-XX:+AllowArchivingWithJavaAgent" in archive.flags()  # RayDP's agent is in the JVM


def test_an_archive_of_a_killed_jvm_or_not_an_archive_is_dropped(tmp_path, monkeypatch):
    archive = _archive(tmp_path, monkeypatch)
    for exit_code, content in ((None, ARCHIVE_BYTES), (-9, ARCHIVE_BYTES), (0, b"junk" * 100)):
        pending = _written(archive, content)
        archive.seal(exit_code)
        assert not os.path.exists(pending) and not archive.path.exists(), exit_code
    archive.seal(0)  # nothing written: nothing to do


def test_a_truncated_archive_is_deleted_and_written_again(tmp_path, monkeypatch):
    archive = _archive(tmp_path, monkeypatch)
    _written(archive)
    archive.seal(0)
    with open(archive.path, "r+b") as f:
        f.truncate(1000)
    assert not archive.usable()  # mapped, it would kill the JVM
    assert not archive.path.exists()
    assert archive.flags()[-1].startswith("-XX:ArchiveClassesAtExit=")


def test_another_class_path_gets_another_archive(tmp_path, monkeypatch):
    """A user's class path settings key the driver's and the executors' archives alike: the JVM
    maps no archive written for another class path."""
    from raydp_llm.engines.spark import driver_archive, executor_archive

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "jvm"))
    home = ensure_java()
    plain = ClassArchive.for_driver(home)
    assert plain == ClassArchive.for_driver(home)
    assert plain != ClassArchive.for_driver(home, "spark.jars=/opt/extra.jar")
    extra = ClusterSettings(spark_conf={"spark.executor.extraClassPath": "/opt/extra.jar"})
    for archive in (driver_archive, executor_archive):
        assert archive(ClusterSettings(), home) == archive(ClusterSettings(), home)
        assert archive(extra, home) not in (None, archive(ClusterSettings(), home))
    assert executor_archive(ClusterSettings(), home) == ClassArchive.for_executor(home)


def test_an_unwritable_cache_means_no_archive(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "file" / "jvm"))
    assert ClassArchive.for_driver(ensure_java()) is None


WAITING_JVM = "public class Wait { public static void main(String[] a) throws Exception { " \
              "System.out.println(\"up\"); System.in.read(); } }"


def test_a_running_jvm_writes_the_executors_archive_when_asked(tmp_path, monkeypatch):
    """An executor is killed, never exits: started with the flags to record, it is asked for its
    archive with jcmd; then the next one maps it."""
    import subprocess

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "jvm"))
    home = ensure_java()
    archive = ClassArchive.for_executor(home)
    assert archive is not None and archive != ClassArchive.for_driver(home)
    marker = f"-Dtest.executor_of={os.getpid()}"
    assert archive.mapping_flags() == []  # none yet: this JVM records one
    flags = archive.recording_flags(marker)
    assert "-XX:+RecordDynamicDumpInfo" in flags and marker in flags
    (tmp_path / "Wait.java").write_text(WAITING_JVM)
    jvm = subprocess.Popen([str(home / "bin" / "java"), *flags, str(tmp_path / "Wait.java")],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert jvm.stdout.readline().strip() == "up"
        archive.dump_from(marker, home)
    finally:
        jvm.communicate("\n", timeout=60)
    assert archive.usable() and not list((tmp_path / "jvm").glob("*.tmp"))
    assert archive.mapping_flags()[-1] == f"-XX:SharedArchiveFile={archive.path}"
    archive.dump_from(marker, home)  # no JVM of that marker any more: nothing happens
    assert archive.usable()


def test_archives_unused_for_a_month_go_when_another_is_written(tmp_path, monkeypatch):
    """Each JDK, PySpark, RayDP and extra class path gets its own archive (170 MB for the driver):
    one no run has used for 30 days is removed when a new one is sealed; one in use stays."""
    import time

    archive = _archive(tmp_path, monkeypatch)
    old, used = (ClassArchive(tmp_path / "jvm" / name) for name in ("driver-old.jsa",
                                                                      "driver-used.jsa"))
    for other in (old, used):
        other.path.write_bytes(ARCHIVE_BYTES)
        other._record.write_text(f'{{"bytes": {len(ARCHIVE_BYTES)}}}')
        month_ago = time.time() - 31 * 86400
        os.utime(other._record, (month_ago, month_ago))
    assert used.usable()  # a run maps it: its record is touched
    _written(archive)
    archive.seal(0)
    assert archive.usable() and used.usable()
    assert not old.path.exists() and not old._record.exists()


def test_a_failed_dump_writes_nothing_and_the_run_goes_on(tmp_path, monkeypatch):
    """No jcmd (a JRE): no archive, no file left, no error (a dump that fails is sealed as a
    killed JVM's: test_an_archive_of_a_killed_jvm_or_not_an_archive_is_dropped)."""
    import subprocess
    import sys

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "jvm"))
    archive = ClassArchive.for_executor(ensure_java())
    marker = f"-Dtest.executor_of={os.getpid()}"
    marked = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", marker],
                              stdin=subprocess.PIPE)
    try:
        archive.dump_from(marker, tmp_path / "no_jdk")  # no bin/jcmd there
    finally:
        marked.communicate(b"", timeout=30)
    assert not archive.usable() and not list((tmp_path / "jvm").iterdir())
