"""The steps every entry point shares: resolve the corpus, start Ray and Spark, run the ETL."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Iterator

from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from raydp_llm.cluster import spark_session
from raydp_llm.corpus import Corpus, resolve_corpus
from raydp_llm.errors import InputError
from raydp_llm.etl import EtlOutput, run_etl

log = logging.getLogger(__name__)


def check_inputs(cfg: DictConfig) -> Corpus:
    """Check the settings that would fail late and resolve the corpus, before any engine starts."""
    m, t = cfg.model, cfg.train
    if m.n_embd % m.n_head:
        raise InputError(f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}; pick a divisor")
    if t.batch_size % t.num_workers:
        raise InputError(f"train.batch_size={t.batch_size} is not divisible by train.num_workers={t.num_workers}; "
                         "it is the global batch, split evenly over the workers")
    if not 0 < cfg.data.val_fraction < 1:
        raise InputError(f"data.val_fraction={cfg.data.val_fraction} must lie strictly between 0 and 1")
    return corpus_from_config(cfg.data)


def corpus_from_config(data: DictConfig) -> Corpus:
    corpus = resolve_corpus(to_absolute_path(data.path) if data.path else None, markdown=data.markdown)
    if data.max_documents:
        corpus = Corpus(files=corpus.files[: data.max_documents], markdown=corpus.markdown, name=corpus.name)
    return corpus


@contextlib.contextmanager
def etl_session(cfg: DictConfig, corpus: Corpus, timings: dict, out_dir: Path) -> Iterator[EtlOutput]:
    """Ray up, Spark up, ETL done: yields the ETL output while Spark still runs, then stops Spark.

    Ray stays up until the enclosing ``ray_session`` ends; ``timings`` gets the phase times in seconds;
    Spark's driver log goes to ``out_dir``.
    """
    t = time.perf_counter()
    with spark_session(cfg.cluster, app_name=cfg.name, log_dir=out_dir) as spark:
        timings["spark_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out = run_etl(spark, corpus, block_size=cfg.model.block_size, stride=cfg.data.stride,
                      val_fraction=cfg.data.val_fraction, seed=cfg.seed,
                      parallelism=cfg.cluster.executors * cfg.cluster.executor_cores)
        log.info("ETL: %d documents, %d tokens, vocab %d, windows train %d / val %d",
                 out.manifest["documents"], out.manifest["tokens"], out.manifest["vocab_size"],
                 out.manifest["windows_train"], out.manifest["windows_val"])
        yield out
        timings["etl_s"] = time.perf_counter() - t


def write_manifest(out: EtlOutput, directory: Path) -> Path:
    path = directory / "manifest.json"
    path.write_text(json.dumps(out.manifest, indent=2))
    return path
