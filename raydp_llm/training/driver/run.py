"""A training run, read top to bottom: ``run`` lists its phases (engines, data, fit, export,
report), once ``cli/train.py`` has checked its input."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raydp_llm.checkpoint import checkpointer
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.core import integrity, storage
from raydp_llm.core.config import Settings
from raydp_llm.core.errors import RunFailure, first_line
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import Span, Started, Stopwatch, in_background, timed
from raydp_llm.data import cache
from raydp_llm.data.chat.template import model_template
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.inputs.tables import DATA_RECORD
from raydp_llm.data.left_out import LeftOut
from raydp_llm.data.prepare import PreparedData, write_json
from raydp_llm.data.prompts.dataset import PromptData
from raydp_llm.engines.preflight import fits_beside_spark
from raydp_llm.models import lora
from raydp_llm.training.driver import fit, reference, runs, tracking
from raydp_llm.training.driver.fit import (
    FitResult,
    Launch,
    StartedFit,
    startup_phases,
    startup_timeline,
)
from raydp_llm.training.driver.generation import chat_reply, sample_text
from raydp_llm.training.driver.lost_blocks import REMADE_DIR, made_again
from raydp_llm.training.driver.metrics import read_metrics, write_summary
from raydp_llm.training.driver.mixed_data import MixedData
from raydp_llm.training.driver.plots import plot_loss, plot_throughput
from raydp_llm.training.driver.session import job_session
from raydp_llm.training.driver.trial_reports import in_trial
from raydp_llm.training.objectives.rollout import sample_lines
from raydp_llm.training.spec import TrainSpec, build_prompt_spec, build_spec, samplings

if TYPE_CHECKING:
    from ray.train import Checkpoint

log = logging.getLogger(__name__)

# in the run directory: the final model, and the best checkpoint's by train.best_by
MODEL_DIR, BEST_MODEL_DIR = "model", "best_model"


def resume_checkpoint(settings: Settings, spec: TrainSpec, out_dir: Path,
                      sweep_dir: str | None = None) -> str | None:
    """``train.resume``: never; a checkpoint directory (local or s3://); or auto = the newest
    complete checkpoint of an identical run among earlier runs of the same name that no live or
    finished run continued: this run's siblings (``outputs/<name>/*``), or the ``<name>-*`` runs in
    ``train.storage_path`` (``runs.find_resumable``). A sweep's job continues only its own: its
    directory's earlier attempts (``<job>.attempt-<k>``), or its own runs in the storage, never a
    sibling job's, whatever settings they share."""
    train = settings.train
    if train.resume == "never":
        return None
    if train.resume != "auto":
        return train.resume
    root, kin = runs.resume_scope(settings, out_dir, sweep_dir)
    found = runs.find_resumable(root, spec.fingerprint, spec.max_steps, spec.s3, run_prefix=kin)
    if found:
        log.info("resuming from %s (train.resume=never starts afresh)", found)
    return found


@dataclass
class Trained:
    """A finished training: the data it ran on, what it did, the seconds each phase took, and
    where its outputs go."""

    data: PreparedData | MixedData
    outcome: FitResult
    timings: dict
    ray_up: Span  # when Ray's start began and when it was up
    # where the outputs are copied beside the checkpoints, <storage>/<run name>; None without
    # train.storage_path (the checkpoints are in the run directory already)
    destination: str | None


@dataclass
class Job:
    """Who trains: the run's directory, record and Ray Train name, where its checkpoints and its
    dataset go, its tracking, its sweep."""

    out_dir: Path
    record: runs.RunRecord
    run_name: str  # never another run's: Ray Train would silently continue it
    run_storage: str  # train.storage_path, else the run directory's ray_results/
    # where the outputs are copied beside the checkpoints, <storage>/<run name>; None without
    # train.storage_path (the checkpoints are in the run directory already)
    destination: str | None
    store: Path | str | None  # the ETL cache (str: on S3), when on, holds the dataset (else Ray's
    # object store)
    tracker: tracking.NoTracking
    sweep_dir: str | None

    @classmethod
    def new(cls, settings: Settings, out_dir: Path, tracker: tracking.NoTracking,
            sweep_dir: str | None) -> Job:
        record = runs.RunRecord(run_id=runs.new_run_id(), out_dir=str(out_dir))
        run_name = f"{runs.run_prefix(settings, out_dir, sweep_dir)}{record.run_id}"
        storage_path = settings.train.storage_path
        destination = storage.join(storage_path, run_name) if storage_path else None
        store = cache.location(settings.data.cache_dir) if settings.data.cache else None
        return cls(out_dir, record, run_name, storage_path or str(out_dir / "ray_results"),
                   destination, store, tracker, sweep_dir)


def run(settings: Settings, corpus: Corpus, out_dir: Path, started: Started,
        sweep_dir: str | None = None) -> dict:
    """A train job on checked ``settings`` into ``out_dir``, phase by phase: the engines (Ray up,
    the cluster checked), the data (the ETL or its cache), the fit (Ray Train), the export
    (``model/``), then the report (sample, plots, summary, published); the worker group waits for
    its spec and data while the ETL runs (``fit.started``). Tracked as
    ``settings.tracking`` says (a job of the sweep in ``sweep_dir`` nests under its parent run);
    returns the summary. ``started``: when the command began (its process) and when its Python was
    ready (imports done, input checked), in ``time.time()`` seconds."""
    total = Stopwatch()
    with tracking.tracked(tracking.tracker(settings.tracking), out_dir) as tracker:
        job = Job.new(settings, out_dir, tracker, sweep_dir)
        launch = Launch(out_dir, job.run_storage, settings.cluster.placement,
                        on_metrics=tracker.log_row)
        # the directory is this run's alone (a run refused for its input gives it back); Ray
        # Train's worker group starts beside Spark and the ETL when the cluster holds both
        with (runs.claimed(out_dir, job.record),
              job_session(settings, job.store, settings.train) as session,
              fit.started(settings.train, S3Options.of(settings.s3), job.run_name, launch,
                          now=early_start(settings)) as group,
              session.training_data(corpus, out_dir) as data):
            group.mark("data_ready")
            spec = specify(settings, data, job)
            remake = functools.partial(made_again, session, corpus, out_dir / "remade",
                                       storage.join(job.run_storage, job.run_name, REMADE_DIR))
            with timed(session.timings, "train_s"):
                outcome = train(spec, data, job, group, remake)
            if outcome.diverged is None:
                export(outcome, out_dir, spec, job.record.learned_from())
            # the sample is written while Spark, the worker group and Ray stop (no process is
            # started meanwhile: a fork beside a thread's import can deadlock on Python's locks)
            sampling = in_background("sample", sample_of, settings, out_dir, outcome,
                                     sample_prompts(data))
        trained = Trained(data, outcome, session.timings, session.ray_up, job.destination)
        trained.timings["startup"] = startup(started, trained)
        outputs = artifacts(out_dir, trained, total, sampling.result())
        publish(settings, out_dir, trained)
        return report(out_dir, trained, outputs)


def early_start(settings: Settings) -> bool:
    """Whether the worker group starts beside Spark and the ETL: where the cluster holds both, and
    not in a sweep's trial, whose cluster other trials share (its workers would hold CPUs that
    another trial's Spark, in its turn, waits for)."""
    return fits_beside_spark(settings.cluster, settings.train) and not in_trial()


def specify(settings: Settings, data: PreparedData | MixedData, job: Job) -> TrainSpec:
    """What the workers train, from the settings and the data (written as ``manifest.json``);
    where the run resumes from; the tracking run started."""
    manifest = data.manifest_json()
    write_json(job.out_dir / "manifest.json", manifest)
    job.record.table = manifest.get("table")
    job.record.source_tables = {name: source["table"] for name, source
                                in manifest.get("sources", {}).items() if source.get("table")}
    if isinstance(data, PromptData):
        spec = build_prompt_spec(settings, data)
    else:
        spec = build_spec(settings, data.tokenizer, data.manifest, data.windows,
                          samplings(settings), getattr(data, "mixture", None))
    job.record.resumed_from = resume_checkpoint(settings, spec, job.out_dir, job.sweep_dir)
    job.tracker.start(settings, job.run_name, job.record, data.manifest.etl_key,
                      job.sweep_dir)
    return spec


def left_out_summary(data: PreparedData | MixedData) -> dict:
    """``summary.json``'s ``left_out``: the rows read, kept and left out by reason (chat,
    preference); none for other data."""
    left = LeftOut.of(data.manifest.chat)
    return {} if left is None else {"left_out": left.to_json()}


def train(spec: TrainSpec, data: PreparedData, job: Job, group: StartedFit,
          remake: Callable[[], dict]) -> FitResult:
    """Ray Train's fit on the prepared data by the worker group started beside the ETL, the run's
    record beating beside it (in the run directory and the checkpoints' storage) and closed as
    finished or diverged; ``remake()``: the data again, should blocks of it be lost."""
    keeper = runs.RecordKeeper(
        job.record,
        [str(job.out_dir / runs.RECORD), storage.join(job.run_storage, job.run_name, runs.RECORD)],
        spec.s3,
    )
    with keeper.beating():
        outcome = group.train(spec, data.splits(), job.record.resumed_from, remake)
        keeper.finish("diverged" if outcome.diverged else "finished")
    return outcome


def startup(started: Started, trained: Trained) -> dict:
    """Where the seconds before the first step (and after the last) went, phase by phase, and
    ``timeline``: when each phase ran, ``[start, end]`` in seconds after the command's start (the
    worker group's start runs beside Spark and the ETL: ``overlapped_s`` of it)."""
    timings, outcome = trained.timings, trained.outcome
    phases = {"python_start_s": started.ready - started.command,
              "ray_start_s": timings["ray_start_s"], "spark_start_s": timings.get("spark_start_s"),
              "etl_s": timings["etl_s"]}
    phases |= startup_phases(outcome.marks)
    if "first_step" in outcome.marks:
        phases["command_to_first_step_s"] = outcome.marks["first_step"] - started.command
    phases = {k: v if v is None else round(v, 2) for k, v in phases.items()}
    return phases | {"timeline": timeline(started, timings, trained.ray_up, outcome.marks)}


def timeline(started: Started, timings: dict, ray_up: Span, marks: dict) -> dict:
    """``[start, end]`` of each start-up phase, in seconds after the command's start: the
    driver's from its timings (the ETL ends when the driver has the data, Spark's start precedes
    it), Ray Train's from its marks (``fit.startup_timeline``)."""
    origin = started.command
    spans = {"python_start": [origin, started.ready], "ray_start": [ray_up.began, ray_up.done]}
    if "data_ready" in marks:
        etl_start = marks["data_ready"] - timings["etl_s"]
        if timings.get("spark_start_s") is not None:
            spans["spark_start"] = [etl_start - timings["spark_start_s"], etl_start]
        spans["etl"] = [etl_start, marks["data_ready"]]
    spans = {name: [round(t - origin, 2) for t in span] for name, span in spans.items()}
    return spans | startup_timeline(marks, origin)


def export(outcome: FitResult, out_dir: Path, spec: TrainSpec, learned: dict | None) -> None:
    """The model of the fit's final checkpoint into ``out_dir/model``, and with
    ``train.best_by`` the best checkpoint's into ``out_dir/best_model``; each with the table
    snapshots it learned from, if the data read any (``DATA_RECORD``:
    ``RunRecord.learned_from``)."""
    exported = [out_dir / MODEL_DIR]
    export_checkpoint(outcome.checkpoint, out_dir / MODEL_DIR, spec)
    if outcome.best is not None:
        export_checkpoint(outcome.best.checkpoint, out_dir / BEST_MODEL_DIR, spec)
        exported.append(out_dir / BEST_MODEL_DIR)
    for directory in exported if learned is not None else []:
        write_json(directory / DATA_RECORD, learned)
        integrity.seal(directory)


def export_checkpoint(checkpoint: Checkpoint, directory: Path, spec: TrainSpec) -> None:
    """A checkpoint's model (local, or downloaded from S3) into ``directory``: its model files, or
    its shards gathered into a full model; a DPO run's with the reference it was tuned against
    (``reference.record``)."""
    def copy() -> None:
        with checkpoint.as_directory() as d:
            checkpointer.export(Path(d), directory, spec.model, spec.tokenizer(), spec.s3)

    storage.retried(copy, spec.s3)
    if spec.pairs:
        reference.record(directory, spec)


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


def sample_of(settings: Settings, out_dir: Path, outcome: FitResult,
              prompts: list | None = None) -> Sample:
    """After training: the model's sample (``samples.txt``; a GRPO run's answers to a few held-out
    ``prompts``); a diverged run has no model, so none."""
    if outcome.diverged is not None:
        return Sample()
    return write_sample(settings, out_dir, prompts)


def sample_prompts(data: PreparedData | MixedData | PromptData, count: int = 4) -> list | None:
    """A GRPO run's first few held-out prompts (else its first training prompts), for its
    ``samples.txt``: read while Ray runs. None for other runs."""
    if not isinstance(data, PromptData):
        return None
    from raydp_llm.training.objectives.grpo import prompt_rows

    source = data.sources["val"] if data.sources["val"].count else data.sources["train"]
    return prompt_rows(source.table().slice(0, count))


def artifacts(out_dir: Path, trained: Trained, total: Stopwatch, sample: Sample) -> Outputs:
    """Into ``out_dir``: the plots of ``metrics.csv`` and ``summary.json``, from the run's
    metrics, timings, data and ``sample``."""
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
        rebuilds=outcome.rebuilds,
        diverged=asdict(outcome.diverged) if outcome.diverged else None,
        storage=trained.destination,
        **{k: v if isinstance(v, dict) else round(v, 2) for k, v in timings.items()},
        etl=data.manifest_json() | {"cache_hit": data.cache_hit},
        **table_summary(data),
        etl_stats={k: v for k, v in data.stats.items() if k != "per_stage"},
        **left_out_summary(data),
        **mixture_summary(data, rows),
        **best_summary(outcome, out_dir),
    )
    return Outputs(sample, summary)


def table_summary(data: PreparedData | MixedData) -> dict:
    """``summary.json``'s ``table``: data.table's snapshot (as the manifest holds it); none for
    other data."""
    table = data.manifest_json().get("table")
    return {} if table is None else {"table": table}


def best_summary(outcome: FitResult, out_dir: Path) -> dict:
    """``summary.json``'s ``best_checkpoint`` (``train.best_by``), logged as well."""
    if outcome.best is None or outcome.diverged is not None:
        return {}
    best = outcome.best
    log.info("best checkpoint by %s: step %d (%.4f), its model in %s", best.by, best.step,
             best.value, out_dir / BEST_MODEL_DIR)
    return {"best_checkpoint": best.summary(str(out_dir / BEST_MODEL_DIR))}


def mixture_summary(data: PreparedData | MixedData, rows: list[dict]) -> dict:
    """``summary.json``'s ``mixture`` (``MixedData.summary``) at the last step; none for one
    source."""
    if not isinstance(data, MixedData):
        return {}
    return {"mixture": data.summary(rows[-1]["step"] if rows else 0)}


def write_sample(settings: Settings, out_dir: Path, prompts: list | None = None) -> Sample:
    """The model of ``out_dir/model`` continues ``sample.prompt`` into ``samples.txt``; a chat
    model (data.format=chat) replies to it as a user turn; a GRPO run's answers ``prompts``."""
    model, tokenizer = load_model_dir(out_dir / MODEL_DIR)
    sample = settings.sample
    chat = model_template(out_dir / MODEL_DIR)
    if prompts is not None:
        text = sample_lines(model, tokenizer, prompts, settings.grpo,
                            chat.end_of_turn() if chat else None)
    elif settings.data.chat and chat is not None:
        text = chat_reply(model, tokenizer, chat, sample, settings.seed)
    else:
        text = sample_text(model, tokenizer, sample.prompt, sample.max_new_tokens,
                           sample.temperature, sample.top_k, settings.seed)
    (out_dir / "samples.txt").write_text(text + "\n")
    return Sample(text, {"num_params": model.num_params(),
                         "trainable_params": trainable_params(model, settings.model,
                                                              out_dir / MODEL_DIR),
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
        raise RunFailure(outcome.diverged.line(out_dir))
    log.info(
        "done in %.0fs (Ray %.0fs, Spark %.0fs, ETL %.0fs, training %.0fs): %s; outputs in %s",
        timings["total_s"],
        timings["ray_start_s"],
        timings.get("spark_start_s", 0.0),
        timings["etl_s"],
        timings["train_s"],
        progress_words(summary),
        out_dir,
    )
    log.info("sample:\n%s", outputs.sample.text)
    return summary


def progress_words(summary: dict) -> str:
    """What the run achieved, in words: the validation loss's way, or a GRPO run's reward's."""
    if "final_val_reward" in summary:
        return (f"val reward {_figure(summary['first_val_reward'])} → "
                f"{_figure(summary['final_val_reward'])}")
    return f"val loss {summary['first_val_loss']:.4f} → {summary['final_val_loss']:.4f}"


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


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
