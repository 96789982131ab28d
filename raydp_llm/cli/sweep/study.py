"""The Optuna study of a ``hydra/sweeper=optuna`` sweep (search.py) as Ray Tune runs it: the
study's storage (a journal file in the sweep directory, or a database), the jobs its trials
become (``Plan``: numbered, composed, checked, their data prepared as Tune asks), the earlier
run's trials resumed, and ``JobSearch``, Tune's ``OptunaSearch`` proposing those jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf
from ray.tune.search.optuna import OptunaSearch

from raydp_llm.cli.sweep import records

JOURNAL_FILE = "optuna.journal"  # the study, beside the jobs, when no storage is given


def storage_of(url: str | None, sweep_dir: Path):
    """The study's storage: the database at ``url``, or a journal file in the sweep directory."""
    import optuna

    if url:
        return optuna.storages.RDBStorage(str(url))
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL_FILE)))


def sampler_of(sampler: dict, study):
    """The study's sampler, its seed advanced by the trials the study holds: a resumed study
    draws new settings, not the first run's again (a seeded sampler restarts its sequence)."""
    from hydra.utils import instantiate

    return instantiate({**sampler, "seed": sampler["seed"] + len(study.trials)})


@dataclass
class Plan:
    """The jobs the study's trials become: each numbered (the Optuna trial's user attribute
    ``job``: a trial proposed again keeps its job's number and directory), composed and checked
    here, its data prepared, as Tune asks for it; ``remaining``: the proposals this run makes."""

    launcher: object  # the sweep's RaydpLauncher: Hydra's context and task function
    fixed: list[str]
    sweep_dir: Path
    study: object
    n_trials: int
    remaining: int = 0
    asked: int = 0
    next_num: int = 0
    jobs: dict = field(default_factory=dict)  # number → SweepJob, shared with Tune's callbacks

    def overrides(self, params: dict) -> list[str]:
        return [*self.fixed, *(f"{key}={value!r}" if isinstance(value, float)
                               else f"{key}={value}" for key, value in params.items())]

    def resume(self, metric: str) -> None:
        """An earlier run's trials, as its records say: a trial it left running is told its
        job's end (a row, or a finished run whose row the kill cut off), or failed and proposed
        again under its job's number; what is left of ``n_trials`` is this run's to propose."""
        from optuna.trial import TrialState

        rows = records.rows(self.sweep_dir)
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            num = trial.user_attrs.get("job")
            row = rows.get(num) if num is not None else None
            out_dir = self.sweep_dir / str(num)
            overrides = self.overrides(trial.params)
            if num is not None and row is None and records.finished(out_dir, overrides):
                row = records.job_row(num, overrides, out_dir, records.span_of(out_dir))
                records.append(self.sweep_dir, row)
            if row is not None:
                tell(self.study, trial.number, row, metric)
                continue
            self.study.tell(trial.number, state=TrialState.FAIL)
            if num is not None:
                self.study.enqueue_trial(trial.params, user_attrs={"job": num})
        self.count(rows)

    def count(self, rows: dict) -> None:
        """The next job's number, and the proposals left: ``n_trials`` less the jobs whose trial
        ended (completed, pruned, failed or refused), a job waiting to run again not among them."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        ended = {t.user_attrs.get("job") for t in trials
                 if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
        waiting = {t.user_attrs.get("job") for t in trials if t.state == TrialState.WAITING}
        done = ended - waiting - {None}
        numbered = {t.user_attrs.get("job") for t in trials} - {None} | set(rows)
        self.next_num = max(numbered, default=-1) + 1
        self.remaining = max(self.n_trials - len(done), 0)
        if trials:
            print(f"sweep: {len(done)} of {self.n_trials} trials done before (the study in "
                  f"{self.sweep_dir}), {len(waiting - {None})} to run again", flush=True)

    def job_for(self, trial):
        """The job of Optuna's ``trial``: composed, checked, its data prepared (a refused job is a
        failed row, and its ``error`` says why)."""
        from raydp_llm.cli.sweep.launcher import compose, prepare_data, set_aside

        num = trial.user_attrs.get("job")
        if num is None:
            num, self.next_num = self.next_num, self.next_num + 1
            trial.set_user_attr("job", num)
        self.asked += 1
        job = compose(self.launcher, num, self.overrides(trial.params), self.sweep_dir)
        prepare_data(job, self.sweep_dir)
        if job.error is None:
            set_aside(job)
            self.jobs[num] = job
        return job


def tell(study, number: int, row: dict, metric: str) -> None:
    """A job's end told to Optuna: its last ``metric`` when it completed, pruned when a scheduler
    stopped it, failed otherwise."""
    from optuna.trial import TrialState

    value = records.last_value(Path(row["output_dir"]), metric)
    if row["status"] == records.STOPPED:
        study.tell(number, state=TrialState.PRUNED)
    elif row["status"] == records.COMPLETED and value is not None:
        study.tell(number, value)
    else:
        study.tell(number, state=TrialState.FAIL)


class JobSearch(OptunaSearch):
    """Ray Tune's ``OptunaSearch``, whose proposals are the sweep's jobs: a proposal becomes a job
    (``Plan.job_for``; one refused is told failed, and the next asked), a trial's config is its
    job's number and composed config; a trial the scheduler stopped is told pruned (Tune reports
    every end as complete), a failed one failed. Nothing more is proposed once ``halt`` is set
    (Ctrl-C)."""

    def __init__(self, plan: Plan, pruned: set, halt, **kwargs):
        super().__init__(**kwargs)
        self.plan, self.pruned, self.halt = plan, pruned, halt

    # Tune pickles its searcher (the Tuner's state file, its experiment checkpoints) for its own
    # restore, which a sweep does not use: the study is in its storage, the jobs in their rows
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("plan", "pruned", "halt")}

    def save(self, checkpoint_path: str) -> None:
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass

    def suggest(self, trial_id: str):
        from optuna.trial import TrialState

        while self.plan.asked < self.plan.remaining and not self.halt.is_set():
            super().suggest(trial_id)  # Optuna's ask: a job to run again first, else the sampler
            trial = self._ot_trials[trial_id]
            job = self.plan.job_for(trial)
            if job.error is None:
                return {"job": job.num, "config": job.config}
            self._ot_study.tell(trial, state=TrialState.FAIL)
            del self._ot_trials[trial_id]
        return self.FINISHED

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if result.get(self.metric) is not None:  # a report without it (a checkpoint's) is none
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        from optuna.trial import TrialState

        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        value = (result or {}).get(self.metric)
        trial = self._ot_trials[trial_id]
        if trial_id in self.pruned:
            self._ot_study.tell(trial, state=TrialState.PRUNED)
        elif error or value is None:
            self._ot_study.tell(trial, state=TrialState.FAIL)
        else:
            self._ot_study.tell(trial, value)
        self._completed_trials.add(trial_id)


def write_results(study, path: Path, name: str) -> None:
    """``optimization_results.yaml``, as Hydra's Optuna sweeper writes it: the best setting and
    its value (none when no trial completed), over every run of the study."""
    from optuna.trial import TrialState

    done = study.get_trials(states=[TrialState.COMPLETE])
    results = {"name": name, "direction": study.direction.name.lower(),
               "trials": len(study.trials), "completed": len(done),
               "pruned": len(study.get_trials(states=[TrialState.PRUNED]))}
    if done:
        results |= {"best_params": study.best_params, "best_value": study.best_value}
        print(f"optuna: best {study.best_params} = {study.best_value:.4f} ({path})", flush=True)
    OmegaConf.save(OmegaConf.create(results), path)
