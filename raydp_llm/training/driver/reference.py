"""For a DPO run, the reference its rewards were measured against, recorded in its model directory
(``layout.PreferenceRecord``) so that ``evaluate`` scores the tuned model against the same
reference without being told which.

The reference is the starting weights: a directory the run read (``model.path`` of a transformers
model, LoRA's base included; ``model.init_from``), named in the record; or, for a model built from
scratch, those weights themselves, rebuilt on the driver from the run's seed exactly as every
worker built them and saved in ``model/reference/``.
"""

from __future__ import annotations

from pathlib import Path

from raydp_llm.checkpoint.layout import REFERENCE_DIR, PreferenceRecord
from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.core import integrity
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.worker.starting import starting_model


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
