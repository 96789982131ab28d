"""``python -m raydp_llm.prepare [overrides]``: the Spark ETL alone.

Writes the windows (Parquet), tokenizer and manifest to the ETL cache (or, with ``data.cache=false``, to
``dataset/`` in the run directory), and ``manifest.json`` into the run directory.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from raydp_llm.cluster import ray_session
from raydp_llm.errors import cli_errors
from raydp_llm.pipeline import check_inputs, prepare_data, write_manifest

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@cli_errors
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    start, timings = time.perf_counter(), {}
    corpus = check_inputs(cfg)  # bad input fails here, before Ray starts
    store = Path(to_absolute_path(cfg.data.cache_dir)) if cfg.data.cache else out_dir / "dataset"
    with ray_session(cfg.cluster):
        data = prepare_data(cfg, corpus, out_dir, timings, to_ray=False, store=store)
    manifest = data.manifest | {"phase_s": data.phase_s, "cache_hit": data.cache_hit, "dataset": str(data.entry)}
    write_manifest(manifest, out_dir)
    m = manifest
    print(f"{m['corpus']}: {m['files']} files, {m['documents']} documents, {m['characters']:,} characters\n"
          f"  tokenizer {m['tokenizer']} (vocab {m['vocab_size']}, {m['chars_per_token']:.2f} chars/token), "
          f"{m['tokens']:,} tokens: train {m['tokens_train']:,} / val {m['tokens_val']:,}\n"
          f"  windows of {m['block_size'] + 1} tokens, stride {m['stride']}: train {m['windows_train']:,} / "
          f"val {m['windows_val']:,}\n"
          f"  dataset: {data.entry}{' (cache hit)' if data.cache_hit else ''}\n"
          f"  done in {time.perf_counter() - start:.0f}s; manifest: {out_dir / 'manifest.json'}")


if __name__ == "__main__":
    main()
