"""Training, the driver's side: a Ray Train ``TorchTrainer`` runs ``loop.train_loop`` on every DDP
worker, while the driver follows it (progress.py) and its callbacks write the run's metrics
(metrics.py)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raydp_llm.core.storage import resolve
from raydp_llm.training.loop import RunContext, train_loop
from raydp_llm.training.metrics import MetricsWriter, RestartRecorder, read_divergence, read_events
from raydp_llm.training.progress import ProgressBoard, TrainingProgress
from raydp_llm.training.spec import TrainSpec


@dataclass(frozen=True)
class Launch:
    """Where the driver runs the workers and keeps what they make: checkpoints in ``storage`` (a
    directory or s3://), metrics in ``out_dir``, workers placed by ``placement`` (PACK when None).
    Their number, GPUs and how many losses a run survives are the spec's ``train`` settings."""

    out_dir: Path
    storage: str
    placement: str | None = None
    on_metrics: Callable[[dict], None] | None = None  # each new metrics.csv row, on the driver


@dataclass
class FitResult:
    checkpoint: Checkpoint | None  # the last one Ray Train registered
    diverged: (
        dict | None
    )  # {"step", "what", "last_checkpoint"} when the run diverged (metrics.read_divergence)
    restarts: int  # worker-group restarts after lost workers
    resumed_from: str | None  # the checkpoint the run started from (RunContext.resume_from)
    marks: dict  # when (time.time()) fit began and ended, and rank 0 reached each start-up mark


def startup_phases(marks: dict) -> dict:
    """Seconds of each phase of Ray Train's start and stop, from ``FitResult.marks``: the worker
    group's start (fit called → train loop entered), the worker's set-up (model, optimizer,
    checkpoint), the first step, and the stop (last step → fit returned)."""
    spans = {"train_group_start_s": ("fit", "loop_start"),
             "worker_setup_s": ("loop_start", "worker_ready"),
             "first_step_s": ("worker_ready", "first_step"),
             "train_group_stop_s": ("last_step", "fit_end")}
    return {name: round(marks[b] - marks[a], 3) for name, (a, b) in spans.items()
            if a in marks and b in marks}


def torch_trainer(spec: TrainSpec, run: RunContext, data: dict, launch: Launch,
                  recorder: MetricsWriter) -> TorchTrainer:
    """Ray Train's trainer of ``train_loop``: the workers as the spec's ``train`` settings say,
    checkpoints into ``launch.storage/<run>/``, ``recorder`` writing the metrics."""
    filesystem, storage_path = resolve(launch.storage, spec.s3)
    train = spec.train
    workers = (train.min_workers, train.num_workers) if train.min_workers else train.num_workers
    return TorchTrainer(
        train_loop,
        train_loop_config={"spec": spec, "run": run, "data": data},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=train.use_gpu,
            placement_strategy=launch.placement or "PACK",
            resources_per_worker={"CPU": spec.train.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=run.run_name,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            checkpoint_config=CheckpointConfig(num_to_keep=train.keep_checkpoints),
            failure_config=FailureConfig(max_failures=train.max_failures),
            callbacks=[recorder, RestartRecorder(recorder)],
        ),
    )


def fit(spec: TrainSpec, run: RunContext, data: dict, launch: Launch) -> FitResult:
    """Train on ``data`` = ``{split: (chunk source, ChunkIndex)}`` (from ``run.resume_from`` if
    set). Checkpoints go to ``launch.storage/<run>/`` (a directory or s3://). The console follows
    it live (progress.py); ``metrics.csv``, TensorBoard events and the restarts (``events.jsonl``)
    go to ``launch.out_dir``."""
    run = RunContext(run.run_name, ProgressBoard.remote(), run.resume_from)
    trainer = torch_trainer(spec, run, data, launch, MetricsWriter(launch.out_dir))
    progress = TrainingProgress(run.board, launch.out_dir, spec.max_steps, spec.train.max_failures,
                                on_row=launch.on_metrics)
    progress.start()
    sigint_handler = signal.getsignal(signal.SIGINT)
    marks = {"fit": time.time()}
    try:
        result = trainer.fit()
        marks |= ray.get(run.board.read_marks.remote()) | {"fit_end": time.time()}
    except SystemExit as err:  # Ray Train's SIGINT handler aborts the run, then exits with status 0
        raise KeyboardInterrupt from err
    finally:
        progress.stop()
        ray.kill(run.board)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, sigint_handler)
    diverged = read_divergence(launch.out_dir)
    if result.checkpoint is None and diverged is None:
        raise RuntimeError("training finished without a checkpoint; see "
                           f"{launch.storage}/{run.run_name}")
    restarts = sum(1 for event in read_events(launch.out_dir) if event["event"] == "restart")
    return FitResult(result.checkpoint, diverged, restarts, run.resume_from, marks)
