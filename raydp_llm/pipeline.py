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
from pyspark.errors import PythonException

from raydp_llm import cache, storage
from raydp_llm.checkpoint import STATE_JSON, read_model_spec
from raydp_llm.cluster import EVENT_LOG_DIR, spark_session
from raydp_llm.config import validate
from raydp_llm.corpus import Corpus, resolve_corpus
from raydp_llm.errors import InputError
from raydp_llm.etl import run_etl, to_ray_datasets
from raydp_llm.model import check_model_spec
from raydp_llm.monitoring import RunGauges
from raydp_llm.progress import PhaseBar, console_bar
from raydp_llm.spark_stats import read_event_log
from raydp_llm.storage import S3Options
from raydp_llm.tokenizer import Tokenizer

log = logging.getLogger(__name__)

STATS_FILE = "etl_stats.json"


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
    """``train.resume=<dir>`` (local or s3://) must be a training checkpoint of a model with the configured shape
    (block size, layers, widths): its weights would not load into another."""
    s3 = S3Options.of(cfg.s3)
    try:
        found = storage.exists(storage.join(location, STATE_JSON), s3)
        saved = read_model_spec(location, s3) if found else {}
    except OSError as err:
        raise storage.unreachable("train.resume", cfg.train.resume, err) from None
    if not found:
        raise InputError(f"train.resume={cfg.train.resume}: not a training checkpoint (no {STATE_JSON}); give a "
                         "checkpoint_* directory of an earlier run (under its ray_results/ or train.storage_path), "
                         "or auto | never")
    differ = [key for key, value in cfg.model.items() if key in saved and saved[key] != value]
    if differ:
        raise InputError(f"train.resume={cfg.train.resume}: the checkpoint's model has "
                         f"{', '.join(f'{k}={saved[k]}' for k in differ)}, the config asks for "
                         f"{', '.join(f'model.{k}={cfg.model[k]}' for k in differ)}; resume with the checkpoint's "
                         "model settings")


def prepare_data(cfg: DictConfig, corpus: Corpus, out_dir: Path, timings: dict, to_ray: bool,
                 store: Path | None, keep: contextlib.ExitStack | None = None) -> PreparedData:
    """Windows from the ETL cache (``data.cache``) or from a Spark ETL run on the running Ray.

    A Spark run writes its dataset to ``store/<key>`` when ``store`` is given and hands the windows to Ray
    with ``from_spark`` when ``to_ray``. Spark is stopped on return, unless ``cluster.keep_executors``:
    then it stays up until ``keep`` closes. ``timings`` gets the phase times (s); Spark's driver log goes
    to ``out_dir``.
    """
    tok_cfg = etl_tokenizer(cfg.tokenizer)
    key = cache.cache_key(corpus, cfg.data, tok_cfg, cfg.model.block_size, cfg.seed)
    fingerprinted = all(f["size"] is not None for f in corpus.fingerprints)
    if cfg.data.cache and not fingerprinted:
        log.info("ETL cache not used: remote inputs have no size or modification time to key it by")
    use_cache = cfg.data.cache and fingerprinted
    entry = cache.lookup(Path(to_absolute_path(cfg.data.cache_dir)), key) if use_cache else None
    if entry is not None:
        t = time.perf_counter()
        log.info("ETL cache hit: %s (Spark not started)", entry)
        datasets, tokenizer, manifest = cache.read_entry(entry, to_ray)
        timings["etl_s"] = time.perf_counter() - t
        stats_file = entry / STATS_FILE
        stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
        write_json(out_dir / STATS_FILE, stats)
        return PreparedData(tokenizer, manifest, entry, cache_hit=True, datasets=datasets, stats=stats)

    kept = keep is not None and cfg.cluster.keep_executors
    if kept:
        check_cpus_for_kept_executors(cfg)
    if store is not None:
        check_store_is_shared(store)
    phases = ["spark start", "read", "tokenizer", "encode"] + ["write"] * (store is not None) + ["convert"] * to_ray
    t = time.perf_counter()
    with contextlib.ExitStack() as local, console_bar(len(phases), "ETL", "phase") as bar:
        progress = PhaseBar(bar)
        scope = keep if kept else local
        spark = scope.enter_context(spark_session(cfg.cluster, app_name=cfg.name, log_dir=out_dir))
        timings["spark_start_s"] = time.perf_counter() - t
        progress.done("spark start", timings["spark_start_s"])
        t = time.perf_counter()
        try:
            out = run_etl(spark, corpus, cfg.data, tok_cfg, block_size=cfg.model.block_size, seed=cfg.seed,
                          on_phase=progress.done, s3=S3Options.of(cfg.s3))
        except PythonException as err:  # raised in the executors: the user gets one line, not their traceback
            raise unknown_characters(err, tok_cfg) or err
        m = out.manifest
        if store is not None:
            t_write = time.perf_counter()
            entry = cache.write_entry(out, store, key)
            out.phase_s["write"] = time.perf_counter() - t_write
            progress.done("write", out.phase_s["write"])
        datasets = None
        if to_ray:
            t_convert = time.perf_counter()
            datasets = to_ray_datasets(out)
            out.phase_s["convert"] = time.perf_counter() - t_convert
            progress.done("convert", out.phase_s["convert"])
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
    if entry is not None:
        write_json(entry / STATS_FILE, stats)
    return PreparedData(out.tokenizer, m, entry, cache_hit=False, datasets=datasets, stats=stats)


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


def unknown_characters(err: PythonException, tok_cfg: DictConfig) -> InputError | None:
    """The one-line error for a corpus with characters a given char tokenizer lacks (``CharTokenizer``'s
    ValueError in the executors: those of the first batch that failed), or None for any other failure."""
    found = re.search(r"^ValueError: characters not in the vocabulary: (.*)$", str(err), re.MULTILINE)
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
    if fits < t.num_workers:
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
