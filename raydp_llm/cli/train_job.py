"""The training job behind ``python -m raydp_llm.train``, once ``cli/train.py`` has checked its
input: Ray, the ETL (or its cache), DDP training, the model, the sample, the summary."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from raydp_llm.cli.session import JobSession, job_session
from raydp_llm.core import lora, storage
from raydp_llm.core.config import Settings
from raydp_llm.core.errors import RunFailure, first_line
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import Stopwatch, timed
from raydp_llm.data.chat import model_template
from raydp_llm.data.corpus import Corpus
from raydp_llm.data.prepare import PreparedData, samplings, write_json
from raydp_llm.engines.preflight import fits_beside_spark
from raydp_llm.training import runs, sharded, tracking
from raydp_llm.training.checkpoint import export_model_dir, load_model_dir
from raydp_llm.training.fit import FitResult, Launch, started, startup_phases, startup_timeline
from raydp_llm.training.generation import chat_reply, sample_text
from raydp_llm.training.metrics import read_metrics, write_summary
from raydp_llm.training.plots import plot_loss, plot_throughput
from raydp_llm.training.spec import TrainSpec, build_spec

log = logging.getLogger(__name__)


def resume_checkpoint(settings: Settings, spec: TrainSpec, out_dir: Path) -> str | None:
    """``train.resume``: never; a checkpoint directory (local or s3://); or auto = the newest
    complete checkpoint of an identical run among earlier runs of the same name that no live or
    finished run continued: this run's siblings (``outputs/<name>/*``), or the ``<name>-*`` runs in
    ``train.storage_path`` (``runs.find_resumable``)."""
    train = settings.train
    if train.resume == "never":
        return None
    if train.resume != "auto":
        return train.resume
    if train.storage_path:
        found = runs.find_resumable(train.storage_path, spec.fingerprint, spec.max_steps, spec.s3,
                                    run_prefix=f"{settings.name}-")
    else:
        found = runs.find_resumable(out_dir.parent, spec.fingerprint, spec.max_steps)
    if found:
        log.info("resuming from %s (train.resume=never starts afresh)", found)
    return found


@dataclass
class Trained:
    """A finished training: the data it ran on, what it did, the seconds each phase took, and
    where its outputs go."""

    data: PreparedData
    outcome: FitResult
    timings: dict
    # where the outputs are copied beside the checkpoints, <storage>/<run name>; None without
    # train.storage_path (the checkpoints are in the run directory already)
    destination: str | None


def run_checked(settings: Settings, corpus: Corpus, out_dir: Path, started: dict,
                sweep_dir: str | None = None) -> dict:
    """The whole job on checked ``settings`` into ``out_dir``, tracked as ``settings.tracking``
    says (a job of the sweep in ``sweep_dir`` nests under its parent run); returns the summary.
    ``started``: when the command began (its process) and when its Python was ready (imports
    done, input checked), in ``time.time()`` seconds."""
    total = Stopwatch()
    record = runs.RunRecord(run_id=runs.new_run_id(), out_dir=str(out_dir))
    # never another run's: Ray Train would silently continue it
    run_name = f"{settings.name}-{record.run_id}"
    # the ETL cache, when on, holds the dataset the workers read (else Ray's object store)
    store = Path(settings.data.cache_dir) if settings.data.cache else None
    with tracking.tracked(tracking.tracker(settings.tracking), out_dir) as tracker:
        # this directory is this run's alone (a run refused for its input gives it back); the
        # cluster's nodes are known once Ray is up, before the ETL
        with (runs.claimed(out_dir, record),
              job_session(settings, store, settings.train, clock=total) as session):
            job = Job(out_dir, record, run_name, tracker, sweep_dir)
            trained = train(settings, corpus, job, session)
        trained.timings["startup"] = startup(started, trained.timings, trained.outcome)
        outputs = artifacts(settings, out_dir, trained, total)
        publish(settings, out_dir, trained)
        return report(out_dir, trained, outputs)


@dataclass
class Job:
    """Who trains: the run's directory, record and Ray Train name, its tracking, its sweep."""

    out_dir: Path
    record: runs.RunRecord
    run_name: str
    tracker: tracking.NoTracking
    sweep_dir: str | None


def train(settings: Settings, corpus, job: Job, session: JobSession) -> Trained:
    """The ETL (or its cache), then training, on the running Ray; the model into ``model/``;
    seconds per phase into the session's ``timings``. Ray Train's worker group starts now, beside
    Spark and the ETL, when the cluster holds both (``fits_beside_spark``), else once the data is
    there; its workers wait for their spec and data (``StartedFit.train``)."""
    out_dir, record = job.out_dir, job.record
    run_storage = settings.train.storage_path or str(out_dir / "ray_results")
    launch = Launch(out_dir, run_storage, settings.cluster.placement,
                    on_metrics=job.tracker.log_row)
    with (started(settings.train, S3Options.of(settings.s3), job.run_name, launch,
                  now=fits_beside_spark(settings.cluster, settings.train)) as run_fit,
          session.prepared(corpus, out_dir, to_ray=True) as data):
        run_fit.mark("data_ready")
        write_json(out_dir / "manifest.json", data.manifest)
        spec = build_spec(settings, data.tokenizer, data.manifest, samplings(settings))
        record.resumed_from = resume_checkpoint(settings, spec, out_dir)
        job.tracker.start(settings, job.run_name, record, data.manifest.get("etl_key"),
                          job.sweep_dir)
        keeper = runs.RecordKeeper(
            record,
            [str(out_dir / runs.RECORD), storage.join(run_storage, job.run_name, runs.RECORD)],
            spec.s3,
        )
        with timed(session.timings, "train_s"), keeper.beating():
            outcome = run_fit.train(
                spec, {name: (data.sources[name], data.index[name]) for name in data.index},
                record.resumed_from)
            keeper.finish("diverged" if outcome.diverged else "finished")
        if outcome.diverged is None:
            storage.retried(lambda: _export(outcome.checkpoint, out_dir / "model", spec), spec.s3)
    destination = storage.join(run_storage, job.run_name) if settings.train.storage_path else None
    return Trained(data, outcome, session.timings, destination)


def startup(started: dict, timings: dict, outcome: FitResult) -> dict:
    """Where the seconds before the first step (and after the last) went, phase by phase, and
    ``timeline``: when each phase ran, ``[start, end]`` in seconds after the command's start (the
    worker group's start runs beside Spark and the ETL: ``overlapped_s`` of it)."""
    phases = {"python_start_s": started["run"] - started["command"],
              "ray_start_s": timings["ray_start_s"], "spark_start_s": timings.get("spark_start_s"),
              "etl_s": timings["etl_s"]}
    phases |= startup_phases(outcome.marks)
    if "first_step" in outcome.marks:
        phases["command_to_first_step_s"] = outcome.marks["first_step"] - started["command"]
    phases = {k: v if v is None else round(v, 2) for k, v in phases.items()}
    return phases | {"timeline": timeline(started, timings, outcome.marks)}


def timeline(started: dict, timings: dict, marks: dict) -> dict:
    """``[start, end]`` of each start-up phase, in seconds after the command's start: the
    driver's from its timings (the ETL ends when the driver has the data, Spark's start precedes
    it), Ray Train's from its marks (``fit.startup_timeline``)."""
    origin, ray_up = started["command"], started["run"] + timings["ray_start_s"]
    spans = {"python_start": [origin, started["run"]], "ray_start": [started["run"], ray_up]}
    if "data_ready" in marks:
        etl_start = marks["data_ready"] - timings["etl_s"]
        if timings.get("spark_start_s") is not None:
            spans["spark_start"] = [etl_start - timings["spark_start_s"], etl_start]
        spans["etl"] = [etl_start, marks["data_ready"]]
    spans = {name: [round(t - origin, 2) for t in span] for name, span in spans.items()}
    return spans | startup_timeline(marks, origin)


def _export(checkpoint, directory: Path, spec: TrainSpec) -> None:
    """The model of Ray Train's final ``checkpoint`` (local, or downloaded from S3) into
    ``directory``: its model files, or its shards gathered into a full model."""
    with checkpoint.as_directory() as d:
        if sharded.is_sharded(Path(d)):
            sharded.export(Path(d), directory, spec.model, spec.tokenizer(),
                           spec.s3)
        else:
            export_model_dir(Path(d), directory)


# After training: its artifacts, published, and the closing report.


@dataclass
class Sample:
    """The trained model's continuation of ``sample.prompt``, and its size."""

    text: str | None = None
    sizes: dict = field(default_factory=dict)  # num_params, flops_per_token


@dataclass
class Outputs:
    """What a run leaves beside its model: the sample, and the summary (``summary.json``)."""

    sample: Sample
    summary: dict


def artifacts(settings: Settings, out_dir: Path, trained: Trained, total: Stopwatch) -> Outputs:
    """After training, into ``out_dir``: the model's sample (``samples.txt``), the plots and
    ``summary.json``. A diverged run has no model, so no sample."""
    sample = write_sample(settings, out_dir) if trained.outcome.diverged is None else Sample()
    timings = trained.timings
    timings["total_s"] = total.seconds()
    metrics_csv = out_dir / "metrics.csv"
    rows = read_metrics(metrics_csv) if metrics_csv.exists() else []
    if rows:
        plot_loss(metrics_csv, out_dir / "loss.png")
        plot_throughput(metrics_csv, out_dir / "throughput.png")
    outcome, data = trained.outcome, trained.data
    summary = write_summary(
        out_dir / "summary.json",
        rows,
        status="diverged" if outcome.diverged else "finished",
        **sample.sizes,
        resumed_from=outcome.resumed_from,
        restarts=outcome.restarts,
        diverged=outcome.diverged,
        storage=trained.destination,
        **{k: v if isinstance(v, dict) else round(v, 2) for k, v in timings.items()},
        etl=data.manifest | {"cache_hit": data.cache_hit},
        etl_stats={k: v for k, v in data.stats.items() if k != "per_stage"},
    )
    return Outputs(sample, summary)


def write_sample(settings: Settings, out_dir: Path) -> Sample:
    """The model of ``out_dir/model`` continues ``sample.prompt`` into ``samples.txt``; a chat
    model (data.format=chat) replies to it as a user turn."""
    model, tokenizer = load_model_dir(out_dir / "model")
    sample = settings.sample
    chat = model_template(out_dir / "model")
    if settings.data.format == "chat" and chat is not None:
        text = chat_reply(model, tokenizer, chat, sample, settings.seed)
    else:
        text = sample_text(model, tokenizer, sample.prompt, sample.max_new_tokens,
                           sample.temperature, sample.top_k, settings.seed)
    (out_dir / "samples.txt").write_text(text + "\n")
    return Sample(text, {"num_params": model.num_params(),
                         "trainable_params": trainable_params(model, settings.model,
                                                              out_dir / "model"),
                         "flops_per_token": model.flops_per_token()})


def trainable_params(model, cfg, model_dir: Path) -> int:
    """The parameters the run trained: a LoRA run's adapter (``model/adapter``), else the model's
    but frozen embeddings."""
    adapter = lora.adapter_params(model_dir)
    if adapter is not None:
        return adapter
    return model.num_params() - (model.wte.weight.numel()
                                 if getattr(cfg, "freeze_embeddings", False) else 0)


def publish(settings: Settings, out_dir: Path, trained: Trained) -> None:
    """The run's outputs copied beside its checkpoints when ``train.storage_path`` is set, where
    the machine's disk may not last."""
    if trained.destination:
        copy_outputs(out_dir, trained.destination, S3Options.of(settings.s3))


def report(out_dir: Path, trained: Trained, outputs: Outputs) -> dict:
    """The run's last words: a diverged run ends with one line (``RunFailure``); a finished one
    logs its times, its validation loss and its sample. Returns the summary."""
    outcome, timings, summary = trained.outcome, trained.timings, outputs.summary
    if outcome.diverged:
        raise RunFailure(divergence_line(outcome.diverged, out_dir))
    log.info(
        "done in %.0fs (Ray %.0fs, Spark %.0fs, ETL %.0fs, training %.0fs): val loss %.4f → "
        "%.4f; outputs in %s",
        timings["total_s"],
        timings["ray_start_s"],
        timings.get("spark_start_s", 0.0),
        timings["etl_s"],
        timings["train_s"],
        summary["first_val_loss"],
        summary["final_val_loss"],
        out_dir,
    )
    log.info("sample:\n%s", outputs.sample.text)
    return summary


def divergence_line(diverged: dict, out_dir: Path) -> str:
    last = diverged["last_checkpoint"]
    if last:
        where = (f"the last good checkpoint is {last['path']} (step {last['step']}): lower "
                 "optim.lr or set optim.grad_clip, then continue from it with "
                 f"train.resume={last['path']}")
    else:
        where = ("no checkpoint was taken before it: lower optim.lr or set optim.grad_clip and "
                 "start again")
    return (f"training diverged at step {diverged['step']} ({diverged['what']}); {where}; "
            f"metrics in {out_dir}")


def copy_outputs(out_dir: Path, destination: str, s3: S3Options) -> None:
    """The run's outputs to ``destination`` (markers last); if that fails, they stay complete in
    ``out_dir``."""
    try:
        storage.publish(out_dir, destination, s3)
    except OSError as err:
        raise RunFailure(
            f"the run's outputs could not be copied to {destination} "
            f"({first_line(err, 200)}); they are complete in {out_dir}: "
            f"copy them with `aws s3 cp --recursive {out_dir} {destination}`"
        ) from None
    log.info("outputs copied to %s", destination)
