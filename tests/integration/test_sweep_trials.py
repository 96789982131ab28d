"""``hydra/launcher=ray`` as a user runs it: a sweep's jobs as Ray Tune trials, two at a time on a
Ray with room for two, ASHA stopping the one that learns nothing, the driver SIGKILLed and the same
command continuing the sweep to every job once (its ASHA knowing the trials the first run ended);
``hydra/sweeper=optuna`` from a config written for
hydra-optuna-sweeper 1.3, stopped with Ctrl-C, killed, and continued to its end on one study."""

from __future__ import annotations

import csv
import json
import re
import signal
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from helpers import commands, progress
from helpers.configs import CACHE_DIR, NO_CHECK
from helpers.processes import alive, kill_driver
from helpers.terminal import start_like_a_terminal, wait_for
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


def _files(job_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of a job's directory: its size and modification time."""
    return {str(p.relative_to(job_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in job_dir.rglob("*") if p.is_file()}


def _wait_for_rows(proc, sweep_dir: Path, more_than: int) -> list[dict]:
    wait_for(proc, lambda: len(_kept_rows(sweep_dir)) > more_than, "a trial's end", 600)
    return _kept_rows(sweep_dir)


@pytest.fixture(scope="module")
def sweep(corpus_dir, tmp_path_factory):
    """The sweep started, its driver SIGKILLed once a trial has ended, then the same command to
    its end, with another cap on trials at once (how it runs, not what its jobs are): the sweep
    directory, the kept rows and files of the first run, and the second's console."""
    sweep_dir = tmp_path_factory.mktemp("trials") / "sweep"
    command = [*SWEEP, f"data.path={corpus_dir}", f"hydra.sweep.dir={sweep_dir}"]
    first = commands.start("raydp_llm.train", *command)
    _wait_for_rows(first, sweep_dir, 0)
    started = kill_driver(first)
    # what the killed sweep started ends by itself; until then a trial's workers may still write
    # (a stopped trial's last checkpoint, after its row). Ray's agents take longer (the second
    # run's start ends them: raydp_fixes.py, 3) and write nothing of the jobs'.
    progress.wait_for(lambda: not [p for p in alive(started) if "Agent" not in p], 60,
                      "the killed sweep's workers to end")
    # the rows and files as the kill left them: the trial beside the first may have ended between
    # the first's row and the kill (a row is kept once its trial's process is gone)
    kept_before = _kept_rows(sweep_dir)
    files_before = {row["job"]: _files(Path(row["output_dir"])) for row in kept_before}
    again = commands.run("raydp_llm.train", *command, "sweep.max_concurrent=3", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert alive(started) == [], "processes of the killed sweep outlived the one continuing it"
    return sweep_dir, kept_before, files_before, again.stdout + again.stderr


def test_every_job_ends_once_two_at_a_time_and_asha_stops_the_one_that_learns_nothing(sweep):
    sweep_dir, kept_before, files_before, console = sweep
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
    # the jobs ended before the kill were not run again: their rows and files are the first run's
    for before in kept_before:
        assert next(r for r in rows if int(r["job"]) == before["job"])["started"] == \
            before["started"]
        assert _files(Path(before["output_dir"])) == files_before[before["job"]]
    # a job whose run finished though the kill came before its row is done before too
    done_before = int(re.search(r"sweep: (\d) of 4 jobs done before", console)[1])
    assert 1 <= len(kept_before) <= done_before < 4
    # one line per evaluation of each trial, no interleaved progress bars
    assert "step 10/40:" in console and "train: 100%" not in console
    assert "Configuration for experiment" not in console


def test_trials_run_two_at_a_time(sweep):
    """On a Ray of 4 CPUs, trials of 2 workers × 1 CPU: two at once, never three."""
    sweep_dir, _, _, console = sweep
    assert "2 at once" in console
    spans = [(datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"]))
             for r in _rows(sweep_dir)]
    overlapping = [sum(1 for a, b in spans if a <= start < b) for start, _ in spans]
    assert max(overlapping) == 2


# A config written for hydra-optuna-sweeper 1.3, as its users have them: its keys, its grammar
HYDRA_OPTUNA_CONFIG = """
defaults:
  - config
  - override hydra/sweeper: optuna
  - _self_
hydra:
  sweeper:
    direction: minimize
    study_name: lr_and_depth
    n_trials: 4
    n_jobs: 2
    sampler:
      seed: 123
    params:
      optim.lr: tag(log, interval(1e-3, 3e-2))
      model.n_layer: interval(1, 2.5)
"""


def _study(sweep_dir: Path):
    import optuna

    from raydp_llm.cli.sweep.study import storage_of

    return optuna.load_study(study_name="lr_and_depth", storage=storage_of(None, sweep_dir))


def _job_dirs(sweep_dir: Path) -> set[str]:
    return {p.name for p in sweep_dir.iterdir() if p.name.isdigit()}


@pytest.fixture(scope="module")
def optuna_sweep(corpus_dir, tmp_path_factory):
    """The Optuna sweep of ``HYDRA_OPTUNA_CONFIG``, with ASHA, two trials at once: Ctrl-C once its
    first job ended, then the same command SIGKILLed once a trial of its own trains, then the same
    command to its end. The sweep directory, what each interruption left, and the last console."""
    base = tmp_path_factory.mktemp("optuna")
    (base / "conf").mkdir()
    (base / "conf" / "search.yaml").write_text(HYDRA_OPTUNA_CONFIG)
    sweep_dir = base / "sweep"
    command = ["--config-dir", str(base / "conf"), "--config-name", "search", *ROOM_FOR_TWO,
               "sweep.scheduler=asha", "sweep.grace_steps=10", "sweep.reduction_factor=2", *JOB,
               f"data.path={corpus_dir}", f"hydra.sweep.dir={sweep_dir}"]
    first = start_like_a_terminal("raydp_llm.train", *command)
    kept = _wait_for_rows(first, sweep_dir, 0)
    dirs = _job_dirs(sweep_dir)
    first.send_signal(signal.SIGINT)
    interrupted = first.communicate(timeout=300)[0]
    assert first.returncode == 130, interrupted[-3000:]
    stopped = {"console": interrupted, "dirs_at_signal": dirs, "dirs": _job_dirs(sweep_dir)}
    kept = _kept_rows(sweep_dir)
    files_before = {row["job"]: _files(Path(row["output_dir"])) for row in kept}
    second = commands.start("raydp_llm.train", *command)  # killed once a trial of its own trains
    wait_for(second, lambda: _job_dirs(sweep_dir) - stopped["dirs"], "a new job's trial", 600)
    started = kill_driver(second)
    last = commands.run("raydp_llm.train", *command, timeout=900)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    assert alive(started) == [], "processes of the killed sweep outlived the one continuing it"
    return sweep_dir, stopped, files_before, last.stdout + last.stderr


def test_ctrl_c_stops_an_optuna_sweep_with_the_line_that_continues_it(optuna_sweep):
    sweep_dir, stopped, _, _ = optuna_sweep
    assert f"the same command with hydra.sweep.dir={sweep_dir} runs the jobs not done" in \
        stopped["console"]
    assert stopped["dirs"] == stopped["dirs_at_signal"]  # no trial started after Ctrl-C


def test_an_optuna_sweep_continues_one_study_to_every_job_once(optuna_sweep):
    """hydra-optuna-sweeper's keys and grammar run unchanged (a whole-number setting sampled from
    an interval is a whole number); every job ends once; a job done before a kill keeps its files;
    the study holds every run's trials, each job's end told as its row says (stopped: pruned)."""
    from optuna.trial import TrialState

    sweep_dir, _, files_before, console = optuna_sweep
    rows = _rows(sweep_dir)
    assert sorted(int(r["job"]) for r in rows) == [0, 1, 2, 3]
    assert {r["status"] for r in rows} <= {"completed", "stopped"}, rows
    for num, files in files_before.items():
        assert _files(sweep_dir / str(num)) == files
    trained = [yaml.safe_load((Path(r["output_dir"]) / ".hydra" / "config.yaml").read_text())
               for r in rows]  # what each job trained with, its last override winning
    assert all(1e-3 <= c["optim"]["lr"] <= 3e-2 and c["model"]["n_layer"] in (1, 2)
               for c in trained)
    trials = _study(sweep_dir).trials
    ended = {t.user_attrs["job"]: t for t in trials if t.state != TrialState.FAIL}
    told = {"completed": TrialState.COMPLETE, "stopped": TrialState.PRUNED}
    assert {int(r["job"]): told[r["status"]] for r in rows} == \
        {num: t.state for num, t in ended.items()}
    assert len(trials) > len(rows)  # the interrupted runs' trials are kept, told failed
    for row in rows:
        if row["status"] == "completed":
            last = read_metrics(Path(row["output_dir"]) / "metrics.csv")[-1]["val_loss"]
            assert ended[int(row["job"])].value == pytest.approx(last)
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best = min((r for r in rows if r["status"] == "completed"),
               key=lambda r: float(r["final_val_loss"]))
    assert results["best_value"] == pytest.approx(float(best["final_val_loss"]))
    assert "trials done before" in console
