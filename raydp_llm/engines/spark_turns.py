"""One RayDP Spark at a time on a Ray that a sweep's trials share (raydp_llm/cli/sweep/): RayDP
names every app's actors alike in a Ray namespace, so while the trials run (``one_at_a_time``)
each Spark waits for its turn (``spark_turn``, which engines/spark.py takes around every Spark).
A sweep's trials share the sweep's own namespace (``ray_cluster.sweep_namespace``): another
sweep's Sparks, and a single run's, never wait for them.

A turn is held by a lease, a small actor that Ray ends with the process that took the turn: a
job's process that dies during its ETL (a SIGKILL, a lost node) gives its turn back, where a lock
it held would stay taken and leave the other trials waiting forever."""

from __future__ import annotations

import contextlib
import secrets
from typing import Iterator

import ray

from raydp_llm.engines.this_node import on_this_node

TURNS = "raydp_llm_spark_turns"
LEASE_CHECK_S = 1.0  # how often a waiting Spark asks whether the holder's process still lives


@ray.remote(num_cpus=0)
class _Lease:
    """Owned by the process that holds the turn: Ray kills it when that process dies."""

    def alive(self) -> bool:
        return True


@ray.remote(num_cpus=0)
class _Turns:
    def __init__(self):
        self.holder = self.token = None  # the lease of the Spark whose turn it is, and its token

    async def take(self, lease, token: str) -> None:
        import asyncio

        from ray.exceptions import RayActorError

        while self.holder is not None:
            try:
                await self.holder.alive.remote()
            except RayActorError:  # its process died: the turn is free
                self.holder = None
                break
            await asyncio.sleep(LEASE_CHECK_S)
        self.holder, self.token = lease, token

    async def give(self, token: str) -> None:
        if self.token == token:
            self.holder = self.token = None


@contextlib.contextmanager
def one_at_a_time() -> Iterator[None]:
    """In this block every Spark started in this Ray namespace waits until no other runs."""
    turns = _Turns.options(name=TURNS, scheduling_strategy=on_this_node()).remote()
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
    lease = _Lease.options(scheduling_strategy=on_this_node()).remote()
    token = secrets.token_hex(8)
    ray.get(turns.take.remote(lease, token))
    try:
        yield
    finally:
        ray.get(turns.give.remote(token))
        ray.kill(lease)
