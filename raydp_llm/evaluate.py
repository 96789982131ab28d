"""``python -m raydp_llm.evaluate model_dir=DIR data.path=... [overrides]``: a trained model on any corpus.

The corpus goes through the same Spark ETL (or the ETL cache) with the model's tokenizer and block size; its
windows (both splits: the whole corpus) are then read from the Parquet dataset and scored in this process with
torch: mean cross-entropy per token, perplexity, bits per character and top-1 next-token accuracy. Prints a
table and writes ``evaluation.json`` into the run directory.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

import hydra
import numpy as np
import pyarrow.dataset as pads
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig
from torch.nn import functional as F

from raydp_llm import storage
from raydp_llm.checkpoint import MODEL_FILES, load_model_dir
from raydp_llm.cluster import ray_session
from raydp_llm.config import documented_output
from raydp_llm.errors import InputError, cli_errors
from raydp_llm.model import LanguageModel
from raydp_llm.pipeline import absolute, check_inputs, dataset_store, prepare_data, write_json
from raydp_llm.storage import S3Options
from raydp_llm.tokenizer import TOKENIZER_FILE
from raydp_llm.trainer import WindowBatch

log = logging.getLogger(__name__)


def load_model(cfg: DictConfig, out_dir: Path) -> LanguageModel:
    """The model of ``model_dir`` (an s3:// one is fetched to ``out_dir/model``); points the ETL at its tokenizer
    and block size (``cfg`` is changed)."""
    if not cfg.model_dir:
        raise InputError("model_dir is required: give the model/ directory of a finished run, "
                         "e.g. model_dir=outputs/raydp_llm/<run>/model")
    if storage.is_s3(cfg.model_dir):  # fetched into the run directory: the ETL reads its tokenizer from there
        model_dir = out_dir / "model"
        try:
            storage.fetch(cfg.model_dir, model_dir, S3Options.of(cfg.s3))
        except OSError as err:
            raise storage.unreachable("model_dir", cfg.model_dir, err) from None
    else:
        model_dir = Path(to_absolute_path(cfg.model_dir))
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise InputError(f"model_dir={cfg.model_dir}: no {', '.join(missing)} there; give the model/ directory of "
                         "a finished run")
    model, tokenizer = load_model_dir(model_dir)
    ids_model = tokenizer.kind == "ids"
    if ids_model != (cfg.data.format == "ids"):
        raise InputError(f"data.format={cfg.data.format} does not fit the model's {tokenizer.kind} tokenizer: set "
                         f"data.format={'ids' if ids_model else 'text (or parquet)'}")
    cfg.tokenizer.path = str(model_dir / TOKENIZER_FILE)
    cfg.model.block_size = model.config.block_size
    if ids_model:  # ids beyond the model's vocabulary are then bad input, reported by the ETL
        cfg.data.vocab_size = tokenizer.vocab_size
    return model


def read_windows(split_dir: Path, batch_size: int) -> Iterator[np.ndarray]:
    """The raw windows (bytes) of one split of an ETL dataset, at most ``batch_size`` at a time."""
    for batch in pads.dataset(split_dir, format="parquet").to_batches(columns=["tokens"], batch_size=batch_size):
        if batch.num_rows:
            yield np.array(batch.column("tokens").to_pylist(), dtype=object)


@torch.no_grad()
def score(model: LanguageModel, batches: Iterable[np.ndarray], collate: WindowBatch) -> dict:
    """Summed cross-entropy (nats) and correct top-1 predictions of the next token, over windows and tokens."""
    model.eval()
    totals = {"windows": 0, "tokens": 0, "nats": 0.0, "correct": 0}
    for windows in batches:
        x, y = collate(windows)
        logits, _ = model(x)
        totals["nats"] += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
        totals["correct"] += int((logits.argmax(dim=-1) == y).sum())
        totals["windows"] += len(y)
        totals["tokens"] += y.numel()
    return totals


def metrics(totals: dict, chars_per_token: float | None) -> dict:
    """Per-token loss (nats), perplexity, bits per character (None for id corpora), top-1 accuracy."""
    loss = totals["nats"] / totals["tokens"]
    return {"loss": loss, "perplexity": math.exp(loss),
            "bits_per_char": loss / math.log(2) / chars_per_token if chars_per_token else None,
            "accuracy": totals["correct"] / totals["tokens"], "windows": totals["windows"],
            "tokens": totals["tokens"]}


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Evaluate ``cfg.model_dir`` on ``cfg.data`` into ``out_dir``; returns what ``evaluation.json`` holds."""
    start, timings = time.perf_counter(), {}
    model = load_model(cfg, out_dir)
    corpus = check_inputs(cfg)  # bad input fails here, before Ray starts
    with ray_session(cfg.cluster, cfg.name):
        data = prepare_data(cfg, corpus, out_dir, timings, to_ray=False, store=dataset_store(cfg, out_dir))
    m = data.manifest
    t = time.perf_counter()
    torch.set_num_threads(os.cpu_count())
    batches = (w for split in ("train", "val") for w in read_windows(data.entry / split, cfg.eval_batch_size))
    collate = WindowBatch(m["token_dtype"], model.config.block_size, torch.device("cpu"))
    result = metrics(score(model, batches, collate), m["chars_per_token"])
    timings |= {"eval_s": time.perf_counter() - t, "total_s": time.perf_counter() - start}
    evaluation = {"model_dir": absolute(cfg.model_dir), **result, "dataset": str(data.entry),
                  **{k: round(v, 2) for k, v in timings.items()}, "etl": m | {"cache_hit": data.cache_hit}}
    write_json(out_dir / "evaluation.json", evaluation)
    bpc = result["bits_per_char"]
    print(f"{evaluation['model_dir']} on {m['corpus']}: {result['windows']:,} windows of {m['block_size'] + 1} "
          f"tokens, stride {m['stride']}, {result['tokens']:,} tokens predicted\n"
          f"  loss (nats/token)  {result['loss']:.4f}\n"
          f"  perplexity         {result['perplexity']:.3f}\n"
          f"  bits per char      {'n/a (token ids)' if bpc is None else f'{bpc:.4f}'}\n"
          f"  top-1 accuracy     {result['accuracy']:.4f}\n"
          f"  done in {timings['total_s']:.0f}s (ETL {timings['etl_s']:.0f}s{', cache hit' if data.cache_hit else ''}"
          f", evaluation {timings['eval_s']:.0f}s); evaluation.json in {out_dir}")
    return evaluation


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@cli_errors
def main(cfg: DictConfig) -> float:
    return run(cfg, Path(HydraConfig.get().runtime.output_dir))["loss"]


if __name__ == "__main__":
    with documented_output():  # --help, --cfg: each setting with its meaning
        main()
