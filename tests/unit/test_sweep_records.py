"""A sweep's bookkeeping without the engines: which jobs an earlier run did (matched by what
defines them), a done row never replaced, the search space Optuna samples (whole numbers for
whole-number settings, Hydra's ``range``), hydra-optuna-sweeper's keys, and a killed run's Optuna
trials resumed from a study on disk."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers.paths import CONF_DIR
from raydp_llm.cli.sweep import records
from raydp_llm.cli.sweep.search import OptunaKeys, distribution
from raydp_llm.cli.sweep.study import Plan, storage_of
from raydp_llm.core.errors import InputError
from raydp_llm.core.registry import register_configs

JOB = ["optim.lr=0.01", "model.n_layer=2"]


def _row(num: int, overrides: list[str], status: str, out_dir: Path) -> dict:
    error = "boom" if status == records.FAILED else None
    row = records.job_row(num, overrides, out_dir, (0.0, 1.0), error)
    return row | {"status": status}


def test_a_job_is_matched_by_what_defines_it_not_by_how_the_sweep_runs(tmp_path):
    done = _row(0, ["cluster.num_cpus=4", *JOB, "sweep.max_concurrent=2"], records.COMPLETED,
                tmp_path)
    assert records.is_done(done, [*reversed(JOB), "cluster.num_cpus=8", "hydra/launcher=ray",
                                  "tracking.uri=http://x"])
    assert not records.is_done(done, ["optim.lr=0.02", "model.n_layer=2"])
    assert not records.is_done(_row(0, JOB, records.FAILED, tmp_path), JOB)


def test_a_done_row_is_never_replaced_by_a_later_failure_of_the_same_job(tmp_path):
    for row in (_row(0, JOB, records.COMPLETED, tmp_path), _row(0, JOB, records.FAILED, tmp_path),
                _row(1, JOB, records.FAILED, tmp_path), _row(1, JOB, records.STOPPED, tmp_path),
                _row(2, JOB, records.COMPLETED, tmp_path),
                _row(2, ["optim.lr=0.5"], records.FAILED, tmp_path)):  # job 2 redefined
        records.append(tmp_path, row)
    with (tmp_path / records.ROWS_FILE).open("a") as f:
        f.write('{"job": 3, "overrides": ["cut short by a kill"')
    rows = records.rows(tmp_path)
    assert {num: row["status"] for num, row in rows.items()} == {
        0: "completed", 1: "stopped", 2: "failed"}


def test_a_run_finished_before_its_row_is_known_by_its_summary_and_its_overrides(tmp_path):
    job_dir = tmp_path / "0"
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(JOB))
    assert not records.finished(job_dir, JOB)  # no summary yet
    (job_dir / "summary.json").write_text(json.dumps({"status": "finished",
                                                      "final_val_loss": 3.2, "steps": 40}))
    assert records.finished(job_dir, ["cluster.num_cpus=2", *JOB])
    assert not records.finished(job_dir, ["optim.lr=0.02", "model.n_layer=2"])


def _config(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def _distribution(line: str, config):
    (override,) = OverridesParser.create().parse_overrides([line])
    return distribution(override, config)


def test_an_interval_of_a_whole_number_setting_samples_whole_numbers():
    d = optuna.distributions
    config = _config()
    assert _distribution("model.n_layer=interval(1,4.5)", config) == d.IntDistribution(1, 4)
    assert _distribution("model.n_layer=tag(log,interval(1.5,8))", config) == \
        d.IntDistribution(2, 8, log=True)
    assert _distribution("optim.lr=tag(log,interval(1e-4,1e-2))", config) == \
        d.FloatDistribution(1e-4, 1e-2, log=True)
    # Hydra's range leaves its end out, as it does on the command line
    assert _distribution("model.n_layer=range(2,10,2)", config) == d.IntDistribution(2, 8, step=2)
    assert _distribution("model.n_head=choice(1,2)", config) == d.CategoricalDistribution([1, 2])
    with pytest.raises(InputError, match="model.n_layer is a whole number and the interval "
                                         "holds none"):
        _distribution("model.n_layer=interval(2.2,2.8)", config)


def test_hydra_optuna_sweepers_keys_fall_back_on_the_short_form():
    config = _config("hydra/sweeper=optuna", "hydra/sweeper/sampler=random",
                     "hydra.sweeper.n_trials=5", "hydra.sweeper.direction=maximize",
                     "+hydra.sweeper.params={optim.lr: 'interval(1e-4,1e-2)'}", "seed=7",
                     "sweep.trials=3", "sweep.max_concurrent=2", "hydra.sweeper.n_jobs=4")
    keys = OptunaKeys.of(config)
    assert (keys.n_trials, keys.mode, keys.cap, keys.study_name) == (5, "max", 2, "raydp_llm")
    assert keys.sampler == {"_target_": "optuna.samplers.RandomSampler", "seed": 7}
    assert keys.arguments() == ["optim.lr=interval(1e-4,1e-2)"]
    short = OptunaKeys.of(_config("hydra/sweeper=optuna", "sweep.trials=3", "sweep.mode=max",
                                  "hydra.sweeper.n_jobs=4"))
    assert (short.n_trials, short.mode, short.cap) == (3, "max", 4)
    assert short.sampler == {"_target_": "optuna.samplers.TPESampler", "seed": 1337}  # seed


def test_a_killed_runs_optuna_trials_are_told_their_end_or_proposed_again(tmp_path):
    """Three trials the killed run left running: one whose row was kept (completed), one whose run
    finished with no row (the kill came between), one cut short: proposed again as its own job."""
    space = {"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2)}
    storage = storage_of(None, tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    plan = Plan(None, ["model.n_layer=1"], tmp_path, study, n_trials=5)
    trials = [study.ask(space) for _ in range(3)]
    for num, trial in enumerate(trials):
        trial.set_user_attr("job", num)
        job_dir = tmp_path / str(num)
        (job_dir / ".hydra").mkdir(parents=True)
        (job_dir / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump(plan.overrides(trial.params)))
        (job_dir / "metrics.csv").write_text(f"step,val_loss\n10,4.0\n20,{3.0 + num}\n")
    records.append(tmp_path, _row(0, plan.overrides(trials[0].params), records.COMPLETED,
                                  tmp_path / "0"))
    (tmp_path / "1" / "summary.json").write_text(json.dumps({"status": "finished",
                                                             "final_val_loss": 4.0}))
    plan.resume("val_loss")
    again = optuna.load_study(study_name="s", storage=storage_of(None, tmp_path))
    states = [(t.user_attrs.get("job"), t.state.name, t.value) for t in again.trials]
    assert states == [(0, "COMPLETE", 3.0), (1, "COMPLETE", 4.0), (2, "FAIL", None),
                      (2, "WAITING", None)]
    proposed = again.ask(space)  # the next proposal: the same setting, the same job
    assert proposed.params == trials[2].params and proposed.user_attrs == {"job": 2}
    assert records.rows(tmp_path)[1]["status"] == "completed"  # its row, written now
    assert (plan.next_num, plan.remaining) == (3, 3)  # 2 of 5 done: jobs 2, 3 and 4 to come


def test_the_best_job_is_the_best_by_the_sweeps_metric_at_its_end(tmp_path):
    from raydp_llm.cli.sweep.summary import best_job, format_table

    rows = []
    for num, (acc, status) in enumerate([(0.30, "completed"), (0.45, "stopped"),
                                         (0.90, "failed"), (0.40, "completed")]):
        job_dir = tmp_path / str(num)
        job_dir.mkdir()
        (job_dir / "metrics.csv").write_text(f"step,val_loss,val_acc\n10,{3.0 + num / 10},{acc}\n"
                                             f"20,{2.0 + num / 10},{acc - 0.1}\n")
        rows.append(_row(num, JOB, status, job_dir))
    assert best_job(rows, "val_acc", "max") == 1  # its best evaluation; the failed job is out
    assert best_job(rows, "val_loss", "min") == 0
    assert best_job(rows, "val_loss", "max") == 3  # sweep.mode=max: the other end
    table = format_table([r | {"overrides": ""} for r in rows], 1, "val_acc")
    assert "\n*  1 " in table and "* the best by val_acc" in table
