"""``python -m raydp_llm.prepare [overrides]``: the Spark ETL alone.

Writes the token stream's chunks (Parquet), their index, the tokenizer and manifest to the ETL
cache (or, with ``data.cache=false``, to ``dataset/`` in the run directory), and ``manifest.json``
into the run directory. This module is the door: it checks the input before Ray and Spark load;
the job is ``cli/prepare_job.py``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from raydp_llm.cli.common import cli_errors
from raydp_llm.cli.help import Usage, documented_output
from raydp_llm.cli.inputs import check_inputs, typed_settings
from raydp_llm.cli.preflight import preflight
from raydp_llm.core.registry import CONF_DIR, register_configs
from raydp_llm.core.timing import Stopwatch

USAGE = Usage("python -m raydp_llm.prepare [group=option ...] [key=value ...]: the Spark ETL "
              "alone, train's data settings: Parquet windows and manifest.json",
              examples=("  python -m raydp_llm.prepare data.path=/data/corpus/",
                        "  python -m raydp_llm.prepare +experiment=shakespeare_bpe "
                        "data.path=/path/to/tinyshakespeare.txt",
                        "  python -m raydp_llm.prepare data.format=sql "
                        "data.query=\"SELECT text FROM docs WHERE lang = 'en'\"",
                        "--cfg job prints the composed config; docs/configuration.md, the data "
                        "settings."))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
@cli_errors
def main(cfg: DictConfig) -> None:
    settings, out_dir = typed_settings(cfg), Path(HydraConfig.get().runtime.output_dir)
    total = Stopwatch()
    corpus = check_inputs(settings)  # bad input fails here, before Ray starts (a mixture: each)
    from raydp_llm.cli import prepare_job  # Ray, Spark, torch: seconds to import

    prepare_job.run_checked(settings, corpus, out_dir, total)


def cli() -> None:
    """``python -m raydp_llm.prepare`` and the ``raydp-llm-prepare`` console script."""
    register_configs()
    with documented_output(USAGE):  # --help, --cfg: each setting with its meaning
        preflight("config")  # what Hydra refuses: one line, exit status 2
        main()
