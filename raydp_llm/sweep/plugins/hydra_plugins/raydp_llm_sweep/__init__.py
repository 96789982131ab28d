"""raydp_llm's Hydra launcher (``hydra/launcher=ray``, conf/hydra/launcher/).

Hydra instantiates plugins from the ``hydra_plugins`` namespace package alone, which an editable
install cannot map into raydp_llm/: this shim lives in ``raydp_llm.sweep.PLUGINS_DIR``, which the
entry points put on ``sys.path`` (``raydp_llm.sweep.use_plugins``). Hydra imports it on every
command: it imports Hydra alone, the launcher's work (raydp_llm/sweep/launcher.py) when a sweep
launches.
"""

from __future__ import annotations

from hydra.plugins.launcher import Launcher


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
        from raydp_llm.sweep.launcher import launch

        return launch(self, job_overrides, initial_job_idx)
