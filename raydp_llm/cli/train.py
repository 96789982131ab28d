"""``python -m raydp_llm.train [overrides]``: Spark ETL on Ray → Ray Dataset → DDP training →
model and text. This module is the door: it checks the input before torch, Ray and Spark load (a
bad setting fails in a second); the run itself is ``training/driver/run.py``."""

from __future__ import annotations

import time
from pathlib import Path

import hydra
import psutil
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from raydp_llm.cli.common import cli_errors
from raydp_llm.cli.help import documented_output
from raydp_llm.cli.inputs import check_inputs, typed_settings
from raydp_llm.cli.preflight import preflight
from raydp_llm.cli.sweep import use_plugins
from raydp_llm.core.config import Settings
from raydp_llm.core.registry import CONF_DIR, register_configs
from raydp_llm.core.timing import Started
from raydp_llm.training.driver import runs


def run(settings: Settings, out_dir: Path, sweep_dir: str | None = None) -> dict:
    """The whole run into ``out_dir`` (``training/run.run``) once its input passed the checks;
    returns the summary."""
    # a resumed run reads the table snapshot its checkpoints learned from
    settings = runs.pin_resumed_table(settings, out_dir, sweep_dir)
    corpus = check_inputs(settings)  # bad input fails here, before Ray starts
    from raydp_llm.training.driver import run as train_run  # torch, Ray, Spark: seconds to import

    started = Started(command=psutil.Process().create_time(), ready=time.time())
    return train_run.run(settings, corpus, out_dir, started, sweep_dir)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
@cli_errors
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    sweep_dir = None
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = str(Path(hydra_cfg.sweep.dir).resolve())
    summary = run(typed_settings(cfg), Path(hydra_cfg.runtime.output_dir), sweep_dir)
    return summary["final_val_loss"]


def cli() -> None:
    """``python -m raydp_llm.train`` and the ``raydp-llm-train`` console script."""
    register_configs()
    use_plugins()  # -m's launcher (hydra/launcher=ray)
    with documented_output():  # --help, --cfg: each setting with its meaning
        preflight("config")  # what Hydra refuses: one line, exit status 2
        # before Hydra writes its own files into an explicit hydra.run.dir
        runs.refuse_used_run_dir()
        main()
