"""``sweep.scheduler=asha`` continuing a sweep: the trials an earlier run ended are on its rungs
before the first new result, so that a new trial is ranked against them too, and a job whose
attempt the kill cut short is not ranked again where that attempt was let on (Ray Tune's own
ASHAScheduler and Trials, no Ray started)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ray.tune.experiment import Trial

from raydp_llm.cli.sweep import asha, records
from raydp_llm.core.config import SweepSettings

SWEEP = SweepSettings(scheduler="asha", grace_steps=10, reduction_factor=2)


def _jobs(sweep_dir: Path) -> dict:
    """Jobs 5 and 7 of this run (40 steps each)."""
    train = SimpleNamespace(max_steps=40)
    return {num: SimpleNamespace(settings=SimpleNamespace(train=train),
                                 overrides=[f"optim.lr={num}"], out_dir=sweep_dir / str(num))
            for num in (5, 7)}


def _metrics(out_dir: Path, val_losses: list[float], first_step: int = 10) -> None:
    """``out_dir``'s metrics.csv: an evaluation each 10 steps from ``first_step``, a row between."""
    out_dir.mkdir(parents=True)
    with (out_dir / "metrics.csv").open("w") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "train_loss", "val_loss"])
        writer.writeheader()
        for i, loss in enumerate(val_losses):
            step = first_step + 10 * i
            writer.writerow({"step": step - 5, "train_loss": 3.0, "val_loss": ""})
            writer.writerow({"step": step, "train_loss": 3.0, "val_loss": loss})


def _ended(sweep_dir: Path, num: int, val_losses: list[float], status: str) -> None:
    """Job ``num`` of an earlier run: its metrics.csv and its row."""
    _metrics(sweep_dir / str(num), val_losses)
    row = records.job_row(num, [f"optim.lr={num}"], sweep_dir / str(num), (0.0, 1.0))
    records.append(sweep_dir, row | {"status": status})


def _cut(sweep_dir: Path, attempt: int, val_losses: list[float], first_step: int = 10,
         job: int = 5) -> None:
    """An attempt of job 5 the earlier run's kill cut short (its directory set aside, as
    launcher.set_aside leaves it), written by the run of job ``job``."""
    out_dir = sweep_dir / f"5.attempt-{attempt}"
    _metrics(out_dir, val_losses, first_step)
    (out_dir / ".hydra").mkdir()
    (out_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"optim.lr={job}"]))


def _decisions(scheduler, val_losses: list[float], job: int = 5) -> list[str]:
    """A new trial of ``job``: ASHA's decision on each of its evaluations (each 10 steps), until
    it stops it."""
    trial = Trial("new", config={"job": job}, trial_id=f"new_trial_{job}", stub=True)
    scheduler.on_trial_add(None, trial)
    decisions = []
    for i, loss in enumerate(val_losses):
        step = 10 * (i + 1)
        decisions.append(scheduler.on_trial_result(None, trial, {"step": step, "val_loss": loss}))
        if decisions[-1] == "STOP":
            break
    return decisions


def _decision_at_first_rung(scheduler, val_loss: float) -> str:
    return _decisions(scheduler, [val_loss])[0]


def test_a_new_trial_is_ranked_against_the_trials_an_earlier_run_ended(tmp_path):
    jobs = _jobs(tmp_path)
    fresh = asha.scheduler(SWEEP, jobs, set(), tmp_path)
    assert _decision_at_first_rung(fresh, 9.0) == "CONTINUE"  # alone on its rung

    _ended(tmp_path, 0, [2.0, 1.8, 1.7, 1.6], records.COMPLETED)
    _ended(tmp_path, 1, [2.2, 2.1], records.STOPPED)
    _ended(tmp_path, 2, [1.0], records.FAILED)  # a failed job's figures rank nothing
    assert asha.earlier_evaluations(tmp_path, "val_loss") == {
        0: [{"step": 10.0, "val_loss": 2.0}, {"step": 20.0, "val_loss": 1.8},
            {"step": 30.0, "val_loss": 1.7}, {"step": 40.0, "val_loss": 1.6}],
        1: [{"step": 10.0, "val_loss": 2.2}, {"step": 20.0, "val_loss": 2.1}]}
    pruned: set = set()
    continuing = asha.scheduler(SWEEP, jobs, pruned, tmp_path)
    assert _decision_at_first_rung(continuing, 9.0) == "STOP"
    assert pruned == {"new_trial_5"}
    assert _decision_at_first_rung(asha.scheduler(SWEEP, jobs, set(), tmp_path), 1.9) == \
        "CONTINUE"  # better than most on the rung


def test_no_scheduler_without_asha(tmp_path):
    _ended(tmp_path, 0, [2.0], records.COMPLETED)
    assert asha.scheduler(SweepSettings(scheduler="none"), _jobs(tmp_path), set(), tmp_path) is None


def test_a_job_the_kill_cut_short_goes_on_where_its_attempt_was_let_on(tmp_path):
    """As in test_sweep_trials: job 0 stopped at step 20 by job 5's better figure, job 5 at step
    30 when the driver was killed. Its new trial from scratch is slower at step 10 than job 0 (as
    it was): ranked again there it would be stopped, and every job with it."""
    jobs = _jobs(tmp_path)
    _ended(tmp_path, 0, [3.62, 3.46], records.STOPPED)
    assert _decisions(asha.scheduler(SWEEP, jobs, set(), tmp_path), [3.65]) == ["STOP"]

    _cut(tmp_path, 1, [3.65], job=6)  # another job's directory: not job 5's attempt
    _cut(tmp_path, 2, [3.65, 3.40])
    _cut(tmp_path, 3, [3.37], first_step=30)  # resumed from the step-20 checkpoint
    assert asha.cut_evaluations(jobs[5].out_dir, ["optim.lr=5"], "val_loss") == [
        {"step": 10.0, "val_loss": 3.65}, {"step": 20.0, "val_loss": 3.40},
        {"step": 30.0, "val_loss": 3.37}]
    continuing = asha.scheduler(SWEEP, jobs, set(), tmp_path)
    assert _decisions(continuing, [3.65, 3.40, 3.37, 3.35]) == ["CONTINUE"] * 4
    # the cut attempt's figures are on the rungs: job 7 is ranked against them too
    assert _decisions(continuing, [3.5, 3.45], job=7) == ["CONTINUE", "STOP"]
    (tmp_path / "5.attempt-2" / "metrics.csv").unlink()
    (tmp_path / "5.attempt-3" / "metrics.csv").unlink()
    assert _decisions(asha.scheduler(SWEEP, jobs, set(), tmp_path), [3.5, 3.45], job=7) == \
        ["CONTINUE"] * 2


def test_rungs():
    steps = (9, 10, 19, 20, 39, 40)
    assert [asha.rung_of(step, SWEEP) for step in steps] == [0, 10, 10, 20, 20, 40]


@pytest.mark.parametrize("concurrent,address,refused", [
    (True, "local", False),  # hydra/launcher=ray (YAML's true: a bool)
    ("auto", "local", True),  # the default launcher on the embedded Ray: one after another
    ("auto", "ray://head:10001", False),  # the default launcher on a cluster: side by side
    (False, "ray://head:10001", True),
])
def test_asha_is_refused_only_where_the_jobs_run_one_after_another(concurrent, address, refused):
    from omegaconf import OmegaConf

    from raydp_llm.cli.sweep.summary import check_scheduler
    from raydp_llm.core.errors import InputError

    config = OmegaConf.create({
        "sweep": {"scheduler": "asha"}, "cluster": {"address": address},
        "hydra": {"launcher": {"_target_": "hydra_plugins.raydp_llm_sweep.RaydpLauncher",
                               "concurrent": concurrent}}})
    if refused:
        with pytest.raises(InputError, match="sweep.scheduler=asha: it stops trials that run "):
            check_scheduler(config)
    else:
        check_scheduler(config)
