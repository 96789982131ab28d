"""Training, the driver's side: a Ray Train ``TorchTrainer`` runs ``loop.train_loop`` on every DDP
worker, while the driver follows it (progress.py) and its callbacks write the run's metrics
(metrics.py).

The worker group starts before its data exists (``started``): Ray Train's ``fit`` runs in a thread
of the driver from when Ray is up, so that the group's start (Ray Train's actors, the workers'
imports, the process group) runs beside Spark's start and the ETL; the workers then wait for their
spec and data (handoff.py) until ``StartedFit.train`` delivers them; where the cluster cannot hold
the group beside Spark, it is started by ``StartedFit.train`` once the data is there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from raydp_llm.core.config import TrainSettings
from raydp_llm.core.errors import first_line
from raydp_llm.core.storage import S3Options, resolve
from raydp_llm.engines.this_node import on_this_node
from raydp_llm.training.driver.best import Best, best_of, checkpoint_config
from raydp_llm.training.driver.lost_blocks import BlockRebuilds
from raydp_llm.training.driver.metrics import (
    Divergence,
    MetricsWriter,
    read_divergence,
    read_events,
)
from raydp_llm.training.driver.progress import TrainingProgress
from raydp_llm.training.driver.trial_reports import in_trial, trial_callbacks
from raydp_llm.training.handoff import Delivery, Handoff, RunContext, free_group
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.worker.loop import train_loop

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Launch:
    """Where the driver runs the workers and keeps what they make: checkpoints in ``storage`` (a
    directory or s3://), metrics in ``out_dir``, workers placed by ``placement`` (PACK when None).
    Their number, GPUs and how many losses a run survives are the ``train`` settings."""

    out_dir: Path
    storage: str
    placement: str | None = None
    on_metrics: Callable[[dict], None] | None = None  # each new metrics.csv row, on the driver


@dataclass
class FitResult:
    checkpoint: Checkpoint | None  # the last one Ray Train registered
    diverged: Divergence | None  # where the run diverged, if it did (metrics.read_divergence)
    restarts: int  # worker-group restarts after lost workers
    resumed_from: str | None  # the checkpoint the run started from (Delivery.resume_from)
    # when (time.time()) the group was launched ("fit"), the driver had its data ("data_ready")
    # and handed it over ("delivered"), rank 0 reached each start-up mark, and fit returned
    marks: dict
    best: Best | None = None  # the best checkpoint by train.best_by, if set
    # each time the hand-off's blocks were made again after a lost node (lost_blocks.py)
    rebuilds: list = field(default_factory=list)


# Each start-up phase of Ray Train's, between two marks (FitResult.marks)
STARTUP_SPANS = {
    "train_group_start_s": ("fit", "loop_start"),  # Ray Train's actors, imports, process group
    "data_wait_s": ("loop_start", "data"),  # the workers, started, wait for the ETL
    "worker_setup_s": ("data", "worker_ready"),  # model, optimizer, checkpoint
    "first_step_s": ("worker_ready", "first_step"),
    "train_group_stop_s": ("last_step", "fit_end"),
}


def startup_phases(marks: dict) -> dict:
    """Seconds of each phase of Ray Train's start and stop, from ``FitResult.marks``
    (``STARTUP_SPANS``; a phase that ended before it began, as the wait for data that came first,
    is 0), and ``overlapped_s``: the seconds of the group's start that ran before the driver had
    its data, beside Spark and the ETL."""
    phases = {name: round(max(0.0, marks[b] - marks[a]), 3)
              for name, (a, b) in STARTUP_SPANS.items() if a in marks and b in marks}
    if {"fit", "loop_start", "data_ready"} <= marks.keys():
        ahead = min(marks["loop_start"], marks["data_ready"]) - marks["fit"]
        phases["overlapped_s"] = round(max(0.0, ahead), 3)
    return phases


def startup_timeline(marks: dict, origin: float) -> dict:
    """When each of Ray Train's start-up phases ran: ``[start, end]`` in seconds after
    ``origin`` (a ``time.time()``: the command's start), for those whose marks were reached."""
    return {name.removesuffix("_s"): [round(marks[a] - origin, 2), round(marks[b] - origin, 2)]
            for name, (a, b) in STARTUP_SPANS.items() if a in marks and b in marks}


def torch_trainer(train: TrainSettings, s3: S3Options, run: RunContext,
                  launch: Launch) -> TorchTrainer:
    """Ray Train's trainer of ``train_loop``: the workers as the ``train`` settings say,
    checkpoints into ``launch.storage/<run>/``, ``MetricsWriter`` writing the metrics and the
    restarts into ``launch.out_dir``."""
    filesystem, storage_path = resolve(launch.storage, s3)
    workers = (train.min_workers, train.num_workers) if train.min_workers else train.num_workers
    return TorchTrainer(
        train_loop,
        train_loop_config={"run": run},  # the spec and the data come through run.handoff
        torch_config=TorchConfig(backend="nccl" if train.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=train.use_gpu,
            placement_strategy=launch.placement or "PACK",
            resources_per_worker={"CPU": train.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=run.run_name,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            checkpoint_config=checkpoint_config(train.keep_checkpoints, train.best_by),
            failure_config=FailureConfig(max_failures=train.max_failures),
            callbacks=[MetricsWriter(launch.out_dir, train.max_failures), *trial_callbacks()],
        ),
    )


class StartedFit:
    """A Ray Train run whose workers wait for their data: ``start`` runs ``trainer.fit`` in a
    thread (Ray Train installs its SIGINT handler from the main thread only, so the driver aborts
    the run itself: ``abort``); ``train`` hands the workers their spec and data (starting the run
    if it was not yet) and follows the run to its end."""

    def __init__(self, train: TrainSettings, s3: S3Options, run_name: str, launch: Launch):
        self.launch, self.aborted = launch, False
        # a sweep's trial: its worker groups go to the sweep's ledger too (handoff.post_group)
        sweep_key = str(launch.out_dir) if in_trial() else None
        # the hand-off on the driver's node: a restarted worker group finds it after a node is lost
        handoff = Handoff.options(scheduling_strategy=on_this_node()).remote()
        self.run = RunContext(run_name, handoff=handoff, sweep_key=sweep_key)
        self.marks: dict = {}
        self.trainer = torch_trainer(train, s3, self.run, launch)
        self.outcome = None  # fit's Result, or what it raised
        self.thread = threading.Thread(target=self._fit, name="ray-train-fit", daemon=True)

    def start(self) -> None:
        if "fit" not in self.marks:
            self.mark("fit")
            self.thread.start()

    def _fit(self) -> None:
        try:
            self.outcome = self.trainer.fit()
        except BaseException as err:  # noqa: BLE001 - the main thread raises it (``_result``)
            self.outcome = err

    def mark(self, name: str) -> None:
        """That the driver reached ``name`` now (``FitResult.marks``)."""
        self.marks[name] = time.time()

    def train(self, spec: TrainSpec, data: dict, resume_from: str | None = None,
              remake: Callable[[], dict] | None = None) -> FitResult:
        """Train on ``data`` = ``{split: SplitChunks}`` as ``spec`` says (from
        ``resume_from`` if set). The console follows it live (progress.py); ``metrics.csv``,
        TensorBoard events and the restarts (``events.jsonl``) go to ``launch.out_dir``.
        ``remake()``: ``data`` made again, should blocks of Ray's object store be lost with a
        node (lost_blocks.py)."""
        run, launch = self.run, self.launch
        rebuilds = BlockRebuilds(run.handoff, data, remake)
        self.start()
        self.marks.setdefault("data_ready", time.time())
        self.mark("delivered")
        run.handoff.deliver.remote([ray.put(Delivery(spec, data, resume_from))])
        progress = TrainingProgress(run.handoff, launch.out_dir, spec.max_steps,
                                    spec.train.max_failures, on_row=launch.on_metrics)
        progress.start()
        try:
            result = self._result(rebuilds)
            self.marks |= ray.get(run.handoff.read_marks.remote()) | {"fit_end": time.time()}
        finally:
            progress.stop()
        diverged = read_divergence(launch.out_dir)
        if result.checkpoint is None and diverged is None:
            raise RuntimeError("training finished without a checkpoint; see "
                               f"{launch.storage}/{run.run_name}")
        restarts = sum(1 for event in read_events(launch.out_dir) if event["event"] == "restart")
        return FitResult(result.checkpoint, diverged, restarts, resume_from, self.marks,
                         best_of(result.best_checkpoints, spec.train.best_by), rebuilds.rebuilds)

    def _result(self, rebuilds: BlockRebuilds):
        """fit's ``Result`` once its thread ends, lost blocks made again meanwhile; Ctrl-C
        meanwhile aborts the run first."""
        try:
            rebuilds.follow(self.thread)
        except KeyboardInterrupt:
            self.abort()
            raise
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def abort(self, wait_s: float = 30.0) -> None:
        """End the run before its data came: the workers waiting for it get none and return, and
        fit's thread ends (waited for up to ``wait_s``). A run already training goes on until
        Ray ends it: the embedded Ray's shutdown, or a cluster's end of this driver's job, which
        takes its actors and placement groups with it."""
        if self.aborted or not self.thread.is_alive():
            return
        self.aborted = True
        self.run.handoff.deliver.remote(None)  # after a delivery, ignored: the workers have theirs
        if "delivered" not in self.marks:
            self.thread.join(wait_s)

    def close(self) -> None:
        """Free the run's placement group if it outlived the run (its controller died without
        removing it: killed, out of memory), then end the hand-off. Called as the run's block
        ends, also on an error, which a failure here must not replace: it is logged."""
        try:
            group = ray.get(self.run.handoff.group.remote(), timeout=30)
            if group is not None:
                free_group(group)
        except (ray.exceptions.RayError, TimeoutError) as err:
            log.warning("the run's worker group could not be checked for removal (%s)",
                        first_line(err, with_type=True))
        finally:
            ray.kill(self.run.handoff)


@contextmanager
def started(train: TrainSettings, s3: S3Options, run_name: str, launch: Launch,
            now: bool = True) -> Iterator[StartedFit]:
    """Ray Train's run ``run_name``, launched now (else by ``StartedFit.train``), its workers
    waiting for their data until ``StartedFit.train``; aborted if the block ends otherwise (the
    ETL failed, Ctrl-C)."""
    fit = StartedFit(train, s3, run_name, launch)
    try:
        if now:
            fit.start()
        yield fit
    except BaseException:
        fit.abort()
        raise
    finally:
        fit.close()
