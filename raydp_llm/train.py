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

from raydp_llm import runs, storage
from raydp_llm.checkpoint import export_model_dir, load_model_dir, sample_text
from raydp_llm.cluster import ray_session
from raydp_llm.config import documented_output
from raydp_llm.errors import InputError, RunFailure, cli_errors
from raydp_llm.metrics import read_metrics, write_summary
from raydp_llm.model import read_embeddings
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
from raydp_llm.trainer import FitResult, Launch, RunContext, TrainSpec, fit, steps_per_epoch

log = logging.getLogger(__name__)

# Settings that change how a run is watched or how fast it goes, not what it trains: a run may continue another's
# checkpoints with other values (and with another number of workers, which the spec does not hold).
NOT_IN_FINGERPRINT = ("cpus_per_worker", "compile", "peak_flops", "eval_interval", "eval_batches",
                      "checkpoint_interval")


def train_spec(cfg: DictConfig, data: PreparedData) -> TrainSpec:
    t, o, m = cfg.train, cfg.optim, data.manifest
    per_epoch = steps_per_epoch(m["windows_train"], t.batch_size)
    if per_epoch == 0:
        raise InputError(f"train.batch_size={t.batch_size}: the corpus has only {m['windows_train']} training "
                         "windows, fewer than one batch; lower train.batch_size or use a larger corpus")
    embeddings = cfg.model.get("init_embeddings")
    if embeddings:  # workers run elsewhere: an absolute path, checked here against the vocabulary
        embeddings = to_absolute_path(embeddings)
        read_embeddings(embeddings, data.tokenizer.vocab_size, cfg.model.n_embd)
    spec = dict(
        model={**cfg.model, "vocab_size": data.tokenizer.vocab_size, "init_embeddings": embeddings},
        tokenizer_json=data.tokenizer.to_json(), token_dtype=m["token_dtype"], chars_per_token=m["chars_per_token"],
        batch_size=t.batch_size, grad_accum=t.grad_accum, steps_per_epoch=per_epoch,
        max_steps=t.epochs * per_epoch if t.epochs else t.max_steps, eval_interval=t.eval_interval,
        eval_batches=t.eval_batches, checkpoint_interval=t.checkpoint_interval, lr=o.lr, min_lr=o.min_lr,
        warmup_steps=o.warmup_steps, weight_decay=o.weight_decay, beta1=o.beta1, beta2=o.beta2,
        grad_clip=o.grad_clip, seed=cfg.seed, cpus_per_worker=t.cpus_per_worker, shuffle_buffer=t.shuffle_buffer,
        precision=t.precision, compile=t.compile, peak_flops=t.peak_flops,
    )
    # Runs that may continue each other's checkpoints: the same training on the same data.
    identity = {k: v for k, v in spec.items() if k not in NOT_IN_FINGERPRINT} | {"data": m}
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return TrainSpec(**spec, fingerprint=fingerprint, s3=S3Options.of(cfg.s3))


def resume_checkpoint(cfg: DictConfig, spec: TrainSpec, out_dir: Path) -> str | None:
    """``train.resume``: never; a checkpoint directory (local or s3://); or auto = the newest complete checkpoint
    of an identical run among earlier runs of the same name that no live or finished run continued: this run's
    siblings (``outputs/<name>/*``), or the ``<name>-*`` runs in ``train.storage_path`` (``runs.find_resumable``)."""
    resume = str(cfg.train.resume)
    if resume == "never":
        return None
    if resume != "auto":
        return absolute(resume)
    if cfg.train.storage_path:
        found = runs.find_resumable(absolute(cfg.train.storage_path), spec.fingerprint, spec.max_steps, spec.s3,
                                    run_prefix=f"{cfg.name}-")
    else:
        found = runs.find_resumable(out_dir.parent, spec.fingerprint, spec.max_steps)
    if found:
        log.info("resuming from %s (train.resume=never starts afresh)", found)
    return found


def launch_of(cfg: DictConfig, out_dir: Path, run_storage: str) -> Launch:
    t = cfg.train
    return Launch(num_workers=t.num_workers, min_workers=t.min_workers, out_dir=out_dir, storage=run_storage,
                  keep_checkpoints=t.keep_checkpoints, max_failures=t.max_failures, use_gpu=t.use_gpu,
                  placement=cfg.cluster.placement)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The whole job into ``out_dir``; returns the summary."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    corpus = check_inputs(cfg)  # bad input fails here, before Ray starts
    record = runs.RunRecord(run_id=runs.new_run_id(), out_dir=str(out_dir))
    runs.claim(out_dir, record)  # this directory is this run's alone
    run_storage = absolute(cfg.train.storage_path) if cfg.train.storage_path else str(out_dir / "ray_results")
    run_name = f"{cfg.name}-{record.run_id}"  # never another run's: Ray Train would silently continue it
    with ray_session(cfg.cluster, cfg.name), contextlib.ExitStack() as kept_spark:
        timings["ray_start_s"] = time.perf_counter() - start
        check_workers_fit(cfg)  # a joined cluster's nodes are known now, before the ETL
        check_checkpoint_storage(cfg)
        store = Path(to_absolute_path(cfg.data.cache_dir)) if cfg.data.cache else None
        data = prepare_data(cfg, corpus, out_dir, timings, to_ray=True, store=store, keep=kept_spark)
        write_json(out_dir / "manifest.json", data.manifest)
        spec = train_spec(cfg, data)
        record.resumed_from = resume_checkpoint(cfg, spec, out_dir)
        keeper = runs.RecordKeeper(record, [str(out_dir / runs.RECORD),
                                            storage.join(run_storage, run_name, runs.RECORD)], spec.s3)
        t = time.perf_counter()
        with keeper.beating():
            outcome = fit(spec, RunContext(run_name, resume_from=record.resumed_from), data.datasets,
                          launch_of(cfg, out_dir, run_storage))
            keeper.finish("diverged" if outcome.diverged else "finished")
        if outcome.diverged is None:
            with outcome.checkpoint.as_directory() as d:
                export_model_dir(Path(d), out_dir / "model")
        timings["train_s"] = time.perf_counter() - t
    return finish(cfg, out_dir, data, outcome, timings, start, storage.join(run_storage, run_name))


def finish(cfg: DictConfig, out_dir: Path, data: PreparedData, outcome: FitResult, timings: dict, start: float,
           destination: str) -> dict:
    """After training: the sample, the plots, ``summary.json``, and the outputs copied beside the checkpoints
    when ``train.storage_path`` is set. A diverged run gets no model and no sample, and ends with one line."""
    text = None
    if outcome.diverged is None:
        model, tokenizer = load_model_dir(out_dir / "model")
        s = cfg.sample
        text = sample_text(model, tokenizer, s.prompt, s.max_new_tokens, s.temperature, s.top_k, cfg.seed)
        (out_dir / "samples.txt").write_text(text + "\n")
    timings["total_s"] = time.perf_counter() - start
    rows = read_metrics(out_dir / "metrics.csv") if (out_dir / "metrics.csv").exists() else []
    if rows:
        plot_loss(out_dir / "metrics.csv", out_dir / "loss.png")
        plot_throughput(out_dir / "metrics.csv", out_dir / "throughput.png")
    sizes = {"num_params": model.num_params(), "flops_per_token": model.flops_per_token()} if text else {}
    summary = write_summary(out_dir / "summary.json", rows, status="diverged" if outcome.diverged else "finished",
                            **sizes, resumed_from=outcome.resumed_from, restarts=outcome.restarts,
                            diverged=outcome.diverged, storage=destination if cfg.train.storage_path else None,
                            **{k: round(v, 2) for k, v in timings.items()},
                            etl=data.manifest | {"cache_hit": data.cache_hit},
                            etl_stats={k: v for k, v in data.stats.items() if k != "per_stage"})
    if cfg.train.storage_path:  # the run's outputs beside its checkpoints, where the machine's disk may not last
        copy_outputs(out_dir, destination, S3Options.of(cfg.s3))
    if outcome.diverged:
        raise RunFailure(divergence_line(outcome.diverged, out_dir))
    log.info("done in %.0fs (Ray %.0fs, Spark %.0fs, ETL %.0fs, training %.0fs): val loss %.4f → %.4f; outputs "
             "in %s", timings["total_s"], timings["ray_start_s"], timings.get("spark_start_s", 0.0),
             timings["etl_s"], timings["train_s"], summary["first_val_loss"], summary["final_val_loss"], out_dir)
    log.info("sample:\n%s", text)
    return summary


def divergence_line(diverged: dict, out_dir: Path) -> str:
    last = diverged["last_checkpoint"]
    where = (f"the last good checkpoint is {last['path']} (step {last['step']}): lower optim.lr or set "
             f"optim.grad_clip, then continue from it with train.resume={last['path']}" if last else
             "no checkpoint was taken before it: lower optim.lr or set optim.grad_clip and start again")
    return f"training diverged at step {diverged['step']} ({diverged['what']}); {where}; metrics in {out_dir}"


def copy_outputs(out_dir: Path, destination: str, s3: S3Options) -> None:
    """The run's outputs to ``destination`` (markers last); if that fails, they stay complete in ``out_dir``."""
    try:
        storage.publish(out_dir, destination, s3)
    except OSError as err:
        raise RunFailure(f"the run's outputs could not be copied to {destination} "
                         f"({str(err).splitlines()[0][:200]}); they are complete in {out_dir}: copy them with "
                         f"`aws s3 cp --recursive {out_dir} {destination}`") from None
    log.info("outputs copied to %s", destination)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@cli_errors
def main(cfg: DictConfig) -> float:
    summary = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    return summary["final_val_loss"]


if __name__ == "__main__":
    with documented_output():  # --help, --cfg: each setting with its meaning
        runs.refuse_used_run_dir()  # before Hydra writes its own files into an explicit hydra.run.dir
        main()
