"""Sweeps (``python -m raydp_llm.train -m ...``): Hydra's multirun. summary.py is the callback
around every sweep (one Ray, each job's row, ``sweep_summary.csv``); launcher.py runs the jobs one
after another, or with trial.py as Ray Tune trials side by side (``hydra/launcher=ray``);
search.py and study.py have Optuna propose them (``hydra/sweeper=optuna``); records.py keeps each
job's row as it ends, which a rerun of the sweep reads. ``PLUGINS_DIR``
holds the Hydra plugins that name the launcher and the sweeper."""

from __future__ import annotations

import sys
from pathlib import Path

PLUGINS_DIR = str(Path(__file__).resolve().parent / "plugins")


def use_plugins() -> None:
    """Let Hydra find raydp_llm's launcher (``hydra_plugins.raydp_llm_sweep``): before Hydra's
    first plugin scan, which every entry point's ``main`` runs."""
    if PLUGINS_DIR not in sys.path:
        sys.path.append(PLUGINS_DIR)
