"""The steps every entry point shares: check the inputs, then windows from the ETL cache or a Spark ETL."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from py4j.protocol import Py4JJavaError
from pyspark.errors import PythonException

from raydp_llm import cache, integrity, storage
from raydp_llm.checkpoint import STATE_JSON, build_from_dir, read_model_spec
from raydp_llm.cluster import EVENT_LOG_DIR, spark_session
from raydp_llm.config import validate
from raydp_llm.corpus import Corpus, check_unchanged, resolve_corpus
from raydp_llm.errors import InputError, RunFailure
from raydp_llm.etl import EtlOutput, run_etl, to_ray_datasets
from raydp_llm.model import check_model_spec, read_embeddings
from raydp_llm.monitoring import RunGauges
from raydp_llm.progress import PhaseBar, console_bar
from raydp_llm.spark_stats import read_event_log
from raydp_llm.storage import S3Options
from raydp_llm.tokenizer import Tokenizer

log = logging.getLogger(__name__)

STATS_FILE = cache.STATS_FILE


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    manifest: dict
    entry: Path | None  # the dataset on disk (Parquet + tokenizer + manifest), if written or found
    cache_hit: bool
    datasets: dict | None = None  # Ray datasets {"train", "val"} when asked for
    stats: dict = field(default_factory=dict)  # etl_stats.json: Spark's metrics and the phase times


def check_inputs(cfg: DictConfig) -> Corpus:
    """Check the settings (``config.validate``, the model's own checks, the paths that must exist) and resolve the
    corpus, before any engine starts."""
    validate(cfg)
    t, d = cfg.train, cfg.data
    check_model_spec(OmegaConf.to_container(cfg.model, resolve=True))
    if cfg.model.get("init_embeddings"):  # widths and values now; the ids against the vocabulary after the ETL
        read_embeddings(to_absolute_path(cfg.model.init_embeddings), None, cfg.model.n_embd)
    if t.resume not in ("auto", "never"):
        check_resume_checkpoint(absolute(str(t.resume)), cfg)
    if t.storage_path and storage.is_s3(t.storage_path):
        storage.check_bucket("train.storage_path", t.storage_path, S3Options.of(cfg.s3))
    if cfg.tokenizer.get("path") and not Path(to_absolute_path(cfg.tokenizer.path)).is_file():
        raise InputError(f"tokenizer.path={cfg.tokenizer.path}: no such file; give a tokenizer.json")
    path = d.path if d.path is None else absolute(d.path) if isinstance(d.path, str) else [absolute(p) for p in d.path]
    corpus = resolve_corpus(path, markdown=d.markdown, s3=S3Options.of(cfg.s3))
    if d.max_files:
        corpus = Corpus(files=corpus.files[: d.max_files], markdown=corpus.markdown, name=corpus.name,
                        fingerprints=corpus.fingerprints[: d.max_files])
    return corpus


def absolute(path: str) -> str:
    """A path the user gave, relative to where they ran the command; URIs stay as they are."""
    return path if "://" in path else to_absolute_path(path)


def check_resume_checkpoint(location: str, cfg: DictConfig) -> None:
    """``train.resume=<dir>`` (local or s3://) must be a complete training checkpoint (``integrity``) whose config,
    tokenizer and model shape (block size, layers, widths) fit: its weights would not load into another."""
    s3, shown = S3Options.of(cfg.s3), f"train.resume={cfg.train.resume}"
    try:
        if not storage.exists(storage.join(location, STATE_JSON), s3):
            raise InputError(f"{shown}: not a training checkpoint (no {STATE_JSON}); give a checkpoint_* directory "
                             "of an earlier run (under its ray_results/ or train.storage_path), or auto | never")
        if not storage.exists(storage.join(location, integrity.MARKER), s3):
            raise InputError(f"{shown}: damaged, no {integrity.MARKER}: it was never finished; give an earlier "
                             "checkpoint_* of that run, or train.resume=auto (it skips damaged checkpoints)")
        build_from_dir(location, shown, s3)  # complete, and its config and tokenizer fit together
        saved = read_model_spec(location, s3)
    except OSError as err:
        raise storage.unreachable("train.resume", cfg.train.resume, err) from None
    differ = [key for key, value in cfg.model.items() if key in saved and saved[key] != value]
    if differ:
        raise InputError(f"{shown}: the checkpoint's model has {', '.join(f'{k}={saved[k]}' for k in differ)}, the "
                         f"config asks for {', '.join(f'model.{k}={cfg.model[k]}' for k in differ)}; resume with "
                         "the checkpoint's model settings")


def prepare_data(cfg: DictConfig, corpus: Corpus, out_dir: Path, timings: dict, to_ray: bool,
                 store: Path | None, keep: contextlib.ExitStack | None = None) -> PreparedData:
    """Windows from the ETL cache (``data.cache``) or from a Spark ETL run on the running Ray.

    A Spark run writes its dataset to ``store/<key>`` when ``store`` is given and hands the windows to Ray
    with ``from_spark`` when ``to_ray``. Spark is stopped on return, unless ``cluster.keep_executors``:
    then it stays up until ``keep`` closes. ``timings`` gets the phase times (s); Spark's driver log goes
    to ``out_dir``. One run at a time checks or builds a key in ``store`` (``cache.locked``).
    """
    tok_cfg = etl_tokenizer(cfg.tokenizer)
    key = cache.cache_key(corpus, cfg.data, tok_cfg, cfg.model.block_size, cfg.seed)
    fingerprinted = all(f["size"] is not None for f in corpus.fingerprints)
    if cfg.data.cache and not fingerprinted:
        log.info("ETL cache not used: remote inputs have no size or modification time to key it by")
    cache_dir = Path(to_absolute_path(cfg.data.cache_dir)) if cfg.data.cache and fingerprinted else None
    lock_dir = cache_dir or store
    with cache.locked(lock_dir, key) if lock_dir else contextlib.nullcontext():
        entry = cache.lookup(cache_dir, key) if cache_dir else None
        if entry is not None:
            return _from_cache(entry, out_dir, timings, to_ray)
        return _spark_etl(cfg, corpus, tok_cfg, key, out_dir, timings, to_ray, store, keep)


def _from_cache(entry: Path, out_dir: Path, timings: dict, to_ray: bool) -> PreparedData:
    t = time.perf_counter()
    log.info("ETL cache hit: %s (Spark not started)", entry)
    datasets, tokenizer, manifest, stats = cache.read_entry(entry, to_ray)
    timings["etl_s"] = time.perf_counter() - t
    write_json(out_dir / STATS_FILE, stats)
    return PreparedData(tokenizer, manifest, entry, cache_hit=True, datasets=datasets, stats=stats)


def _spark_etl(cfg: DictConfig, corpus: Corpus, tok_cfg: DictConfig, key: str, out_dir: Path,  # noqa: PLR0913
               timings: dict, to_ray: bool, store: Path | None, keep: contextlib.ExitStack | None) -> PreparedData:
    """Spark's part of ``prepare_data``: start Spark, run the ETL, stage the cache entry and hand the windows to
    Ray; then Spark's stats, and the entry committed with them."""
    kept = keep is not None and cfg.cluster.keep_executors
    if kept:
        check_cpus_for_kept_executors(cfg)
    if store is not None:
        check_store_is_shared(store)
    phases = ["spark start", "read", "tokenizer", "encode"] + ["write"] * (store is not None) + ["convert"] * to_ray
    t = time.perf_counter()
    with contextlib.ExitStack() as local, console_bar(len(phases), "ETL", "phase") as bar:
        progress = PhaseBar(bar)
        spark = (keep if kept else local).enter_context(spark_session(cfg.cluster, app_name=cfg.name,
                                                                      log_dir=out_dir))
        timings["spark_start_s"] = time.perf_counter() - t
        progress.done("spark start", timings["spark_start_s"])
        t = time.perf_counter()
        out = _run_etl(spark, cfg, corpus, tok_cfg, progress)
        staged = _phase(out, "write", progress, lambda: cache.stage(out, store, key)) if store else None
        datasets = _phase(out, "convert", progress, lambda: to_ray_datasets(out)) if to_ray else None
        check_unchanged(corpus, S3Options.of(cfg.s3))  # every pass read the same inputs
    m = out.manifest
    log.info("ETL: %d files, %d documents, %d tokens, vocab %d (%s), windows train %d / val %d",
             m["files"], m["documents"], m["tokens"], m["vocab_size"], m["tokenizer"], m["windows_train"],
             m["windows_val"])
    gauges = RunGauges(cfg.name)
    gauges.set_tagged("etl_phase_s", "phase", out.phase_s)
    gauges.set_tagged("etl_windows", "split", {"train": m["windows_train"], "val": m["windows_val"]})
    timings["etl_s"] = time.perf_counter() - t
    stats = {"phase_s": {k: round(v, 3) for k, v in out.phase_s.items()},
             "spark_start_s": round(timings["spark_start_s"], 3), **read_event_log(out_dir / EVENT_LOG_DIR)}
    write_json(out_dir / STATS_FILE, stats)
    entry = cache.commit(staged, stats) if staged else None
    return PreparedData(out.tokenizer, m, entry, cache_hit=False, datasets=datasets, stats=stats)


def _phase(out: EtlOutput, name: str, progress: PhaseBar, work):
    """``work()``, timed into ``out.phase_s[name]`` and the progress bar."""
    t = time.perf_counter()
    result = work()
    out.phase_s[name] = time.perf_counter() - t
    progress.done(name, out.phase_s[name])
    return result


def _run_etl(spark, cfg: DictConfig, corpus: Corpus, tok_cfg: DictConfig, progress: PhaseBar) -> EtlOutput:
    """``etl.run_etl``, with what fails in the executors or the JVM turned into one line: characters a given
    tokenizer lacks, an S3 object that cannot be read, an input file deleted or changed meanwhile."""
    s3 = S3Options.of(cfg.s3)
    try:
        return run_etl(spark, corpus, cfg.data, tok_cfg, block_size=cfg.model.block_size, seed=cfg.seed,
                       on_phase=progress.done, s3=s3)
    except (PythonException, Py4JJavaError) as err:  # the user gets one line, not the executors' traceback
        check_unchanged(corpus, s3)
        raise unknown_characters(err, tok_cfg) or unreadable_object(err, s3) or err


def dataset_store(cfg: DictConfig, out_dir: Path) -> Path:
    """Where an entry point that reads the windows from disk has the ETL write them: the ETL cache, or
    ``dataset/`` in the run directory with ``data.cache=false``."""
    return Path(to_absolute_path(cfg.data.cache_dir)) if cfg.data.cache else out_dir / "dataset"


def etl_tokenizer(tok: DictConfig) -> DictConfig:
    """The tokenizer settings the ETL runs with. A ``tokenizer.path`` wins over ``kind`` (the file names its own
    kind: char, bpe or ids) and stands alone, as an absolute path, under ``kind: file``: the ETL builds a char
    vocabulary for ``kind: char`` and loads ``path`` for any other kind, and the settings for making a tokenizer
    (vocab_size, sample_mb) neither apply to a loaded one nor belong in its cache key."""
    if not tok.get("path"):
        return tok
    return OmegaConf.create({"kind": "file", "path": to_absolute_path(tok.path)})


def _text(err: Exception) -> str:
    """An executor's or the JVM's error as text; a Py4JJavaError asks the JVM, which may be gone."""
    try:
        return str(err)
    except Exception:  # noqa: BLE001 - any failure to describe it: no text to match
        return ""


def unreadable_object(err: Exception, s3: S3Options) -> RunFailure | None:
    """The one-line error for an S3 object the executors could not read after ``s3.max_attempts`` attempts
    (pyarrow's OSError names the key and the bucket), or None for any other failure."""
    found = re.search(r"^OSError: (s3://.*)$", _text(err), re.MULTILINE)
    if found is None:
        return None
    return RunFailure(f"data.path: the executors could not read from S3 after s3.max_attempts={s3.max_attempts} "
                      f"attempts: {found[1][:250]}; check the object, the bucket and s3.endpoint_url, then run again")


def unknown_characters(err: Exception, tok_cfg: DictConfig) -> InputError | None:
    """The one-line error for a corpus with characters a given char tokenizer lacks (``CharTokenizer``'s
    ValueError in the executors: those of the first batch that failed), or None for any other failure."""
    found = re.search(r"^ValueError: characters not in the vocabulary: (.*)$", _text(err), re.MULTILINE)
    if found is None:
        return None
    chars = found[1] if len(found[1]) <= 60 else found[1][:60] + "…"
    return InputError(f"data.path: the corpus has characters that tokenizer.path={tok_cfg.path} lacks, among them "
                      f"{chars}; remove them from the corpus or use a tokenizer (a model) whose vocabulary has them")


def check_cpus_for_kept_executors(cfg: DictConfig) -> None:
    """Kept executors hold their Ray CPUs through training: the running cluster must have room for both."""
    import ray

    c, t = cfg.cluster, cfg.train
    need = c.executors * c.executor_ray_cpus + t.num_workers * t.cpus_per_worker
    have = ray.cluster_resources().get("CPU", 0)
    if need > have:
        raise InputError(f"cluster.keep_executors=true needs {need:g} Ray CPUs (cluster.executors × "
                         f"cluster.executor_ray_cpus + train.num_workers × train.cpus_per_worker) but the cluster "
                         f"has {have:g}: set cluster.keep_executors=false or lower those numbers")


def check_workers_fit(cfg: DictConfig) -> None:
    """Every DDP worker (``train.cpus_per_worker`` CPUs, a GPU with ``train.use_gpu``) must fit on one of the running
    cluster's nodes, or Ray Train would wait for them forever."""
    import ray

    t = cfg.train
    need = {"CPU": t.cpus_per_worker} | ({"GPU": 1} if t.use_gpu else {})
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    fits = sum(min(int(node.get(k, 0) // v) for k, v in need.items()) for node in nodes)
    if fits < (t.min_workers or t.num_workers):
        have = ", ".join(f"{node.get('CPU', 0):g} CPUs/{node.get('GPU', 0):g} GPUs" for node in nodes)
        raise InputError(f"train.num_workers={t.num_workers} workers of {t.cpus_per_worker:g} CPUs"
                         f"{' and 1 GPU' if t.use_gpu else ''}: the Ray cluster's nodes ({have}) hold only {fits}; "
                         "lower train.num_workers or train.cpus_per_worker (cluster=emr: cluster.worker_nodes, "
                         "cluster.node_cpus), or add nodes")


def working_nodes() -> int:
    """The running cluster's live nodes with CPUs: those that run executors and DDP workers."""
    import ray

    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))


def check_store_is_shared(store: Path) -> None:
    """Spark's executors write the dataset's Parquet files where they run: on a cluster of several nodes a local
    directory would end up scattered over the nodes' disks."""
    nodes = working_nodes()
    if nodes > 1:
        raise InputError(f"{store}: Spark's executors would write the dataset to this directory on each of the "
                         f"cluster's {nodes} nodes; on a cluster set data.cache=false (training then takes the "
                         "windows from Spark directly), and run prepare and evaluate on one machine")


def check_checkpoint_storage(cfg: DictConfig) -> None:
    """Ray Train's workers write checkpoints on their own nodes: on a cluster of several nodes they need storage
    every node reaches, which the default (the run directory) is not."""
    nodes = working_nodes()
    if nodes > 1 and not cfg.train.storage_path:
        raise InputError(f"train.storage_path is not set: on a cluster of {nodes} nodes the DDP workers' checkpoints "
                         "need storage every node reaches; set train.storage_path=s3://bucket/prefix (or a shared "
                         "filesystem's mount)")


def write_json(path: Path, content: dict) -> Path:
    path.write_text(json.dumps(content, indent=2))
    return path
