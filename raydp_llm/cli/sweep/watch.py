"""What the sweep's process keeps of its Ray Tune trials as they run (launcher.py): a console line
per trial's start, evaluation and end, each ended trial's row (records.py) once its job's process is
gone, and the ledger of the trials' placement groups, freed as each trial ends."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray import tune

from raydp_llm.cli.sweep import records
from raydp_llm.cli.sweep.trial import SweepJob, end_process
from raydp_llm.engines.this_node import on_this_node
from raydp_llm.training.handoff import SWEEP_GROUPS, free_group


@ray.remote(num_cpus=0)
class _Groups:
    """The sweep's ledger of its trials' placement groups, by run directory."""

    def __init__(self):
        self.groups: dict[str, list] = {}

    def add(self, key: str, group) -> None:
        self.groups.setdefault(key, []).append(group)

    def take(self, keys: list[str]) -> list:
        return [group for key in keys for group in self.groups.pop(key, [])]


@contextlib.contextmanager
def trial_groups():
    """The ledger of the trials' placement groups (``handoff.SWEEP_GROUPS``), for
    ``TrialLines`` to free a trial's as it ends."""
    groups = _Groups.options(name=SWEEP_GROUPS, scheduling_strategy=on_this_node()).remote()
    try:
        yield groups
    finally:
        ray.kill(groups)



@dataclass
class TrialLines(tune.Callback):
    """The console while trials run: a line per evaluation of each trial (step, losses) and per
    trial that starts or ends; each ended trial's row kept (records.py)."""

    jobs: dict[int, SweepJob]
    sweep_dir: Path
    started: dict = field(default_factory=dict)  # trial id → time.time()
    groups: object = None  # the ledger of the trials' placement groups (trial_groups)
    ended: list = field(default_factory=list)  # the run directories of the ended trials

    def _job(self, trial) -> SweepJob:
        return self.jobs[trial.config["job"]]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._free_ended()
        self.started[trial.trial_id] = time.time()
        job = self._job(trial)
        print(f"[job {job.num}] started: {' '.join(job.overrides) or '(no overrides)'} "
              f"→ {job.out_dir}", flush=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        job, figures = self._job(trial), []
        for key in ("train_loss", "val_loss"):
            if result.get(key) is not None:
                figures.append(f"{key.split('_')[0]} {result[key]:.4f}")
        print(f"[job {job.num}] step {result.get('step')}/{job.settings.train.max_steps}: "
              f"{', '.join(figures)}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial, None)

    def on_trial_error(self, iteration, trials, trial, **info):
        job = self._job(trial)
        self._end(trial, _last_error(job.out_dir) or f"the trial failed; see {job.out_dir}")

    def _free_ended(self) -> None:
        """The placement groups of the ended trials, freed: again at each start and end, for a
        controller that started a group as its trial was being stopped."""
        if self.groups is not None:
            for group in ray.get(self.groups.take.remote([str(d) for d in self.ended])):
                free_group(group)

    def _end(self, trial, error: str | None) -> None:
        job = self._job(trial)
        end_process(job.num)  # before its workers' groups are freed and its row is kept
        self.ended.append(job.out_dir)
        self._free_ended()
        span = (self.started.get(trial.trial_id, time.time()), time.time())
        row = records.job_row(job.num, job.overrides, job.out_dir, span, error)
        records.append(self.sweep_dir, row)
        print(f"[job {job.num}] {row['status']} at step {row['steps']}"
              f"{': ' + error if error else ''}", flush=True)


def _last_error(out_dir: Path) -> str | None:
    return next((records.last_error(p) for p in sorted(out_dir.glob("*.log"))), None)
