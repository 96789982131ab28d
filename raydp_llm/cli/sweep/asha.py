"""``sweep.scheduler=asha``: Ray Tune's ``ASHAScheduler`` by step on ``sweep.metric``, which lets
a trial at its last step finish, and which knows the trials an earlier run of the sweep ended.

ASHA stops a trial whose figure at a rung is worse than most of those recorded there before it. A
sweep run again over its directory (after a kill, a lost node) runs only the jobs the first run
did not end; a scheduler that knew only these would rank them against each other alone, and let
a trial the first run's would have stopped go on. The earlier trials' evaluations (their
``metrics.csv``) are given to it first, as Tune gives it a trial's results: the rungs hold what
they would have held had the sweep not stopped."""

from __future__ import annotations

from pathlib import Path

from raydp_llm.cli.sweep import records
from raydp_llm.core.config import SweepSettings
from raydp_llm.training.driver import best
from raydp_llm.training.driver.metrics import read_metrics


def scheduler(sweep: SweepSettings, jobs: dict, pruned: set, sweep_dir: Path):
    """The scheduler of ``sweep.scheduler``: ASHA, or None (Tune's FIFO: every trial to its end).
    ``jobs``: the SweepJobs by number, as many as are known (a searcher adds to them); the trials
    it stops go into ``pruned``; the trials an earlier run in ``sweep_dir`` ended are on its
    rungs."""
    if sweep.scheduler != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    class FinishingASHA(ASHAScheduler):
        """ASHA that lets a trial at its last step finish: stopping it there saves no step, and
        loses its export."""

        def on_trial_result(self, tune_controller, trial, result):
            if result.get("step", 0) >= jobs[trial.config["job"]].settings.train.max_steps:
                return self.CONTINUE
            if result.get(sweep.metric) is None:  # an evaluation without it ranks nothing
                return self.CONTINUE
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == self.STOP:
                pruned.add(trial.trial_id)
            return decision

    # rungs past any job's last step are never reached: max_t need not be exact
    asha = FinishingASHA(time_attr="step", metric=sweep.metric,
                         mode=sweep.mode or best.order(sweep.metric),
                         max_t=2**31, grace_period=sweep.grace_steps,
                         reduction_factor=sweep.reduction_factor)
    for num, evaluations in earlier_evaluations(sweep_dir, sweep.metric).items():
        replay(asha, f"earlier_job_{num}", evaluations)
    return asha


def earlier_evaluations(sweep_dir: Path, metric: str) -> dict[int, list[dict]]:
    """The evaluations of each job an earlier run of the sweep ended (completed or stopped), by
    job: ``{"step", metric}``, from its ``metrics.csv``; none for a job without one."""
    found = {}
    for num, row in records.rows(sweep_dir).items():
        path = Path(row["output_dir"]) / "metrics.csv"
        if row["status"] in records.DONE and path.is_file():
            found[num] = [{"step": r["step"], metric: r[metric]} for r in read_metrics(path)
                          if r.get(metric) is not None]
    return found


def replay(asha, trial_id: str, evaluations: list[dict]) -> None:
    """A trial that ended before this scheduler began, given to it as Tune gives a trial: added,
    its results in order, removed. Its rungs keep what it recorded; its decisions are moot."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import ASHAScheduler

    trial = Trial("earlier", trial_id=trial_id, stub=True)
    asha.on_trial_add(None, trial)
    for result in evaluations:  # ASHA's own ranking: FinishingASHA's needs a job of this run
        ASHAScheduler.on_trial_result(asha, None, trial, result)
    asha.on_trial_remove(None, trial)
