"""Blocks of the hand-off lost with their node (``data.cache=false``): the data made again, on
storage, while the run goes on.

Without the ETL cache the chunks go from Spark to Ray's object store, and Spark stops. A node that
dies takes the blocks its object store held; Ray would make them again through the task that made
them, RayDP's fetch from its executors, which ended with Spark (the fetch fails at once: its
executor actor is not found). So a worker that cannot read a block asks the run's hand-off where
to read instead (``handoff.LostBlocks``) and waits; the driver, told by the first, runs the ETL
again (what was lost cannot be told from what was not: all of it), into the run's storage this
time (``remade_etl/`` beside its checkpoints: S3 or a directory every node reads), checks that
it cut the same chunks, and every worker reads its chunks from there on. The worker group goes on
where it was (the lost node's own worker costs a restart, as ever); ``summary.json`` lists the
remaking (``rebuilds``).

The remaking holds no Ray CPU: the worker group holds the cluster's (on EMR every core node's)
while its workers wait for it, idle. Its Spark's executors and app master take none, and its
chunks go to storage through Spark's writers: a second hand-off to the object store would need
Ray Data's tasks, which ask a CPU each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import ray

from raydp_llm.core.config import Settings
from raydp_llm.core.errors import first_line
from raydp_llm.core.timing import Stopwatch
from raydp_llm.data.stream import BlockChunks, SplitChunks
from raydp_llm.training.driver.session import JobSession
from raydp_llm.training.handoff import LostBlocks

log = logging.getLogger(__name__)

# the Ray CPUs of RayDP's app master (RayDP 1.6.5 reads it when it starts the master; 1 if unset)
MASTER_CPUS = "spark.ray.raydp_spark_master.actor.resource.CPU"
REMADE_DIR = "remade_etl"  # in the run's storage directory, beside its checkpoints


def splits_of(data: dict) -> list[SplitChunks]:
    """Every ``SplitChunks`` of a run's data (``{split: SplitChunks}``, or a mixture's
    ``{split: [SplitChunks per source]}``), in a fixed order: a source's slot."""
    found = []
    for split in sorted(data):
        parts = data[split] if isinstance(data[split], list) else [data[split]]
        found += [p for p in parts if isinstance(p, SplitChunks)]
    return found


def beside_training(settings: Settings) -> Settings:
    """The settings of the ETL run again while the worker group holds the cluster's CPUs: its
    Spark's executors and app master take none (the workers wait for it, idle)."""
    cluster = settings.cluster
    spark_conf = {**cluster.spark_conf, MASTER_CPUS: "0"}
    return replace(settings, cluster=replace(cluster, executor_ray_cpus=0.0,
                                             spark_conf=spark_conf))


def made_again(session: JobSession, corpus, out_dir: Path, store: str | Path) -> dict:
    """The run's data made again (``{split: SplitChunks}``), its chunks written to ``store`` (the
    ETL's cache layout) and read from there, by a Spark beside the training
    (``beside_training``); its logs in ``out_dir``. On a session of its own: the run's timings
    stay the first ETL's."""
    again = JobSession(beside_training(session.settings), store, session.ray_up)
    with again.training_data(corpus, out_dir) as data:
        return data.splits()


class BlockRebuilds:
    """The driver's side: the run's block sources told where to ask when a block is lost
    (``LostBlocks``), and ``follow``, which makes the data again if a worker asks, until the fit
    ends. ``remake()``: the run's data made again (``{split: SplitChunks}`` as ``data``)."""

    def __init__(self, handoff, data: dict, remake: Callable[[], dict] | None):
        self.handoff, self.remake = handoff, remake
        self.splits = splits_of(data)
        self.rebuilds: list[dict] = []  # the remaking: when, why, its seconds, whether it worked
        self.active = remake is not None and any(
            isinstance(s.source, BlockChunks) for s in self.splits)
        for slot, split in enumerate(self.splits if self.active else []):
            if isinstance(split.source, BlockChunks):
                split.source.on_lost = LostBlocks(handoff, slot)

    def follow(self, fit: threading.Thread) -> None:
        """Until ``fit`` ends: once a worker finds blocks lost, the data made again."""
        told = self.handoff.wait_lost.remote() if self.active else None
        while told is not None and fit.is_alive():
            ready, _ = ray.wait([told], timeout=1.0)
            if ready:
                self._remake(ray.get(told))
                told = None
        fit.join()

    def _remake(self, why: str) -> None:
        clock = Stopwatch()
        print(f"blocks of the hand-off lost ({why}): running the ETL again, into the run's "
              "storage; the workers wait", flush=True)
        try:
            new = splits_of(self.remake())
            check_same_chunks(self.splits, new)
            # the hand-off holds them (and any object they refer to) while the workers read
            self.handoff.remake.remote([ray.put([s.source for s in new])])
            done = True
        except Exception as err:  # noqa: BLE001 - the workers fail with it, the run ends
            log.error("the data could not be made again: %s", first_line(err, 500,
                                                                          with_type=True))
            self.handoff.remake.remote(None)
            done = False
        seconds = clock.seconds()
        self.rebuilds.append({"at": time.time(), "why": why, "seconds": round(seconds, 2),
                              "made": done})
        if done:
            print(f"the data made again in {seconds:.1f} s; training goes on", flush=True)


def check_same_chunks(old: list[SplitChunks], new: list[SplitChunks]) -> None:
    """The ETL run again cut the chunks it cut before (same inputs, settings and seed): else the
    workers' positions would point at other tokens, and it is an error."""
    same = len(old) == len(new) and all(
        np.array_equal(a.index.start, b.index.start) and np.array_equal(a.index.n, b.index.n)
        for a, b in zip(old, new))
    if not same:
        raise RuntimeError("the ETL run again cut other chunks than the first (have its inputs "
                           "changed?); the run cannot go on from its data")
