"""``sweep.scheduler=asha``: Ray Tune's ``ASHAScheduler`` by step on ``sweep.metric``, which lets
a trial at its last step finish, and which knows the trials an earlier run of the sweep ended.

ASHA stops a trial whose figure at a rung is worse than most of those recorded there before it. A
sweep run again over its directory (after a kill, a lost node) runs only the jobs the first run
did not end; a scheduler that knew only these would rank them against each other alone, and let
a trial the first run's would have stopped go on. The earlier trials' evaluations (their
``metrics.csv``) are given to it first, as Tune gives it a trial's results: the rungs hold what
they would have held had the sweep not stopped. So are those of the attempts the kill cut short
(``<job>.attempt-<k>``): the job's new trial is not ranked again on the rungs its earlier attempt
was let past (from scratch, it would be ranked against what the others reached since, and with
rungs missing what the cut attempts had recorded, every trial could be stopped)."""

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

    passed: dict[int, float] = {}  # by job: the highest rung its cut attempts were let past

    class FinishingASHA(ASHAScheduler):
        """ASHA that lets a trial at its last step finish (stopping it there saves no step, and
        loses its export), and a job's new trial past the rungs its earlier attempt passed."""

        def on_trial_result(self, tune_controller, trial, result):
            num, step = trial.config["job"], result.get("step", 0)
            if step >= jobs[num].settings.train.max_steps:
                return self.CONTINUE
            if result.get(sweep.metric) is None:  # an evaluation without it ranks nothing
                return self.CONTINUE
            if num in passed and rung_of(step, sweep) <= passed[num]:
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
    for num, job in jobs.items():
        evaluations = cut_evaluations(job.out_dir, job.overrides, sweep.metric)
        if evaluations:
            replay(asha, f"cut_job_{num}", evaluations)  # Tune let it on to its last result
            passed[num] = rung_of(evaluations[-1]["step"], sweep)
    return asha


def rung_of(step: float, sweep: SweepSettings) -> float:
    """The highest of ASHA's rungs (``grace_steps`` × ``reduction_factor``^k) at or below
    ``step``; 0 below the first."""
    rung, above = 0, sweep.grace_steps
    while above <= step:
        rung, above = above, above * sweep.reduction_factor
    return rung


def earlier_evaluations(sweep_dir: Path, metric: str) -> dict[int, list[dict]]:
    """The evaluations of each job an earlier run of the sweep ended (completed or stopped), by
    job: ``{"step", metric}``, from its ``metrics.csv``; none for a job without one."""
    found = {}
    for num, row in records.rows(sweep_dir).items():
        path = Path(row["output_dir"]) / "metrics.csv"
        if row["status"] in records.DONE and path.is_file():
            found[num] = _evaluations(path, metric)
    return found


def cut_evaluations(out_dir: Path, overrides: list[str], metric: str) -> list[dict]:
    """The evaluations of a job's attempts an earlier run's end cut short (``<job>.attempt-<k>``
    beside ``out_dir``, of the job of these ``overrides``), by step: a later attempt's replace an
    earlier's at the same step (one that resumed writes only the steps after its checkpoint)."""
    by_step: dict[float, dict] = {}
    attempts = out_dir.parent.glob(f"{out_dir.name}.attempt-*")
    for attempt in sorted(attempts, key=lambda p: int(p.name.rsplit("-", 1)[1])):
        if records.ran(attempt, overrides) and (attempt / "metrics.csv").is_file():
            by_step |= {e["step"]: e for e in _evaluations(attempt / "metrics.csv", metric)}
    return [by_step[step] for step in sorted(by_step)]


def _evaluations(metrics_csv: Path, metric: str) -> list[dict]:
    return [{"step": r["step"], metric: r[metric]} for r in read_metrics(metrics_csv)
            if r.get(metric) is not None]


def replay(asha, trial_id: str, evaluations: list[dict]) -> None:
    """A trial that ended before this scheduler began, given to it as Tune gives a trial: added,
    its results in order, removed. Its rungs keep what it recorded (each rung it reached, the
    first result there, whatever the order the trials came in); its decisions are moot: they
    depend on that order, which the files do not keep."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import ASHAScheduler

    trial = Trial("earlier", trial_id=trial_id, stub=True)
    asha.on_trial_add(None, trial)
    for result in evaluations:  # ASHA's own ranking: FinishingASHA's needs a job of this run
        ASHAScheduler.on_trial_result(asha, None, trial, result)
    asha.on_trial_remove(None, trial)
