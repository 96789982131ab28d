"""The start-up every job shares (train, prepare, evaluate), in one place: Ray up
(``ray_session``), the cluster checked once its nodes are known (``preflight``), then the data:
the ETL or its cache (``prepared``), the run's windows in its manifest, its phases' seconds in the
job's timings."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from raydp_llm.core.config import Settings, TrainSettings, source_settings
from raydp_llm.core.timing import Span, Stopwatch, timed
from raydp_llm.data import left_out
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.prepare import PreparedData, SharedSpark, prepared, write_json
from raydp_llm.data.prompts.cache import prompts_of
from raydp_llm.data.prompts.dataset import PromptData, check_train_prompts, run_prompts_etl
from raydp_llm.engines.preflight import preflight
from raydp_llm.engines.ray_cluster import ray_session
from raydp_llm.training.driver.mixed_data import prepared_sources
from raydp_llm.training.spec import windows_of


class JobSession:
    """A job on a running, checked Ray. ``timings``: the seconds of each phase so far;
    ``ray_up``: when Ray's start began and when it was up."""

    def __init__(self, settings: Settings, store: Path | str | None, ray_up: Span):
        self.settings, self.store, self.ray_up = settings, store, ray_up
        self.timings = {"ray_start_s": ray_up.seconds}
        self.spark: SharedSpark | None = None  # within ``one_spark``: the ETLs' Spark

    @contextlib.contextmanager
    def one_spark(self, out_dir: Path, held: contextlib.ExitStack | None = None
                  ) -> Iterator[None]:
        """The ETLs in this block share one Spark (a mixture's sources), started by the first that
        misses the cache, its logs in ``out_dir``; it stops at the block's end (with
        ``cluster.keep_executors``, when ``held`` closes)."""
        every = [self.settings] + [source_settings(self.settings, s)
                                   for s in self.settings.data.sources]
        hive = any(s.data.query is not None for s in every)  # a query needs Hive's catalog
        with contextlib.ExitStack() as own:
            keep = held is not None and self.settings.cluster.keep_executors
            self.spark = SharedSpark(self.settings.cluster, self.settings.name, out_dir, hive,
                                     held if keep else own)
            try:
                yield
            finally:
                self.spark = None

    @contextlib.contextmanager
    def prepared(self, corpus: Corpus, out_dir: Path, to_ray: bool = False,
                 every_token: bool = False, settings: Settings | None = None
                 ) -> Iterator[PreparedData]:
        """The ETL (or its cache) into ``store``, its manifest with the run's windows (evaluation's
        with ``every_token``); Spark's lifetime is this block's. The ETL's seconds join
        ``timings`` at its end. ``settings``: a mixture's source's (the job's when None)."""
        settings = settings or self.settings
        with prepared(settings, corpus, out_dir, to_ray=to_ray, store=self.store,
                      spark=self.spark) as data:
            refused = left_out.said(data.manifest.chat, settings.data.max_dropped)
            if refused:  # before the windows: none may be left to cut
                write_json(out_dir / "manifest.json", data.manifest_json())  # what was left out
                raise refused
            data.windows = windows_of(settings, data.index, data.manifest, every_token)
            yield data
            self.timings |= data.timings

    @contextlib.contextmanager
    def prompts(self, corpus: Corpus, out_dir: Path, training: bool = True
                ) -> Iterator[PromptData]:
        """The prompts' ETL (``data/prompts/dataset.py``), in Ray's object store once Spark has
        stopped; one line when it leaves out more than ``data.max_dropped`` of them, or
        (``training``) leaves fewer training prompts than a batch."""
        settings, timings = self.settings, {}

        def etl(tokenizer, template) -> PromptData:
            with contextlib.ExitStack() as own:
                spark = self.spark or SharedSpark(settings.cluster, settings.name, out_dir,
                                                  settings.data.query is not None, own)
                session = spark.started(timings)
                with timed(timings, "etl_s"):
                    return run_prompts_etl(session, settings, corpus, tokenizer, template)

        clock = Stopwatch()
        data = prompts_of(settings, corpus, etl)
        timings.setdefault("etl_s", clock.seconds())  # a cache hit's: reading its entry
        data.timings = timings
        refused = left_out.said(data.manifest.chat, settings.data.max_dropped)
        if refused:
            write_json(out_dir / "manifest.json", data.manifest_json())  # what was left out
            raise refused
        if training:
            check_train_prompts(data, settings.train.batch_size)
        yield data
        self.timings |= timings

    def training_data(self, corpus: Corpus | dict[str, Corpus], out_dir: Path):
        """A training run's data, as its workers read it (a context): its ETL (or cache entry),
        a mixture's sources' (``corpus``: a corpus per source), or GRPO's prompts."""
        if self.settings.data.sources:
            return prepared_sources(self, self.settings, corpus, out_dir)
        if self.settings.train.objective == "grpo":
            return self.prompts(corpus, out_dir)
        return self.prepared(corpus, out_dir, to_ray=True)

    def prepare(self, corpus: Corpus, out_dir: Path, every_token: bool = False,
                settings: Settings | None = None) -> PreparedData:
        """The ETL (or its cache) run to its end, Spark stopped: the data of a job that reads it
        from disk."""
        with self.prepared(corpus, out_dir, every_token=every_token, settings=settings) as data:
            return data


@contextlib.contextmanager
def job_session(settings: Settings, store: Path | None, train: TrainSettings | None = None
                ) -> Iterator[JobSession]:
    """Ray up for ``settings.name`` and the cluster checked for the job (for the DDP workers too
    when ``train`` is given; ``store``: where the ETL writes its dataset); Ray stops at the end.
    ``ray_start_s`` opens the timings. A training job's embedded Ray counts its DDP workers' CPUs
    twice: they start while Spark runs (``ray_cluster.embedded_cpus``)."""
    waiting = train.num_workers * train.cpus_per_worker if train is not None else 0
    with ray_session(settings.cluster, settings.name, waiting_cpus=waiting) as up:
        preflight(settings.cluster, train, store)
        yield JobSession(settings, store, up)
