"""Sweeps (``python -m raydp_llm.train -m ...``): Hydra's multirun, its jobs as Ray Tune trials side
by side on the cluster (launcher.py, trial.py), with early stopping, and each job's row in
``sweep_summary.csv`` (records.py). ``PLUGINS_DIR`` holds the Hydra plugin that names them."""

from __future__ import annotations

import sys
from pathlib import Path

PLUGINS_DIR = str(Path(__file__).resolve().parent / "plugins")


def use_plugins() -> None:
    """Let Hydra find raydp_llm's launcher (``hydra_plugins.raydp_llm_sweep``): before Hydra's
    first plugin scan, which every entry point's ``main`` runs."""
    if PLUGINS_DIR not in sys.path:
        sys.path.append(PLUGINS_DIR)
