"""``python -m raydp_llm.train [overrides]``: Spark ETL on Ray → Ray Dataset → DDP training → model and text."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from raydp_llm import storage
from raydp_llm.checkpoint import export_model_dir, find_checkpoint, load_model_dir, sample_text
from raydp_llm.cluster import ray_session
from raydp_llm.config import documented_output
from raydp_llm.errors import InputError, cli_errors
from raydp_llm.metrics import read_metrics, write_summary
from raydp_llm.pipeline import (
    PreparedData,
    absolute,
    check_checkpoint_storage,
    check_inputs,
    check_workers_fit,
    prepare_data,
    write_json,
)
from raydp_llm.plots import plot_loss, plot_throughput
from raydp_llm.storage import S3Options
from raydp_llm.trainer import TrainSpec, fit, steps_per_epoch

log = logging.getLogger(__name__)


def train_spec(cfg: DictConfig, data: PreparedData) -> TrainSpec:
    t, o, m = cfg.train, cfg.optim, data.manifest
    micro_batch = t.batch_size // (t.num_workers * t.grad_accum)
    per_epoch = steps_per_epoch(m["windows_train"], micro_batch, t.num_workers, t.grad_accum)
    if per_epoch == 0:
        raise InputError(f"train.batch_size={t.batch_size}: the corpus has only {m['windows_train']} training windows,"
                         " fewer than one batch; lower train.batch_size or use a larger corpus")
    spec = dict(
        model={**cfg.model, "vocab_size": data.tokenizer.vocab_size,  # workers run elsewhere: absolute paths
               "init_embeddings": cfg.model.get("init_embeddings") and to_absolute_path(cfg.model.init_embeddings)},
        tokenizer_json=data.tokenizer.to_json(), token_dtype=m["token_dtype"], chars_per_token=m["chars_per_token"],
        micro_batch=micro_batch, grad_accum=t.grad_accum, steps_per_epoch=per_epoch,
        max_steps=t.epochs * per_epoch if t.epochs else t.max_steps, eval_interval=t.eval_interval,
        eval_batches=t.eval_batches, checkpoint_interval=t.checkpoint_interval, lr=o.lr, min_lr=o.min_lr,
        warmup_steps=o.warmup_steps, weight_decay=o.weight_decay, beta1=o.beta1, beta2=o.beta2,
        grad_clip=o.grad_clip, seed=cfg.seed, cpus_per_worker=t.cpus_per_worker, shuffle_buffer=t.shuffle_buffer,
        precision=t.precision, compile=t.compile, peak_flops=t.peak_flops,
    )
    # Runs that may continue each other's checkpoints: the same spec on the same data and the same workers.
    identity = json.dumps({**spec, "num_workers": t.num_workers, "data": m}, sort_keys=True, default=str)
    return TrainSpec(**spec, fingerprint=hashlib.sha256(identity.encode()).hexdigest()[:20], s3=S3Options.of(cfg.s3))


def resume_checkpoint(cfg: DictConfig, spec: TrainSpec, out_dir: Path) -> str | None:
    """``train.resume``: never; a checkpoint directory (local or s3://); or auto = the latest unfinished checkpoint
    of an identical run among earlier runs of the same name: this run's siblings (``outputs/<name>/*``), or the
    ``<name>-*`` runs in ``train.storage_path``."""
    resume = str(cfg.train.resume)
    if resume == "never":
        return None
    if resume != "auto":
        return absolute(resume)
    if cfg.train.storage_path:
        found = find_checkpoint(absolute(cfg.train.storage_path), spec.fingerprint, spec.max_steps, spec.s3,
                                run_prefix=f"{cfg.name}-")
    else:
        found = find_checkpoint(out_dir.parent, spec.fingerprint, spec.max_steps)
    if found:
        log.info("resuming from %s (train.resume=never starts afresh)", found)
    return found


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The whole job into ``out_dir``; returns the summary."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    corpus = check_inputs(cfg)  # bad input fails here, before Ray starts
    out_dir.mkdir(parents=True, exist_ok=True)
    run_storage = absolute(cfg.train.storage_path) if cfg.train.storage_path else str(out_dir / "ray_results")
    with ray_session(cfg.cluster, cfg.name), contextlib.ExitStack() as kept_spark:
        timings["ray_start_s"] = time.perf_counter() - start
        check_workers_fit(cfg)  # a joined cluster's nodes are known now, before the ETL
        check_checkpoint_storage(cfg)
        store = Path(to_absolute_path(cfg.data.cache_dir)) if cfg.data.cache else None
        data = prepare_data(cfg, corpus, out_dir, timings, to_ray=True, store=store, keep=kept_spark)
        write_json(out_dir / "manifest.json", data.manifest)
        spec = train_spec(cfg, data)
        resume_from = spec.resume_from = resume_checkpoint(cfg, spec, out_dir)
        t = time.perf_counter()
        checkpoint = fit(spec, data.datasets, num_workers=cfg.train.num_workers, use_gpu=cfg.train.use_gpu,
                         out_dir=out_dir, run_name=cfg.name, keep_checkpoints=cfg.train.keep_checkpoints,
                         storage=run_storage, placement=cfg.cluster.placement)
        with checkpoint.as_directory() as d:
            export_model_dir(Path(d), out_dir / "model")
        timings["train_s"] = time.perf_counter() - t

    model, tokenizer = load_model_dir(out_dir / "model")
    s = cfg.sample
    text = sample_text(model, tokenizer, s.prompt, s.max_new_tokens, s.temperature, s.top_k, cfg.seed)
    (out_dir / "samples.txt").write_text(text + "\n")
    timings["total_s"] = time.perf_counter() - start
    plot_loss(out_dir / "metrics.csv", out_dir / "loss.png")
    plot_throughput(out_dir / "metrics.csv", out_dir / "throughput.png")
    summary = write_summary(out_dir / "summary.json", read_metrics(out_dir / "metrics.csv"),
                            num_params=model.num_params(), flops_per_token=model.flops_per_token(),
                            resumed_from=resume_from, storage=storage.join(run_storage, spec.run_name),
                            **{k: round(v, 2) for k, v in timings.items()},
                            etl=data.manifest | {"cache_hit": data.cache_hit},
                            etl_stats={k: v for k, v in data.stats.items() if k != "per_stage"})
    log.info("done in %.0fs (Ray %.0fs, Spark %.0fs, ETL %.0fs, training %.0fs): val loss %.4f → %.4f; outputs in %s",
             timings["total_s"], timings["ray_start_s"], timings.get("spark_start_s", 0.0), timings["etl_s"],
             timings["train_s"], summary["first_val_loss"], summary["final_val_loss"], out_dir)
    log.info("sample:\n%s", text)
    if cfg.train.storage_path:  # the run's outputs beside its checkpoints, where the machine's disk may not last
        storage.copy(out_dir, summary["storage"], spec.s3)
        log.info("outputs copied to %s", summary["storage"])
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@cli_errors
def main(cfg: DictConfig) -> float:
    summary = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    return summary["final_val_loss"]


if __name__ == "__main__":
    with documented_output():  # --help, --cfg: each setting with its meaning
        main()
