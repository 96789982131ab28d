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
"""

from __future__ import annotations

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
