"""A run that is a Ray Tune trial (a job of a sweep with ``hydra/launcher=ray``) passes its
evaluations on to Tune, which ranks and stops the trials by them (``sweep.scheduler``).

The trial's process makes the callback (``evaluations_to_tune``: it needs Tune's session there)
and the job's process, which the trial starts (raydp_llm/cli/sweep/trial.py), takes it
(``report_to``); a run started any other way has none and imports no Ray Tune."""

from __future__ import annotations

_callbacks: list = []  # the job's process's: set by report_to


def evaluations_to_tune():
    """Ray Tune's own Ray Train callback (``TuneReportCallback``), without a divergence's report:
    it carries no figures (the run ends with it, and its trial fails). Made in the trial's
    process."""
    from ray.tune.integration.ray_train import TuneReportCallback

    class EvaluationsToTune(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            if "diverged" not in metrics[0]:
                super().after_report(run_context, metrics, checkpoint)

    return EvaluationsToTune()


def report_to(callback) -> None:
    """This process runs a trial's job: its Ray Train run reports to Tune through ``callback``."""
    _callbacks[:] = [callback]


def in_trial() -> bool:
    """Whether this process runs a sweep's trial."""
    return bool(_callbacks)


def trial_callbacks() -> list:
    """Ray Train callbacks: the one to Tune in a trial, none otherwise."""
    return list(_callbacks)
