"""Workarounds for RayDP 1.6.5 bugs, each with its symptom. ``install()`` is idempotent.

Fetch tasks poison pooled Ray workers: ``from_spark``'s fetch task calls
``global_worker.set_load_code_from_local(True)`` (for its cross-language call to the executor) and
never resets it. A later task that lands on the same worker process and creates an actor skips
exporting the actor's class, so the actor dies with ``AssertionError: Expected str or bytes, got
<class 'NoneType'>`` (seen with ``ray.data.read_parquet`` after ``from_spark``). The wrapper resets
the flag when the task ends.
"""

from __future__ import annotations

import ray

_installed = False


def install() -> None:
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
