"""``python -m raydp_llm.evaluate model_dir=DIR data.path=... [overrides]``: a trained model on any
corpus, on preference pairs or on lm-evaluation-harness tasks.

The corpus goes through the same Spark ETL (or the ETL cache) with the model's tokenizer and block
size; its windows (both splits: the whole corpus) are then read from the Parquet dataset and scored
in this process with torch: mean cross-entropy per token, perplexity, bits per character and top-1
next-token accuracy. Prints a table and writes ``evaluation.json`` into the run directory. This
module is the door: ``--help``, Hydra's errors and a missing or incomplete ``model_dir`` come
before torch, Ray and Spark load; the job is ``cli/evaluate_job.py``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from raydp_llm.checkpoint.layout import check_model_files
from raydp_llm.cli.common import cli_errors
from raydp_llm.cli.help import Usage, documented_output
from raydp_llm.cli.inputs import given, typed_settings
from raydp_llm.cli.preflight import preflight
from raydp_llm.core import storage
from raydp_llm.core.config import EvaluateSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.registry import CONF_DIR, register_configs


def run(settings: EvaluateSettings, out_dir: Path, window: int | None = None) -> dict:
    """Evaluate ``settings.model_dir`` on ``settings.data`` or ``settings.tasks`` into ``out_dir``
    (windows of ``window`` tokens, default the model's block size), logged to MLflow with
    ``tracking=mlflow``; returns what ``evaluation.json`` holds."""
    if not settings.model_dir:
        raise InputError("model_dir is required: give the model/ directory of a finished run, "
                         "e.g. model_dir=outputs/raydp_llm/<run>/model")
    if not storage.is_s3(settings.model_dir):  # an s3:// one: once the job has fetched it
        check_model_files(Path(settings.model_dir), settings.model_dir)
    from raydp_llm.cli import evaluate_job  # torch, Ray, Spark: seconds to import

    return evaluate_job.run(settings, out_dir, window)


USAGE = Usage("python -m raydp_llm.evaluate model_dir=DIR [data.path=...] [key=value ...]: a "
              "trained model's loss, perplexity and accuracy on a corpus, its task scores or its "
              "answers", EvaluateSettings,
              examples=("  python -m raydp_llm.evaluate model_dir=outputs/raydp_llm/<run>/model",
                        "  python -m raydp_llm.evaluate model_dir=DIR data.path=/data/held_out.txt",
                        "  python -m raydp_llm.evaluate model_dir=DIR tasks=[hellaswag] limit=100",
                        "  python -m raydp_llm.evaluate model_dir=DIR data.format=preference "
                        "data.path=pairs.jsonl",
                        "docs/evaluation.md: every kind of evaluation and its output."))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
@cli_errors
def main(cfg: DictConfig) -> float:
    settings = typed_settings(cfg)
    # the model's own block size, unless the command line gives one (the config always has one)
    window = settings.model.block_size if "block_size" in given(None, "model.") else None
    return run(settings, Path(HydraConfig.get().runtime.output_dir), window).get("loss")


def cli() -> None:
    """``python -m raydp_llm.evaluate`` and the ``raydp-llm-evaluate`` console script."""
    register_configs()
    with documented_output(USAGE):  # --help, --cfg: each setting with its meaning
        preflight("evaluate")  # what Hydra refuses: one line, exit status 2
        main()
