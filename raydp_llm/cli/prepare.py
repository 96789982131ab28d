"""``python -m raydp_llm.prepare [overrides]``: the Spark ETL alone.

Writes the token stream's chunks (Parquet), their index, the tokenizer and manifest to the ETL
cache (or, with ``data.cache=false``, to ``dataset/`` in the run directory), and ``manifest.json``
into the run directory.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from raydp_llm.cli.common import cli_errors
from raydp_llm.cli.help import documented_output
from raydp_llm.cli.inputs import check_inputs, typed_settings
from raydp_llm.core.config import CONF_DIR
from raydp_llm.core.timing import Stopwatch
from raydp_llm.data.prepare import PreparedData, dataset_store, prepared, windows_of, write_json
from raydp_llm.engines.preflight import preflight
from raydp_llm.engines.ray_cluster import ray_session

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
@cli_errors
def main(cfg: DictConfig) -> None:
    settings, out_dir = typed_settings(cfg), Path(HydraConfig.get().runtime.output_dir)
    total = Stopwatch()
    corpus = check_inputs(settings)  # bad input fails here, before Ray starts
    store = dataset_store(settings.data, out_dir)
    with ray_session(settings.cluster, settings.name):
        preflight(settings.cluster, None, store)
        with prepared(settings, corpus, out_dir, to_ray=False, store=store) as data:
            manifest = data.manifest | windows_of(settings, data.index, data.manifest) | {
                "cache_hit": data.cache_hit, "dataset": str(data.entry)}
            write_json(out_dir / "manifest.json", manifest)
    print(describe(data, manifest))
    print(f"  done in {total.seconds():.0f}s; manifest.json and etl_stats.json in "
          f"{out_dir}")


def describe(data: PreparedData, m: dict) -> str:
    """What the ETL made, and what Spark did, in a few lines."""
    st = data.stats
    per_token = f", {m['chars_per_token']:.2f} chars/token" if m["chars_per_token"] else ""
    phases = ", ".join(f"{k} {v:.1f}" for k, v in st.get("phase_s", {}).items())
    hit = " (cache hit: Spark not started)" if data.cache_hit else ""
    return (f"{m['corpus']}: {m['files']} files, {m['documents']} documents, {m['characters']:,} "
            f"characters\n  tokenizer {m['tokenizer']} (vocab {m['vocab_size']}{per_token}), "
            f"{m['tokens']:,} tokens: train {m['tokens_train']:,} / val {m['tokens_val']:,}\n  "
            f"{m['chunks_train']:,} / {m['chunks_val']:,} chunks, "
            f"{m['token_bytes_stored'] / max(m['tokens'], 1):.2f} bytes per token; windows of "
            f"{m['block_size'] + 1} tokens ({m['sampling']}, stride {m['stride']}): train "
            f"{m['windows_train']:,} / val {m['windows_val']:,}\n  Spark: {st.get('jobs', 0)} "
            f"jobs, {st.get('stages', 0)} stages, {st.get('tasks', 0)} tasks "
            f"({st.get('failed_tasks', 0)} failed), {st.get('input_bytes', 0):,} bytes read, "
            f"{st.get('shuffle_write_bytes', 0):,} bytes shuffled; phases (s): {phases}\n  "
            f"dataset: {data.entry}{hit}{_bad_json(m)}")


def _bad_json(m: dict) -> str:
    """JSONL: the bad lines skipped, by kind, when there were any."""
    bad = m.get("bad_json_lines")
    if not bad or not bad["files"]:
        return ""
    kinds = ", ".join(f"{kind.replace('_', ' ')} {n:,}" for kind, n in bad.items()
                      if kind != "files")
    return f"\n  bad JSON lines skipped: {kinds}, in {len(bad['files'])} files (manifest.json)"


def cli() -> None:
    """``python -m raydp_llm.prepare`` and the ``raydp-llm-prepare`` console script."""
    with documented_output():  # --help, --cfg: each setting with its meaning
        main()
