"""raydp_llm's Hydra launcher (``hydra/launcher=ray``) and sweeper (``hydra/sweeper=optuna``),
named in conf/hydra/.

Hydra instantiates plugins from the ``hydra_plugins`` namespace package alone, which an editable
install cannot map into raydp_llm/: this shim lives in ``raydp_llm.cli.sweep.PLUGINS_DIR``, which
the entry points put on ``sys.path`` (``raydp_llm.cli.sweep.use_plugins``). Hydra imports it on
every command: it imports Hydra alone, the work (raydp_llm/cli/sweep/) when a sweep runs.
"""

from __future__ import annotations

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper


class RaydpLauncher(Launcher):
    """``concurrent``: ``true`` runs the jobs as Ray Tune trials side by side (sweep/launcher.py);
    ``auto`` does so on a Ray cluster (``cluster.address`` other than ``local``) and one job after
    another on the embedded Ray, as Hydra's basic launcher does."""

    def __init__(self, concurrent: str = "auto") -> None:
        self.concurrent = str(concurrent).lower()
        self.hydra_context = self.task_function = self.config = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(self, job_overrides, initial_job_idx):
        from raydp_llm.cli.sweep.launcher import launch

        return launch(self, job_overrides, initial_job_idx)


class RaydpOptunaSweeper(Sweeper):
    """``hydra/sweeper=optuna``: Optuna proposes the jobs from the search space in Hydra's syntax,
    as trials of one Ray Tune run (raydp_llm/cli/sweep/search.py). It takes hydra-optuna-sweeper
    1.3's keys (``params``, ``n_trials``, ``direction``, ``sampler``, ``storage``, ``study_name``,
    ``n_jobs``), which search.py reads from ``hydra.sweeper`` itself."""

    def __init__(self, **keys) -> None:
        self.hydra_context = self.task_function = self.config = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def sweep(self, arguments):
        from raydp_llm.cli.sweep.search import sweep

        return sweep(self, arguments)


class RaydpBasicSweeper(BasicSweeper):
    """-m's default sweeper: Hydra's basic sweeper (each combination of the command line's sweeps a
    job), without its check that every job of a batch composes, which ends the whole sweep on one
    that does not (``model.n_head=1.5``): the launcher composes each job itself and keeps one that
    does not as a ``failed`` row (raydp_llm/cli/sweep/launcher.py)."""

    def validate_batch_is_legal(self, batch) -> None:
        pass
