"""A run that is a Ray Tune trial (a job of a sweep with ``hydra/launcher=ray``) passes its
evaluations on to Tune, which ranks and stops the trials by them (``sweep.scheduler``).

The launcher's trial sets ``TRIAL_ENV`` in its process (raydp_llm/cli/sweep/trial.py); a run started
any other way imports no Ray Tune."""

from __future__ import annotations

import os

TRIAL_ENV = "RAYDP_LLM_TUNE_TRIAL"


def in_trial() -> bool:
    """Whether this process runs a sweep's trial."""
    return bool(os.environ.get(TRIAL_ENV))


def trial_callbacks() -> list:
    """Ray Train callbacks: ``EvaluationsToTune`` in a trial, none otherwise."""
    if not in_trial():
        return []
    from ray.tune.integration.ray_train import TuneReportCallback

    class EvaluationsToTune(TuneReportCallback):
        """Ray Tune's own callback, without a divergence's report: it carries no figures (the run
        ends with it, and its trial fails)."""

        def after_report(self, run_context, metrics, checkpoint):
            if "diverged" not in metrics[0]:
                super().after_report(run_context, metrics, checkpoint)

    return [EvaluationsToTune()]
