"""What a checkpoint holds, by name: the model directory's files, the training state
(``TrainState``, kept as ``train_state.json``) and the optimizer's, the shards of a sharded one;
and the error a damaged one raises. The leaf of the checkpoint package."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from raydp_llm.core import integrity, storage
from raydp_llm.core.config import DpoSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import TOKENIZER_FILE
from raydp_llm.models.files import CONFIG_FILE, WEIGHTS_FILE, is_hf_dir

MODEL_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE)
STATE_JSON = "train_state.json"  # a checkpoint's training state: it marks a checkpoint
STATE_TENSORS = "train_state.pt"  # the optimizer's state and the RNG
SHARDS = "shards"  # a sharded checkpoint's DCP directory (sharded.py)


class ModelDirError(InputError):
    """A model directory or checkpoint that cannot be loaded: damaged, or its files do not fit
    together."""


def check_model_files(directory: Path, shown_as: str) -> None:
    """A model directory to load: a Hugging Face one, or this project's with its ``MODEL_FILES``;
    else one line naming those missing."""
    if is_hf_dir(directory):
        return
    missing = [n for n in MODEL_FILES if not (directory / n).is_file()]
    if missing:
        raise InputError(f"model_dir={shown_as}: no {', '.join(missing)} there; give the model/ "
                         "directory of a finished run")


def is_sharded(directory: str | Path) -> bool:
    """A sharded checkpoint (its weights in ``shards/``), as on disk."""
    return (Path(directory) / SHARDS).is_dir()


def check_complete(directory: str | Path) -> None:
    """A training checkpoint must match its ``complete.json``: ModelDirError naming the damage."""
    damage = integrity.problem(directory)
    if damage:
        raise ModelDirError(f"checkpoint {directory}: damaged, {damage}")


@dataclass
class TrainState:
    """The step, the epoch and the step within it, and the training seconds so far; in a
    checkpoint also the run's fingerprint, ``max_steps`` and number of workers (which
    ``runs.find_resumable`` reads). ``to_json`` keeps the keys and values of ``train_state.json``
    as they always were, so that any earlier checkpoint loads."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    elapsed_s: float = 0.0
    fingerprint: str | None = None  # the fields below: set when a checkpoint is written
    max_steps: int | None = None
    world: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, saved: dict) -> TrainState:
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})


PREFERENCE_RECORD = "preference.json"  # in a DPO-tuned model's directory
REFERENCE_DIR = "reference"  # model/reference/: the starting weights of a model built from scratch


@dataclass(frozen=True)
class PreferenceRecord:
    """What a DPO-tuned model's directory records of its tuning (training/driver/reference.py): its
    reference (a directory, local or s3://; relative: inside the model's directory) and the DPO
    loss settings its figures were computed with."""

    reference: str
    dpo: DpoSettings

    def write(self, model_dir: Path) -> None:
        values = {k: v for k, v in asdict(self.dpo).items() if k != "reference"}
        (Path(model_dir) / PREFERENCE_RECORD).write_text(
            json.dumps({"reference": self.reference, **values}, indent=1))

    @classmethod
    def read(cls, model_dir: str | Path, s3: S3Options = S3Options()) -> PreferenceRecord | None:
        """The record in ``model_dir`` (local or s3://), its reference resolved against it; None
        for a model not tuned with DPO here."""
        path = storage.join(str(model_dir), PREFERENCE_RECORD)
        if not storage.exists(path, s3):
            return None
        values = storage.read_json(path, s3)
        reference = values.pop("reference")
        if not storage.is_s3(reference) and not Path(reference).is_absolute():
            reference = storage.join(str(model_dir), reference)
        return cls(reference, DpoSettings(**values))
