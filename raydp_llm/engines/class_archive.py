"""The Spark driver's and executors' classes in class-data-sharing archives (JDK 17's dynamic CDS).

A JVM that starts Spark loads, verifies and parses some ten thousand classes one by one: most of its
start-up CPU. With an archive it maps them from one file instead (the sample's driver JVM: 12.7 →
8.2 s of CPU on 2 cores, an executor 8.9 → 6.5 s, and every later Spark session of a process or a
test run gains as much). The first run has none: its driver JVM writes one as it exits
(``-XX:ArchiveClassesAtExit``), to a file of its own that ``ClassArchive.seal`` renames into place
once the JVM has ended; later runs map it. RayDP kills its executors, which never exit: one is
started with ``-XX:+RecordDynamicDumpInfo`` and asked for its archive with ``jcmd`` as the session
ends (``dump_from``). RayDP's app master maps the executors' archive: most of its classes are
theirs (its two JVMs 9.3 → 6.7 s of CPU).

RayDP's Java agent runs in the driver JVM, so an archive is written and mapped with
``AllowArchivingWithJavaAgent`` (the JVM logs that such an archive is meant for testing: it holds
the classes as the agent handed them over). The same agent is there at every start, and a new
RayDP (its agent's jar among the jars) gets a new archive.

Why the care: a JVM maps an archive shorter than its header says and dies of SIGBUS. So an archive
is used only while its size is the one recorded when it was sealed; otherwise it is deleted and the
run writes a new one. The file's name holds what makes it valid (the JDK and the jars: a new
PySpark, RayDP or Ray gets its own), and the JVM itself ignores one whose jars changed since.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "RAYDP_LLM_JVM_CACHE"  # where archives live; default ~/.cache/raydp_llm/jvm
# RayDP's Java agent runs in the driver JVM: an archive is written and used only with this.
AGENT_FLAGS = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+AllowArchivingWithJavaAgent"]
DYNAMIC_MAGIC = 0xF00BABA8  # the first four bytes (little-endian) of a JDK 17 dynamic archive
UNUSED_DAYS = 30.0  # an archive no run has mapped for this long is removed when another is written
SEALED_EXITS = (0, 143)  # the JVM ran its exit sequence, the dump included (143: it got SIGTERM)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "raydp_llm" / "jvm")


def _jars_key(java_home: Path, extra: str) -> str:
    """A digest of the JDK and of PySpark's, RayDP's and Ray's jars (names, sizes, times)."""
    import pyspark
    import ray
    import raydp

    digest = hashlib.sha256(f"{java_home.resolve()}|{extra}".encode())
    for package in (pyspark, raydp, ray):
        jars = Path(package.__file__).parent / "jars"
        for jar in sorted(jars.glob("*.jar")):
            stat = jar.stat()
            digest.update(f"{jar}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """The driver's or the executors' archive at ``path`` (``<path>.json`` records its size), and
    the file this process's JVM writes when there is none yet."""

    path: Path

    @classmethod
    def for_driver(cls, java_home: Path, extra: str = "") -> "ClassArchive | None":
        """The archive for this JDK and these jars (``extra``: anything else that changes the
        driver's class path), or None where the cache directory cannot be written."""
        return cls._cached(f"driver-{_jars_key(java_home, extra)}.jsa")

    @classmethod
    def for_executor(cls, java_home: Path, extra: str = "") -> "ClassArchive | None":
        """The executors' archive for this JDK and these jars (an executor is a Ray Java worker;
        ``extra`` as for the driver), or None where the cache directory cannot be written."""
        return cls._cached(f"executor-{_jars_key(java_home, extra)}.jsa")

    @classmethod
    def _cached(cls, name: str) -> "ClassArchive | None":
        folder = cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if not os.access(folder, os.W_OK):
            return None
        return cls(folder / name)

    @property
    def _record(self) -> Path:
        return self.path.with_name(self.path.name + ".json")

    @property
    def _pending(self) -> Path:
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")

    def usable(self) -> bool:
        """Sealed and of its recorded size; a damaged one (truncated, a size not recorded) is
        deleted, so that this run writes a fresh one."""
        try:
            recorded = json.loads(self._record.read_text())["bytes"]
            if self.path.stat().st_size == recorded:
                os.utime(self._record)  # last used now: see prune_unused
                return True
        except (OSError, ValueError, KeyError, TypeError):
            pass
        for stale in (self.path, self._record):
            stale.unlink(missing_ok=True)
        return False

    def flags(self) -> list[str]:
        """The driver JVM's flags: map the archive, or write one at exit."""
        return self.mapping_flags() or [*AGENT_FLAGS, f"-XX:ArchiveClassesAtExit={self._pending}"]

    def mapping_flags(self) -> list[str]:
        """The flags that map the archive when it is usable; none otherwise."""
        if self.usable():
            return [*AGENT_FLAGS, f"-XX:SharedArchiveFile={self.path}"]
        return []

    @staticmethod
    def recording_flags(marker: str) -> list[str]:
        """The flags of a JVM that never exits (RayDP kills its executors) and has no archive to
        map: what ``dump_from`` needs to write one while it runs; ``marker`` (a ``-D`` flag) finds
        that JVM among the processes."""
        return [*AGENT_FLAGS, "-XX:+RecordDynamicDumpInfo", marker]

    def dump_from(self, marker: str, java_home: Path) -> None:
        """The archive written from the running JVM started with ``recording_flags(marker)`` (JDK
        17's ``jcmd <pid> VM.cds dynamic_dump``: about 5 s on 2 cores, once) and sealed."""
        pid = _pid_with_flag(marker)
        if pid is None:
            return
        try:  # jcmd answers once the JVM has written the whole file
            done = subprocess.run([str(java_home / "bin" / "jcmd"), str(pid), "VM.cds",
                                   "dynamic_dump", str(self._pending)],
                                  capture_output=True, timeout=60)
            self.seal(0 if done.returncode == 0 else None)  # seal checks the file too
        except (OSError, subprocess.TimeoutExpired) as err:  # no jcmd, the JVM gone or stuck
            log.info("no class archive from JVM %d: %s", pid, err)
            self._pending.unlink(missing_ok=True)  # never sealed: it may be partly written

    def seal(self, exit_code: int | None) -> None:
        """After the driver JVM ended with ``exit_code``: the archive it wrote, if whole, put in
        place with its size recorded; a partial one removed."""
        pending = self._pending
        if not pending.exists():
            return
        try:
            whole = exit_code in SEALED_EXITS and _is_dynamic_archive(pending)
            if whole:
                self._record.write_text(json.dumps({"bytes": pending.stat().st_size}))
                os.replace(pending, self.path)
                log.info("Spark's class archive written: %s", self.path)
                prune_unused(self.path.parent)
        finally:
            pending.unlink(missing_ok=True)


def prune_unused(folder: Path, days: float = UNUSED_DAYS) -> list[Path]:
    """Remove the archives in ``folder`` that no run has used for ``days`` (their record's time:
    ``usable`` touches it); the archives removed. Each new JDK, PySpark, RayDP or Ray, and each
    extra class path, gets an archive of its own (the driver's: 170 MB) that nothing else
    removes."""
    cutoff = time.time() - days * 86400
    removed = []
    for record in folder.glob("*.jsa.json"):
        try:
            if record.stat().st_mtime >= cutoff:
                continue
        except OSError:  # removed meanwhile
            continue
        archive = record.with_suffix("")  # x.jsa.json -> x.jsa
        archive.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        removed.append(archive)
    return removed


def _pid_with_flag(flag: str) -> int | None:
    """The process of this user whose arguments include ``flag``, if any."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if flag.encode() in cmdline.read_bytes().split(b"\0"):
                return int(cmdline.parent.name)
        except (OSError, ValueError):
            continue
    return None


def _is_dynamic_archive(path: Path) -> bool:
    with path.open("rb") as f:
        return int.from_bytes(f.read(4), "little") == DYNAMIC_MAGIC
