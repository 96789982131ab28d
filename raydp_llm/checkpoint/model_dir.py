"""The model directory (``model.safetensors`` + ``config.json`` + ``tokenizer.json``; loads without
Ray or Spark) and training checkpoints: a model directory plus ``train_state.json`` (step, data
position, run fingerprint) and ``train_state.pt`` (optimizer and RNG state, loaded with
``weights_only=True``: nothing arbitrary is unpickled). Both may live on S3 (``s3://...``): they are
read from there directly, or fetched to a temporary directory.

Both are sealed (``integrity``): ``complete.json`` lists every file with its size and SHA-256, and a
directory whose files do not match it is refused with one line, never loaded. So is a model
directory whose weights, config and tokenizer do not fit together.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from raydp_llm.checkpoint.layout import (
    SHARDS,
    STATE_JSON,
    STATE_TENSORS,
    ModelDirError,
    is_sharded,
)
from raydp_llm.core import integrity, storage
from raydp_llm.core.config import ModelConfig, model_config
from raydp_llm.core.errors import first_line
from raydp_llm.core.model_config import HFConfig
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_json,
)
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.factory import build_model
from raydp_llm.models.files import CONFIG_FILE, WEIGHTS_FILE, is_hf_dir
from raydp_llm.models.hf import HFModel, load_hf_dir, save_hf_dir


def save_model_dir(directory: Path, model: LanguageModel, tokenizer: Tokenizer,
                   seal: bool = True, weights: bool = True) -> Path:
    """Weights (a tied lm_head is wte: stored once; none without ``weights``: a sharded
    checkpoint's are in its shards), ``{"model": kind, **config}`` and the tokenizer; with
    ``seal``, then ``complete.json``. A transformers model (llama, hf) as a Hugging Face directory
    (``pretrained.save_hf_dir``)."""
    directory = Path(directory)
    if isinstance(model, HFModel):
        save_hf_dir(directory, model, tokenizer, weights)
        return integrity.seal(directory) if seal else directory
    directory.mkdir(parents=True, exist_ok=True)
    if weights:
        tied = model.config.tie_weights
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                   if not (tied and k == "lm_head.weight")}, directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(
        json.dumps({"model": model.kind, **model.config.architecture()}, indent=2)
    )
    tokenizer.save(directory)
    if seal:
        integrity.seal(directory)
    return directory


def load_weights(directory: Path, model: LanguageModel, device: str, shown_as: str) -> None:
    """The weights of a model directory into ``model`` (a tied lm_head is stored once, as wte)."""
    try:
        state = load_file(Path(directory) / WEIGHTS_FILE, device=device)
    except (SafetensorError, OSError) as err:
        raise ModelDirError(f"{shown_as}: {WEIGHTS_FILE} is damaged "
                            f"({first_line(err, 120)}); give a model/ directory or "
                            "checkpoint that a run finished writing") from None
    if isinstance(model, HFModel):
        model.load_weights(state, shown_as)
        return
    if model.config.tie_weights and "wte.weight" in state:
        state["lm_head.weight"] = state["wte.weight"]
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        mismatch = _state_mismatch(model, state)
        raise ModelDirError(f"{shown_as}: {WEIGHTS_FILE} does not fit its {CONFIG_FILE} "
                            f"({mismatch}); give the weights, config and tokenizer of one run "
                            "together") from err


def _state_mismatch(model: LanguageModel, state: dict) -> str:
    """The first difference between a model's parameters and the tensors of a weights file, in a few
    words."""
    want = model.state_dict()
    for name, tensor in want.items():
        if name not in state:
            return f"no tensor {name}"
        if tuple(state[name].shape) != tuple(tensor.shape):
            return (f"{name} is {tuple(state[name].shape)} in the file, "
                    f"{tuple(tensor.shape)} in the model")
    extra = sorted(set(state) - set(want))
    return f"unexpected tensor {extra[0]}" if extra else "tensors differ"


def read_model_config(directory: str | Path, s3: S3Options = S3Options()) -> ModelConfig:
    """A model directory's (or checkpoint's, local or S3) ``config.json`` as the model's config."""
    config = storage.read_json(storage.join(str(directory), CONFIG_FILE), s3)
    return model_config(config.pop("model"), config)


def load_model_dir(directory: str | Path, device: str = "cpu", s3: S3Options = S3Options(),
                   key: str = "model_dir") -> tuple[LanguageModel, Tokenizer]:
    """The model (in eval mode) and tokenizer of a model directory, local or on S3 (fetched to a
    temporary directory: an S3 out of reach is one line naming the setting ``key``); safetensors
    and JSON only, nothing unpickled. A Hugging Face directory (``config.json`` with a
    ``model_type``, trained here or elsewhere) loads with transformers."""
    if storage.is_s3(str(directory)):
        with tempfile.TemporaryDirectory() as local:
            try:
                storage.fetch(str(directory), local, s3)
            except OSError as err:
                raise storage.unreachable(key, directory, err) from None
            return _load_local(Path(local), device, shown_as=str(directory))
    return _load_local(Path(directory), device, shown_as=str(directory))


def _load_local(directory: Path, device: str, shown_as: str) -> tuple[LanguageModel, Tokenizer]:
    if is_sharded(directory):
        raise ModelDirError(f"{shown_as}: a sharded training checkpoint (train.strategy=fsdp or "
                            f"LoRA), its weights split in {SHARDS}/; give the run's model/ "
                            "directory, which holds them whole")
    if is_hf_dir(directory):
        _check_sealed(directory, shown_as)
        return load_hf_dir(directory, device)
    if not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{shown_as}: no {WEIGHTS_FILE}; give the model/ directory of a "
                                "finished run")
    model, tokenizer = build_from_dir(directory, shown_as)
    load_weights(directory, model, device, shown_as)
    return model.to(device).eval(), tokenizer


def build_from_dir(
    directory: str | Path, shown_as: str, s3: S3Options = S3Options()
) -> tuple[LanguageModel, Tokenizer]:
    """The model (fresh weights) and tokenizer a model directory or checkpoint describes, after
    checking that it is complete (``complete.json``, where it has one) and that its config and
    tokenizer fit together."""
    _check_sealed(directory, shown_as, s3)
    if is_hf_dir(directory, s3):
        return _hf_shape(directory, shown_as, s3)
    try:
        model = build_model(read_model_config(directory, s3))
    except (ValueError, KeyError, TypeError) as err:  # a JSON error, no "model" key, unknown fields
        raise ModelDirError(f"{shown_as}: {CONFIG_FILE} is not a model config ({str(err)[:120]}); "
                            "give the model/ directory of a finished run") from None
    try:
        tokenizer = tokenizer_from_json(
            storage.read_text(storage.join(str(directory), TOKENIZER_FILE), s3)
        )
    except Exception as err:  # tokenizers raises plain Exceptions for a bad file
        raise ModelDirError(
            f"{shown_as}: {TOKENIZER_FILE} is unreadable "
            f"({first_line(err, 120)}); give the model/ directory of a "
            "finished run"
        ) from None
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ModelDirError(f"{shown_as}: {TOKENIZER_FILE} has {tokenizer.vocab_size} ids but "
                            f"{CONFIG_FILE} says vocab_size={model.config.vocab_size}; give the "
                            "tokenizer of the run that trained it")
    return model, tokenizer


def _check_sealed(directory: str | Path, shown_as: str, s3: S3Options = S3Options()) -> None:
    """A directory with ``complete.json`` must match it (one without is not checked)."""
    sealed = storage.exists(storage.join(str(directory), integrity.MARKER), s3)
    damage = integrity.problem(directory, s3) if sealed else None
    if damage:
        raise ModelDirError(f"{shown_as}: damaged, {damage}; give a model/ directory or checkpoint "
                            "that a run finished writing")


def _hf_shape(directory: str | Path, shown_as: str, s3: S3Options):
    """A Hugging Face checkpoint's model, as its config describes it (weights on the meta device:
    only its shape is compared), and its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as local:
        for name in (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE):
            storage.copy(storage.join(str(directory), name), Path(local) / name, s3)
        tokenizer = load_tokenizer(Path(local))
        with torch.device("meta"):
            net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(local))
    return HFModel(net, HFConfig(path=shown_as)), tokenizer


def export_model_dir(checkpoint_dir: Path, directory: Path) -> Path:
    """Copy the model files (not the optimizer state) of a checkpoint into a new ``directory``,
    sealed, whole or absent (``storage.whole_or_absent``)."""
    not_model = (STATE_JSON, STATE_TENSORS, integrity.MARKER)
    with storage.whole_or_absent(directory) as tmp:
        tmp.mkdir(parents=True)
        for path in sorted(Path(checkpoint_dir).iterdir()):
            if path.is_file() and path.name not in not_model:
                shutil.copy2(path, tmp / path.name)
        integrity.seal(tmp)
    return Path(directory)


