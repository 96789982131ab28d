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
from omegaconf import DictConfig

from raydp_llm.cluster import ray_session
from raydp_llm.config import documented_output
from raydp_llm.errors import cli_errors
from raydp_llm.pipeline import check_inputs, dataset_store, prepare_data, write_json

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@cli_errors
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    start, timings = time.perf_counter(), {}
    corpus = check_inputs(cfg)  # bad input fails here, before Ray starts
    with ray_session(cfg.cluster, cfg.name):
        data = prepare_data(cfg, corpus, out_dir, timings, to_ray=False, store=dataset_store(cfg, out_dir))
    m = data.manifest | {"cache_hit": data.cache_hit, "dataset": str(data.entry)}
    write_json(out_dir / "manifest.json", m)
    st = data.stats
    print(f"{m['corpus']}: {m['files']} files, {m['documents']} documents, {m['characters']:,} characters\n"
          f"  tokenizer {m['tokenizer']} (vocab {m['vocab_size']}"
          f"{f', {cpt:.2f} chars/token' if (cpt := m['chars_per_token']) else ''}), "
          f"{m['tokens']:,} tokens: train {m['tokens_train']:,} / val {m['tokens_val']:,}\n"
          f"  windows of {m['block_size'] + 1} tokens, stride {m['stride']}: train {m['windows_train']:,} / "
          f"val {m['windows_val']:,}\n"
          f"  Spark: {st.get('jobs', 0)} jobs, {st.get('stages', 0)} stages, {st.get('tasks', 0)} tasks "
          f"({st.get('failed_tasks', 0)} failed), {st.get('input_bytes', 0):,} bytes read, "
          f"{st.get('shuffle_write_bytes', 0):,} bytes shuffled; phases (s): "
          f"{', '.join(f'{k} {v:.1f}' for k, v in st.get('phase_s', {}).items())}\n"
          f"  dataset: {data.entry}{' (cache hit: Spark not started)' if data.cache_hit else ''}\n"
          f"  done in {time.perf_counter() - start:.0f}s; manifest.json and etl_stats.json in {out_dir}")


if __name__ == "__main__":
    with documented_output():  # --help, --cfg: each setting with its meaning
        main()
