"""``python -m raydp_llm.prepare [overrides]``: the Spark ETL alone; writes Parquet windows and ``manifest.json``."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from raydp_llm.cluster import ray_session
from raydp_llm.errors import cli_errors
from raydp_llm.etl import write_parquet
from raydp_llm.pipeline import check_inputs, etl_session, write_manifest

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@cli_errors
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    start, timings = time.perf_counter(), {}
    corpus = check_inputs(cfg)  # bad input fails here, before Ray starts
    with ray_session(cfg.cluster), etl_session(cfg, corpus, timings, out_dir) as etl:
        write_parquet(etl, out_dir / "dataset")
        etl.manifest["phase_s"] = etl.phase_s
        manifest = write_manifest(etl, out_dir)
    log.info("wrote %s and %s in %.0fs", out_dir / "dataset", manifest, time.perf_counter() - start)


if __name__ == "__main__":
    main()
