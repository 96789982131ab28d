"""``hydra/launcher=ray`` as a user runs it: a sweep's jobs as Ray Tune trials, two at a time on a
Ray with room for two, ASHA stopping the one that learns nothing, the driver SIGKILLed and the same
command continuing the sweep to every job once."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import yaml

from helpers import commands
from helpers.configs import CACHE_DIR, NO_CHECK
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a sweep of four trials, run twice

MAX_STEPS = 40
LEARNS_NOTHING = "1e-09"
# Jobs of 2 workers × 1 CPU on a Ray of 4 CPUs: 2 trials at once
ROOM_FOR_TWO = ["-m", "hydra/launcher=ray", "cluster.num_cpus=4", "cluster.dashboard=false",
                "train.num_workers=2"]
JOB = ["model.n_layer=1", "model.n_embd=32", "model.block_size=16", "train.batch_size=8",
       f"train.max_steps={MAX_STEPS}", "train.eval_interval=10", "train.eval_batches=2",
       "train.checkpoint_interval=10", "optim.warmup_steps=2", "sample.max_new_tokens=10",
       f"data.cache_dir={CACHE_DIR}", NO_CHECK]
# The one that learns nothing is last: ASHA ranks a trial against those that reached its rung
# before it.
SWEEP = [*ROOM_FOR_TWO, f"optim.lr=3e-3,1e-2,5e-3,{LEARNS_NOTHING}", "sweep.scheduler=asha",
         "sweep.grace_steps=10", "sweep.reduction_factor=2", *JOB]


def _rows(sweep_dir: Path) -> list[dict]:
    with (sweep_dir / "sweep_summary.csv").open() as f:
        return list(csv.DictReader(f))


def _kept_rows(sweep_dir: Path) -> list[dict]:
    path = sweep_dir / "jobs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _kill_tree(proc) -> None:
    """SIGKILL of the sweep's driver and everything it started, as a crashed machine."""
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    for child in tree:
        try:
            child.kill()
        except psutil.Error:
            pass
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def sweep(corpus_dir, tmp_path_factory):
    """The sweep started, SIGKILLed once a trial has ended, then the same command to its end: the
    sweep directory and the two consoles."""
    sweep_dir = tmp_path_factory.mktemp("trials") / "sweep"
    command = [*SWEEP, f"data.path={corpus_dir}", f"hydra.sweep.dir={sweep_dir}"]
    first = commands.start("raydp_llm.train", *command)
    deadline = time.time() + 600
    while not _kept_rows(sweep_dir):
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert time.time() < deadline, "no trial ended in 10 minutes"
        time.sleep(0.2)
    kept_before = _kept_rows(sweep_dir)
    _kill_tree(first)
    again = commands.run("raydp_llm.train", *command, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return sweep_dir, kept_before, again.stdout + again.stderr


def test_every_job_ends_once_two_at_a_time_and_asha_stops_the_one_that_learns_nothing(sweep):
    sweep_dir, kept_before, console = sweep
    rows = _rows(sweep_dir)
    assert sorted(r["job"] for r in rows) == ["0", "1", "2", "3"]  # each once, after the kill
    by_lr = {r["overrides"].split("optim.lr=")[1].split()[0]: r for r in rows}
    bad = by_lr[LEARNS_NOTHING]
    assert bad["status"] == "stopped" and int(bad["steps"]) < MAX_STEPS
    assert read_metrics(Path(bad["output_dir"]) / "metrics.csv")  # its figures are kept
    finished = [r for r in rows if r["status"] == "completed"]
    assert finished and all(int(r["steps"]) == MAX_STEPS for r in finished)
    for row in finished:
        assert (Path(row["output_dir"]) / "model" / "model.safetensors").is_file()
    assert float(min(finished, key=lambda r: float(r["best_val_loss"]))["best_val_loss"]) < \
        float(bad["best_val_loss"])
    # the jobs ended before the kill were not run again; their rows are the first run's
    for before in kept_before:
        assert next(r for r in rows if int(r["job"]) == before["job"])["started"] == \
            before["started"]
    assert f"{len(kept_before)} of 4 jobs done before" in console
    # one line per evaluation of each trial, no interleaved progress bars
    assert "step 10/40:" in console and "train: 100%" not in console
    assert "Configuration for experiment" not in console


def test_trials_run_two_at_a_time(sweep):
    """On a Ray of 4 CPUs, trials of 2 workers × 1 CPU: two at once, never three."""
    sweep_dir, _, console = sweep
    assert "2 at once" in console
    spans = [(datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"]))
             for r in _rows(sweep_dir)]
    overlapping = [sum(1 for a, b in spans if a <= start < b) for start, _ in spans]
    assert max(overlapping) == 2


def test_optuna_proposes_trials_in_batches_the_cluster_runs_side_by_side(corpus_dir, tmp_path):
    """hydra/sweeper=optuna: 4 trials from a log-scale interval and a choice, 2 at a time on a Ray
    with room for 2; each batch proposed after the one before ended; the best in
    optimization_results.yaml is the summary's best completed job."""
    sweep_dir = tmp_path / "optuna"
    out = commands.run("raydp_llm.train", *ROOM_FOR_TWO, "hydra/sweeper=optuna",
                       "optim.lr=tag(log,interval(1e-3,3e-2))", "model.n_head=choice(1,2)",
                       "sweep.trials=4", *JOB,
                       f"data.path={corpus_dir}", f"hydra.sweep.dir={sweep_dir}", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = _rows(sweep_dir)
    assert [r["status"] for r in rows] == ["completed"] * 4
    spans = {int(r["job"]): (r["started"], r["ended"]) for r in rows}
    assert max(spans[0][1], spans[1][1]) <= min(spans[2][0], spans[3][0])  # batch after batch
    lrs = [float(r["overrides"].split("optim.lr=")[1].split()[0]) for r in rows]
    assert all(1e-3 <= lr <= 3e-2 for lr in lrs) and len(set(lrs)) == 4
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best = min(rows, key=lambda r: float(r["final_val_loss"]))
    assert results["completed"] == 4
    assert results["best_value"] == pytest.approx(float(best["final_val_loss"]))
    assert f"optim.lr={results['best_params']['optim.lr']}" in best["overrides"]
