"""The workarounds of Ray's and RayDP's bugs, each with its symptom, read against the versions in
``READ_AGAINST`` (tests/unit/test_raydp_fixes.py fails when the installed ones differ: read each
again then). The only module of raydp_llm that reaches into Ray's private modules.

1. Fetch tasks poison pooled Ray workers (``install``): ``from_spark``'s fetch task calls
   ``global_worker.set_load_code_from_local(True)`` (for its cross-language call to the executor)
   and never resets it. A later task that lands on the same worker process and creates an actor
   skips exporting the actor's class, so the actor dies with ``AssertionError: Expected str or
   bytes, got <class 'NoneType'>`` (seen with ``ray.data.read_parquet`` after ``from_spark``). The
   wrapper resets the flag when the task ends.
2. RayDP's driver-side agent logs into ``/tmp/ray/session_latest`` (``ray_logs_flag``): that link
   is left dangling once the sessions are deleted (Ray does not replace a dangling link), and the
   driver's JVM then exits before Spark starts. RayDP tells its app master's JVM this node's Ray
   session (``-Dray.logging.dir``), but not the driver's JVM: we do, from Ray's node, which no
   public API names.
3. Ray's agents outlive a killed driver (``reap_orphaned_agents``): when the driver of an embedded
   Ray is SIGKILLed, its raylet and GCS die with it, and the raylet's dashboard agent and
   runtime-env agent log that the raylet is dead and exit, but hang in their exit for about 100
   s (measured here: ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``, reparented to init).
   The next embedded Ray's start ends those of a session whose raylet and GCS are gone: a killed
   sweep's processes do not outlive the command that continues it.
"""

from __future__ import annotations

import contextlib
import re

import psutil
import ray

READ_AGAINST = {"raydp": "1.6.5", "ray": "2.60.0"}

_installed = False


def install() -> None:
    """Workaround 1, installed once a process (idempotent)."""
    global _installed
    if _installed:
        return
    from raydp.spark import dataset

    fetch = dataset._fetch_arrow_table_from_executor._function

    @ray.remote(max_retries=-1)
    def _fetch_arrow_table_from_executor(*args, **kwargs):
        from ray._private.worker import global_worker

        try:
            return fetch(*args, **kwargs)
        finally:
            global_worker.set_load_code_from_local(False)

    dataset._fetch_arrow_table_from_executor = _fetch_arrow_table_from_executor
    _installed = True


def ray_logs_flag() -> str:
    """Workaround 2: the driver JVM's flag naming this node's Ray session's log directory."""
    from ray._private.worker import _global_node

    return f"-Dray.logging.dir={_global_node.get_logs_dir_path()}"


_SESSION = re.compile(r"^(.*/session_[^/]+)/logs/")  # an open log file's session directory


def reap_orphaned_agents() -> list[int]:
    """Workaround 3: SIGKILL of the Ray processes (titled ``ray::...``) left to init whose
    session's raylet and GCS are no longer running (no live raylet's or GCS's command line names
    the session); returns their pids."""
    engines, orphans = [], []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "/raylet" in cmdline or "/gcs_server" in cmdline:
            engines.append(cmdline)
        elif proc.info["ppid"] == 1 and cmdline.startswith("ray::"):
            orphans.append(proc)
    reaped = []
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            mine = {m.group(1) for f in proc.open_files() if (m := _SESSION.match(f.path))}
            if mine and not any(session in line for session in mine for line in engines):
                proc.kill()
                reaped.append(proc.pid)
    return reaped
