"""Wall times: one stopwatch for every "how long did that take" in the project, and phases run
beside the next (``in_background``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass


class Stopwatch:
    """Seconds since it started; ``already_s`` starts it that many seconds in the past (a resumed
    run's elapsed time)."""

    def __init__(self, already_s: float = 0.0):
        self.start = time.perf_counter() - already_s

    def seconds(self) -> float:
        return time.perf_counter() - self.start


@dataclass(frozen=True)
class Started:
    """When a command began (its process, ``command``) and when its Python was ready (imports
    done, input checked: ``ready``), in ``time.time()`` seconds: where the start-up block of a
    run's summary counts from."""

    command: float
    ready: float


@dataclass(frozen=True)
class Span:
    """When something began and when it was done, in ``time.time()`` seconds."""

    began: float
    done: float

    @property
    def seconds(self) -> float:
        return self.done - self.began


@contextlib.contextmanager
def timed(into: dict[str, float], name: str) -> Iterator[None]:
    """``into[name]``: the seconds the ``with`` block took (also when it raised)."""
    watch = Stopwatch()
    try:
        yield
    finally:
        into[name] = watch.seconds()


def in_background(name: str, fn: Callable, *args) -> Future:
    """``fn(*args)`` in a thread of its own (named ``name``), while the caller goes on; the
    Future's ``result()`` waits for it and raises what it raised."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future
