"""One RayDP Spark at a time on a Ray that a sweep's trials share (raydp_llm/cli/sweep/): RayDP
names every app's actors alike in a Ray namespace, so while the trials run (``one_at_a_time``)
each Spark waits for its turn (``spark_turn``, which engines/spark.py takes around every Spark)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import ray

TURNS = "raydp_llm_spark_turns"


@ray.remote(num_cpus=0)
class _Turns:
    def __init__(self):
        import asyncio

        self.lock = asyncio.Lock()

    async def take(self) -> None:
        await self.lock.acquire()

    async def give(self) -> None:
        self.lock.release()


@contextlib.contextmanager
def one_at_a_time() -> Iterator[None]:
    """In this block every Spark started on this Ray waits until no other runs."""
    turns = _Turns.options(name=TURNS).remote()
    try:
        yield
    finally:
        ray.kill(turns)


@contextlib.contextmanager
def spark_turn() -> Iterator[None]:
    """The Spark's turn, when a sweep shares Ray by turns (``one_at_a_time``); else at once."""
    try:
        turns = ray.get_actor(TURNS)
    except ValueError:  # no sweep's
        yield
        return
    ray.get(turns.take.remote())
    try:
        yield
    finally:
        turns.give.remote()
