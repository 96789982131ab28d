"""The ETL step every entry point runs: the token stream's chunks from the ETL cache, or from a
Spark ETL on the running Ray (the run's windows on them: ``training/spec.windows_of``).

``prepared`` is a context manager, so the caller holds Spark's lifetime: Spark stops before the data
is handed over, unless ``cluster.keep_executors``, when it stays up until the caller's ``with``
ends. The step's phase times come back with the data (``PreparedData.timings``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit

from py4j.protocol import Py4JJavaError
from pyspark.errors import PythonException

from raydp_llm.core.config import ClusterSettings, DataSettings, Settings
from raydp_llm.core.console import PhaseBar, console_bar
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import Stopwatch, timed
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data import cache, s3_cache
from raydp_llm.data.etl.failures import input_error, unknown_characters, unreadable_object
from raydp_llm.data.etl.handoff import INLINE, held_per_node, to_object_store, to_parquet, to_s3
from raydp_llm.data.etl.records import EtlOutput, EtlPlan, Manifest
from raydp_llm.data.etl.run import phase_names, run_etl
from raydp_llm.data.inputs.files import Corpus, check_unchanged
from raydp_llm.data.inputs.query import listed, query_corpus
from raydp_llm.data.spark_stats import read_event_log
from raydp_llm.data.stream import ChunkIndex, RunWindows, SplitChunks
from raydp_llm.engines.dashboard import RunGauges
from raydp_llm.engines.spark import kept_spark, spark_session

log = logging.getLogger(__name__)

STATS_FILE = cache.STATS_FILE


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    manifest: Manifest  # what the ETL made (manifest.json)
    entry: Path | str | None  # the dataset (Parquet + tokenizer + manifest; str: on S3), if any
    cache_hit: bool
    index: dict[str, ChunkIndex]  # each split's chunks
    sources: dict | None = None  # where workers read each split's chunks, when asked for
    stats: dict = field(default_factory=dict)  # etl_stats.json: Spark's metrics and the phase times
    timings: dict = field(default_factory=dict)  # seconds: etl_s, and spark_start_s when Spark ran
    windows: RunWindows | None = None  # the run's windows on the chunks (training/spec.windows_of)

    def splits(self) -> dict[str, SplitChunks]:
        """Where the workers read each split's chunks (``sources``, asked for with ``to_ray``)."""
        return {name: SplitChunks(self.sources[name], self.index[name]) for name in self.index}

    def manifest_json(self) -> dict:
        """The run's ``manifest.json``: the ETL's manifest, and the run's windows when known."""
        return self.manifest.to_json() | (self.windows.to_json() if self.windows else {})


@dataclass(frozen=True)
class SavedTokenizer:
    """A ``tokenizer.path``: the file names its own kind (char, bpe or ids), and the settings for
    making a tokenizer (vocab_size, sample_mb) neither apply to it nor belong in the ETL cache
    key."""

    path: str
    kind: str = "file"


def etl_tokenizer(tok):
    """The tokenizer settings the ETL runs with: a ``tokenizer.path`` wins over ``kind``."""
    return SavedTokenizer(tok.path) if tok.path else tok


def dataset_store(data: DataSettings, out_dir: Path) -> Path | str:
    """Where an entry point that reads the chunks from disk has the ETL write them: the ETL cache
    (a directory, or S3), or ``dataset/`` in the run directory with ``data.cache=false``."""
    return cache.location(data.cache_dir) if data.cache else out_dir / "dataset"


class SharedSpark:
    """Spark for one ETL or several in a row: the first that needs Spark starts it (its timings get
    ``spark_start_s``), a later one finds it running (a mixture's sources: one Spark, not one each).
    It stops when ``scope`` closes. Each ETL runs as a job group of its own, and its stats count
    that group's jobs only."""

    def __init__(self, cluster: ClusterSettings, name: str, log_dir: Path, hive: bool,
                 scope: contextlib.ExitStack):
        self.cluster, self.name, self.log_dir, self.hive = cluster, name, log_dir, hive
        self.scope = scope
        self.session = None  # the SparkSession, once started

    def started(self, timings: dict):
        """The running SparkSession: the one an earlier job kept (``cluster.keep_spark``), or
        started now (timed into ``timings``)."""
        if self.session is None and self.cluster.keep_spark:
            self.session = kept_spark(self.cluster, self.hive)
            if self.session is not None:
                log.info("Spark kept running by an earlier job: its start skipped")
        if self.session is None:
            with timed(timings, "spark_start_s"):
                self.session = self.scope.enter_context(spark_session(
                    self.cluster, app_name=self.name, log_dir=self.log_dir, hive=self.hive))
        return self.session

    @contextlib.contextmanager
    def job_group(self, name: str) -> Iterator[str]:
        """The Spark jobs started in this block (on this thread) belong to a group of their own,
        named ``name`` and a suffix (yielded): a Spark kept for later jobs may run the same ETL
        again. Spark's cached results are dropped at its end when Spark is kept."""
        context, group = self.session.sparkContext, f"{name}/{uuid.uuid4().hex[:8]}"
        context.setJobGroup(group, f"the ETL of {name}")
        try:
            yield group
        finally:
            context._jsc.clearJobGroup()
        if self.cluster.keep_spark:
            self.session.catalog.clearCache()

    def stats(self, group: str) -> dict:
        """Spark's own metrics of ``group``'s jobs, from its event log, once its listeners have
        written every event so far (Spark flushes the log at each job's end)."""
        context = self.session.sparkContext
        context._jsc.sc().listenerBus().waitUntilEmpty()
        # a kept Spark logs where the job that started it ran
        log_dir = Path(urlsplit(context.getConf().get("spark.eventLog.dir")).path)
        return read_event_log(log_dir, job_group=group)


@contextlib.contextmanager
def prepared(settings: Settings, corpus: Corpus, out_dir: Path, to_ray: bool,
             store: Path | str | None, spark: SharedSpark | None = None
             ) -> Iterator[PreparedData]:
    """Chunks from the ETL cache (``data.cache``) or from a Spark ETL run on the running Ray.

    A Spark run writes its dataset to ``store/<key>`` when ``store`` is given; with ``to_ray`` the
    workers read their chunks from there, or, without a store, from Ray's object store
    (``from_spark``). Spark's driver log goes to ``out_dir``. One run at a time checks or builds a
    key (``cache.locked``). A ``data.query``'s key needs its input files, which Spark lists once it
    has planned the query: Spark starts first, and a cache hit skips only the ETL. ``spark``: a
    Spark shared with other ETLs (else this ETL's own)."""
    out_dir.mkdir(parents=True, exist_ok=True)  # its logs and stats, also when Spark was kept
    store = None if store is None else cache.location(str(store))  # a str: on S3
    job = EtlJob(settings, EtlPlan.of(settings, corpus, etl_tokenizer(settings.tokenizer)), None,
              out_dir, spark=spark)
    with contextlib.ExitStack() as kept:  # Spark's lifetime when cluster.keep_executors
        if settings.data.query is not None:
            data = _spark_etl(job, to_ray, store, kept)
        else:
            job = keyed(job, corpus.fingerprinted, "remote inputs have no size or modification "
                        "time to key it by")
            lock_dir = job.cache_dir or store
            with cache.locked(lock_dir, job.key) if lock_dir else contextlib.nullcontext():
                entry = lookup(job)
                if entry is not None:
                    data = _from_cache(entry, out_dir, to_ray, job.plan.s3)
                else:
                    data = _spark_etl(job, to_ray, store, kept)
        yield data


def keyed(job: EtlJob, keyable: bool, why_not: str) -> EtlJob:
    """The job with its cache key, and the cache directory when ``data.cache`` and the inputs are
    ``keyable`` (else one line: the cache is not used, ``why_not``)."""
    data = job.settings.data
    plan = job.plan
    key = cache.cache_key(plan.corpus, data, plan.tokenizer, job.settings.seed, chat_key(plan))
    if data.cache and not keyable:
        log.info("ETL cache not used: %s", why_not)
    cache_dir = cache.location(data.cache_dir) if data.cache and keyable else None
    return replace(job, key=key, cache_dir=cache_dir)


def lookup(job: EtlJob) -> Path | str | None:
    """The complete cache entry of ``job``'s key, local or on S3, or None (also when the job does
    not use the cache)."""
    if job.cache_dir is None:
        return None
    if isinstance(job.cache_dir, str):
        return s3_cache.lookup(job.cache_dir, job.key, job.plan.s3)
    return cache.lookup(job.cache_dir, job.key)


def _from_cache(entry: Path | str, out_dir: Path, to_ray: bool, s3: S3Options,
                note: str = "Spark not started") -> PreparedData:
    clock = Stopwatch()
    log.info("ETL cache hit: %s (%s)", entry, note)
    read = s3_cache.read_entry(entry, s3) if isinstance(entry, str) else cache.read_entry(entry)
    index, tokenizer, manifest, stats = read
    sources = cache.parquet_sources(entry, index, s3) if to_ray else None
    write_json(out_dir / STATS_FILE, stats)
    return PreparedData(tokenizer, manifest, entry, cache_hit=True, index=index,
                        sources=sources, stats=stats, timings={"etl_s": clock.seconds()})


@dataclass(frozen=True)
class EtlJob:
    """What a Spark ETL runs on: the settings, the corpus, the tokenizer settings, the cache key
    (None for a query until Spark has planned it), the run directory, the cache directory (None:
    not looked up)."""

    settings: Settings
    plan: EtlPlan  # its corpus, its tokenizer settings, its chat template (resolved once)
    key: str | None
    out_dir: Path
    cache_dir: Path | str | None = None  # str: on S3
    spark: SharedSpark | None = None  # a Spark shared with other ETLs; None: its own

    def own_spark(self, scope: contextlib.ExitStack) -> SharedSpark:
        """``spark``, or a Spark of this ETL's own that stops when ``scope`` closes."""
        if self.spark is not None:
            return self.spark
        return SharedSpark(self.settings.cluster, self.settings.name, self.out_dir,
                           self.settings.data.query is not None, scope)


@dataclass
class _SparkRun:
    """What the Spark part of an ETL leaves for after Spark stops."""

    out: EtlOutput
    staged: Path | s3_cache.Staged | None  # the entry to commit (a cache on S3: Staged)
    sources: dict | None
    etl_clock: Stopwatch
    stats: dict  # Spark's metrics of the ETL's jobs (spark_stats.read_event_log)


def _spark_etl(
    job: EtlJob, to_ray: bool, store: Path | str | None, kept: contextlib.ExitStack
) -> PreparedData:
    """Spark's part of ``prepared``: start Spark, run the ETL, stage the cache entry or hand the
    chunks to Ray; then Spark's stats, and the entry committed with them. A query's cache lock is
    held from when its key is known (``held``) to the commit."""
    settings, timings = job.settings, {}
    with contextlib.ExitStack() as held:
        with contextlib.ExitStack() as local, console_bar(len(_phases(settings, to_ray, store)),
                                                          "ETL", "phase") as bar:
            progress = PhaseBar(bar)
            shared = job.own_spark(kept if settings.cluster.keep_executors else local)
            spark = shared.started(timings)
            progress.done("spark start", timings.get("spark_start_s", 0.0))
            if job.key is None:
                job = query_job(spark, job, store, held)
                entry = lookup(job)
                if entry is not None:  # Spark started only to plan the query
                    return _from_cache(entry, job.out_dir, to_ray, job.plan.s3,
                                       "the query's ETL skipped")
            with shared.job_group(job.key or settings.name) as group:
                run = _run_in_spark(spark, job, to_ray, store, progress)
            run.stats = shared.stats(group)
        return _after_spark(job, run, timings, to_ray)


def _phases(settings: Settings, to_ray: bool, store: Path | str | None) -> list[str]:
    """The progress bar's phases."""
    phases = ["spark start", *phase_names(settings.data)]
    phases += ["write"] if store else []
    phases += ["convert"] if to_ray and not store else []
    return phases


def query_job(spark, job: EtlJob, store: Path | str | None, held: contextlib.ExitStack
              ) -> EtlJob:
    """A query's job once Spark has planned it: its corpus (the input files' fingerprints), its key,
    and its key's lock taken into ``held``."""
    corpus = query_corpus(spark, job.settings.data)
    job = keyed(replace(job, plan=replace(job.plan, corpus=corpus)), listed(corpus),
                "Spark cannot list the files data.query reads (a view of no files, or a source "
                "that is not files)")
    lock_dir = job.cache_dir or store
    if lock_dir:
        held.enter_context(cache.locked(lock_dir, job.key))
    return job


def _run_in_spark(spark, job: EtlJob, to_ray: bool, store: Path | str | None,
                  progress: PhaseBar) -> _SparkRun:
    """The ETL, and its chunks staged in ``store`` or handed to Ray, while Spark runs."""
    etl_clock = Stopwatch()
    plan = job.plan
    out = _run_etl(spark, plan, progress.done)
    # the data's fingerprint: its inputs and every setting the ETL read (the cache key); in
    # the cache entry's manifest too, where a cache hit reads it back
    out.manifest.etl_key = job.key
    staged = sources = None
    if isinstance(store, str):
        staged = _phase(out, "write", progress, lambda: to_s3(out, store, job.key, plan.s3))
    elif store:
        staged = _phase(out, "write", progress, lambda: to_parquet(out, store, job.key))
    if to_ray and not store:
        sources = _phase(out, "convert", progress, lambda: to_object_store(out))
    check_unchanged(plan.corpus, plan.s3)  # every pass read the same inputs
    return _SparkRun(out, staged, sources, etl_clock, stats={})


def _after_spark(job: EtlJob, run: _SparkRun, timings: dict, to_ray: bool) -> PreparedData:
    """After the ETL (its own Spark stopped): the ETL's report, Spark's stats, the cache entry
    committed with them."""
    out, sources = run.out, run.sources
    _report(out, job.settings.name)
    timings["etl_s"] = run.etl_clock.seconds()
    stats = {
        "phase_s": {k: round(v, 3) for k, v in out.phase_s.items()},
        "curation": out.manifest.curation,
        "spark_start_s": round(timings.get("spark_start_s", 0.0), 3),  # 0: Spark was running
        **run.stats,
    }
    if sources is not None:  # handed to the object store
        stats["object_store_bytes"] = held_per_node(sources)
        _report_held(stats["object_store_bytes"])
    write_json(job.out_dir / STATS_FILE, stats)
    entry = None
    if isinstance(run.staged, s3_cache.Staged):
        entry = run.staged.commit(stats)
    elif run.staged:
        entry = cache.commit(run.staged, stats)
    if to_ray and entry:
        sources = cache.parquet_sources(entry, out.index, job.plan.s3)
    return PreparedData(out.tokenizer, out.manifest, entry, cache_hit=False,
                        index=out.index, sources=sources, stats=stats, timings=timings)


def _report(out: EtlOutput, run_name: str) -> None:
    """The ETL's figures on the console and in Ray's metrics."""
    m = out.manifest
    log.info("ETL: %d files, %d documents, %d tokens, vocab %d (%s), chunks train %d / val %d "
             "(%.2f bytes per token stored)", m.files, m.documents, m.tokens,
             m.vocab_size, m.tokenizer, m.chunks_train, m.chunks_val,
             m.token_bytes_stored / max(m.tokens, 1))
    for line in curation_lines(m.to_json()):
        log.info("ETL %s", line)
    gauges = RunGauges(run_name)
    gauges.set_tagged("etl_phase_s", "phase", out.phase_s)
    gauges.set_tagged("etl_chunks", "split", {"train": m.chunks_train, "val": m.chunks_val})


def _report_held(held: dict[str, int]) -> None:
    """The hand-off's bytes in each node's object store, on the console."""
    import ray

    where = {node["NodeID"]: f"on {node['NodeManagerAddress']} ({node['NodeID'][:8]})"
             for node in ray.nodes()} | {INLINE: "inline in the driver's memory"}
    log.info("hand-off: the chunks are held %s", ", ".join(
        f"{n / 2**20:.2f} MiB {where.get(node, node)}"
        for node, n in sorted(held.items(), key=lambda item: -item[1])))


def curation_lines(m: dict) -> list[str]:
    """What curation removed and found, in a line or two (none when it only counted)."""
    c, lines = m.get("curation") or {}, []
    if c.get("stages"):
        removed = ", ".join(f"{why} {n:,}" for s in c["stages"] for why, n in s["removed"].items())
        clusters = "; ".join(f"{s['stage']} duplicate clusters {s['clusters']['count']:,} "
                             f"(largest {s['clusters']['largest']})"
                             for s in c["stages"] if "clusters" in s)
        lines.append(f"curation: {c['documents_in']:,} → {c['documents_out']:,} documents, "
                     f"{c['bytes_in']:,} → {c['bytes_out']:,} bytes; removed: {removed or 'none'}"
                     f"{'; ' + clusters if clusters else ''}")
    k = c.get("contamination")
    if k:
        removed = k["action"] == "remove" and k["train_documents_overlapping"]
        lines.append(f"contamination ({k['ngram']}-grams): {k['val_documents_overlapping']:,} of "
                     f"{k['val_documents']:,} validation documents share one with "
                     f"{k['train_documents_overlapping']:,} of {k['train_documents']:,} training "
                     f"documents{' (removed)' if removed else ''}")
    return lines


def _phase(out: EtlOutput, name: str, progress: PhaseBar, work):
    """``work()``, timed into ``out.phase_s[name]`` and the progress bar."""
    with timed(out.phase_s, name):
        result = work()
    progress.done(name, out.phase_s[name])
    return result


def _run_etl(spark, plan: EtlPlan, on_phase: Callable[[str, float], None]) -> EtlOutput:
    """``run_etl``, with what fails in the executors or the JVM turned into one line: characters
    a given tokenizer lacks, an S3 object that cannot be read, an input file deleted or changed
    meanwhile."""
    try:
        return run_etl(spark, plan, on_phase)
    # the user gets one line, not the executors' traceback
    except (PythonException, Py4JJavaError) as err:
        check_unchanged(plan.corpus, plan.s3)
        raise (unknown_characters(err, plan.tokenizer) or unreadable_object(err, plan.s3)
               or input_error(err) or err)


def chat_key(plan: EtlPlan) -> dict | None:
    """What a chat ETL reads beyond ``data``: the record (``model.block_size + 1``) and the
    template's text (a model's, or a file's), for the cache key; None for other formats."""
    template = plan.chat_template
    if template is None:
        return None
    return {"block_size": plan.block_size, "template": template.text,
            "template_specials": template.specials}


def write_json(path: Path, content: dict) -> Path:
    path.write_text(json.dumps(content, indent=2))
    return path
