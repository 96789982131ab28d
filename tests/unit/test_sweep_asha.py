"""``sweep.scheduler=asha`` continuing a sweep: the trials an earlier run ended are on its rungs
before the first new result, so that a new trial is ranked against them too (Ray Tune's own
ASHAScheduler and Trials, no Ray started)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

from ray.tune.experiment import Trial

from raydp_llm.cli.sweep import asha, records
from raydp_llm.core.config import SweepSettings

SWEEP = SweepSettings(scheduler="asha", grace_steps=10, reduction_factor=2)
JOBS = {5: SimpleNamespace(settings=SimpleNamespace(train=SimpleNamespace(max_steps=40)))}


def _ended(sweep_dir: Path, num: int, val_losses: list[float], status: str) -> None:
    """Job ``num`` of an earlier run: its metrics.csv (an evaluation each 10 steps) and its row."""
    out_dir = sweep_dir / str(num)
    out_dir.mkdir(parents=True)
    with (out_dir / "metrics.csv").open("w") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "train_loss", "val_loss"])
        writer.writeheader()
        for i, loss in enumerate(val_losses):
            writer.writerow({"step": 5 + 10 * i, "train_loss": 3.0, "val_loss": ""})
            writer.writerow({"step": 10 * (i + 1), "train_loss": 3.0, "val_loss": loss})
    row = records.job_row(num, [f"optim.lr={num}"], out_dir, (0.0, 1.0))
    records.append(sweep_dir, row | {"status": status})


def _decision_at_first_rung(scheduler, val_loss: float) -> str:
    trial = Trial("new", config={"job": 5}, trial_id="new_trial", stub=True)
    scheduler.on_trial_add(None, trial)
    return scheduler.on_trial_result(None, trial, {"step": 10, "val_loss": val_loss})


def test_a_new_trial_is_ranked_against_the_trials_an_earlier_run_ended(tmp_path):
    fresh = asha.scheduler(SWEEP, JOBS, set(), tmp_path)
    assert _decision_at_first_rung(fresh, 9.0) == "CONTINUE"  # alone on its rung

    _ended(tmp_path, 0, [2.0, 1.8, 1.7, 1.6], records.COMPLETED)
    _ended(tmp_path, 1, [2.2, 2.1], records.STOPPED)
    _ended(tmp_path, 2, [1.0], records.FAILED)  # a failed job's figures rank nothing
    assert asha.earlier_evaluations(tmp_path, "val_loss") == {
        0: [{"step": 10.0, "val_loss": 2.0}, {"step": 20.0, "val_loss": 1.8},
            {"step": 30.0, "val_loss": 1.7}, {"step": 40.0, "val_loss": 1.6}],
        1: [{"step": 10.0, "val_loss": 2.2}, {"step": 20.0, "val_loss": 2.1}]}
    pruned: set = set()
    continuing = asha.scheduler(SWEEP, JOBS, pruned, tmp_path)
    assert _decision_at_first_rung(continuing, 9.0) == "STOP"
    assert pruned == {"new_trial"}
    assert _decision_at_first_rung(asha.scheduler(SWEEP, JOBS, set(), tmp_path), 1.9) == \
        "CONTINUE"  # better than most on the rung


def test_no_scheduler_without_asha(tmp_path):
    _ended(tmp_path, 0, [2.0], records.COMPLETED)
    assert asha.scheduler(SweepSettings(scheduler="none"), JOBS, set(), tmp_path) is None
