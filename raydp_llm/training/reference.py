"""The weights a run starts from (``starting_model``), and, for a DPO run, the reference its rewards
were measured against, recorded in its model directory (``layout.PreferenceRecord``) so that
``evaluate`` scores the tuned model against the same reference without being told which.

The reference is the starting weights: a directory the run read (``model.path`` of a transformers
model, LoRA's base included; ``model.init_from``), named in the record; or, for a model built from
scratch, those weights themselves, rebuilt on the driver from the run's seed exactly as every
worker built them and saved in ``model/reference/``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from raydp_llm.checkpoint.layout import REFERENCE_DIR, PreferenceRecord
from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.core import integrity
from raydp_llm.core.model_config import uses_lora
from raydp_llm.models import gpt2
from raydp_llm.models.factory import build_model
from raydp_llm.training.objectives import without_dropout
from raydp_llm.training.spec import TrainSpec


def starting_model(spec: TrainSpec) -> nn.Module:
    """The model as the spec builds or loads it, from ``spec.seed`` (with a GPT-2 checkpoint's
    weights for ``model.init_from``); for DPO without dropout (``objectives.without_dropout``).
    Every worker builds the same weights, and so does the driver."""
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, spec.s3, spec.seed)
    if uses_lora(spec.model):  # peft's own draws (values replaced) leave no mark on the RNG
        torch.manual_seed(spec.seed)
    if getattr(spec.model, "init_from", None):  # a GPT-2 checkpoint's weights (models/gpt2.py)
        gpt2.load_gpt2_weights(model, gpt2.read_gpt2_tensors(spec.model.init_from),
                               spec.model.init_from)
    return without_dropout(model) if spec.pairs else model


def starting_dir(spec: TrainSpec) -> str | None:
    """The directory the starting weights were read from, if any: a transformers model's
    ``model.path`` (LoRA's base too), or ``model.init_from``."""
    return getattr(spec.model, "init_from", None) or getattr(spec.model, "path", None)


def record(model_dir: Path, spec: TrainSpec) -> None:
    """Into a DPO run's exported ``model_dir``: ``preference.json`` (the reference, and the loss
    settings its figures were computed with), the rebuilt starting weights in ``reference/`` when
    they came from no directory; then sealed again."""
    reference = starting_dir(spec)
    if reference is None:
        save_model_dir(model_dir / REFERENCE_DIR, starting_model(spec), spec.tokenizer())
        reference = REFERENCE_DIR
    PreferenceRecord(reference, spec.dpo).write(model_dir)
    integrity.seal(model_dir)
