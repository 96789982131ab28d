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
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from raydp_llm.core import integrity, storage
from raydp_llm.core.config import ModelConfig, model_config
from raydp_llm.core.errors import InputError, first_line
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
from raydp_llm.models.hf import HFModel, is_hf_dir, load_hf_dir, save_hf_dir
from raydp_llm.training.runs import STATE_JSON
from raydp_llm.training.state import TrainState

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE)
STATE_TENSORS = "train_state.pt"


class ModelDirError(InputError):
    """A model directory or checkpoint that cannot be loaded: damaged, or its files do not fit
    together."""


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


def _load_weights(directory: Path, model: LanguageModel, device: str, shown_as: str) -> None:
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


def load_model_dir(directory: str | Path, device: str = "cpu",
                   s3: S3Options = S3Options()) -> tuple[LanguageModel, Tokenizer]:
    """The model (in eval mode) and tokenizer of a model directory, local or on S3 (fetched to a
    temporary directory); safetensors and JSON only, nothing unpickled. A Hugging Face directory
    (``config.json`` with a ``model_type``, trained here or elsewhere) loads with transformers."""
    if storage.is_s3(str(directory)):
        with tempfile.TemporaryDirectory() as local:
            storage.fetch(str(directory), local, s3)
            return _load_local(Path(local), device, shown_as=str(directory))
    return _load_local(Path(directory), device, shown_as=str(directory))


def _load_local(directory: Path, device: str, shown_as: str) -> tuple[LanguageModel, Tokenizer]:
    if (directory / SHARDS).is_dir():
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
    _load_weights(directory, model, device, shown_as)
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


def save_train_checkpoint(
    directory: Path, model: LanguageModel, tokenizer: Tokenizer, optimizer, state: TrainState
) -> Path:
    """A model directory plus what resuming needs: ``state`` (JSON: step, epoch, position,
    fingerprint, ...), the optimizer's state and the torch RNG; sealed last."""
    save_model_dir(directory, model, tokenizer, seal=False)
    (Path(directory) / STATE_JSON).write_text(json.dumps(state.to_json(), indent=2))
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()},
               Path(directory) / STATE_TENSORS)
    integrity.seal(directory)
    return Path(directory)


def check_complete(directory: Path) -> None:
    """A training checkpoint must match its ``complete.json``: ModelDirError naming the damage."""
    damage = integrity.problem(directory)
    if damage:
        raise ModelDirError(f"checkpoint {directory}: damaged, {damage}")


def load_train_checkpoint(directory: Path, model: LanguageModel, optimizer) -> TrainState:
    """Restore weights, optimizer and RNG from a complete training checkpoint into ``model`` and
    ``optimizer``; returns its state (``train_state.json``)."""
    directory = Path(directory)
    check_complete(directory)
    _load_weights(directory, model, str(model.wte.weight.device), str(directory))
    tensors = torch.load(directory / STATE_TENSORS, weights_only=True)
    optimizer.load_state_dict(tensors["optimizer"])
    torch.set_rng_state(tensors["torch_rng"])
    return TrainState.from_json(json.loads((directory / STATE_JSON).read_text()))


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


def check_resumable(location: str, model: ModelConfig, shown_as: str,
                    s3: S3Options = S3Options(), sharded: bool = False) -> None:
    """``location`` (local or s3://) must be a complete training checkpoint (``integrity``) whose
    config and tokenizer fit together, whose model has the shape ``model`` asks for (block size,
    layers, widths): its weights would not load into another, and which is ``sharded`` as the
    run's are (training/sharded.py). One line, named ``shown_as``, when not."""
    try:
        _check_layout(location, shown_as, s3, sharded)
        if not storage.exists(storage.join(location, STATE_JSON), s3):
            raise InputError(f"{shown_as}: not a training checkpoint (no {STATE_JSON}); give a "
                             "checkpoint_* directory of an earlier run (under its ray_results/ or "
                             "train.storage_path), or auto | never")
        if not storage.exists(storage.join(location, integrity.MARKER), s3):
            raise InputError(f"{shown_as}: damaged, no {integrity.MARKER}: it was never finished; "
                             "give an earlier checkpoint_* of that run, or train.resume=auto (it "
                             "skips damaged checkpoints)")
        saved, _ = build_from_dir(
            location, shown_as, s3
        )  # complete, and its config and tokenizer fit together
    except OSError as err:
        raise storage.unreachable(shown_as.split("=")[0], location, err) from None
    if isinstance(saved, HFModel):
        _check_same_shape(saved, model, shown_as, s3)
        return
    wanted = {k: v for k, v in model.architecture().items() if k != "vocab_size"}
    differ = [k for k, v in wanted.items() if getattr(saved.config, k, v) != v]
    if differ:
        have = ", ".join(f"{k}={getattr(saved.config, k)}" for k in differ)
        asked = ", ".join(f"model.{k}={wanted[k]}" for k in differ)
        raise InputError(f"{shown_as}: the checkpoint's model has {have}, the config asks for "
                         f"{asked}; resume with the checkpoint's model settings")


SHARDS = "shards"  # a sharded checkpoint's DCP directory (training/sharded.py)


def _check_layout(location: str, shown_as: str, s3: S3Options, sharded: bool) -> None:
    has_shards = storage.exists(storage.join(location, SHARDS, ".metadata"), s3)
    if has_shards != sharded:
        written, asked = ("sharded", "full") if has_shards else ("full", "sharded")
        raise InputError(f"{shown_as}: a {written} checkpoint, but this run writes {asked} ones "
                         "(train.strategy=fsdp and LoRA shard them); resume with the "
                         "train.strategy and model.lora of the run that wrote it")


SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "n_embd", "n_layer", "n_head")


def _check_same_shape(saved: HFModel, model: ModelConfig, shown_as: str, s3: S3Options) -> None:
    """A transformers checkpoint resumes a run whose model has its shape: model=hf's directory's
    config, or the Llama that model=llama's settings build."""
    from raydp_llm.models.hf import new_llama

    if isinstance(model, HFConfig):
        config = storage.read_json(storage.join(model.path, CONFIG_FILE), s3)
    else:
        with torch.device("meta"):
            config = new_llama(replace(model, vocab_size=saved.config.vocab_size or 1)).config
        config = config.to_dict()
    have = saved.net.config.to_dict()
    differ = [k for k in SHAPE_KEYS if k in config and have.get(k) != config[k]]
    if differ:
        raise InputError(f"{shown_as}: the checkpoint's model has "
                         f"{', '.join(f'{k}={have.get(k)}' for k in differ)}, the run's "
                         f"{', '.join(f'{k}={config[k]}' for k in differ)}; resume with the "
                         "checkpoint's model settings")
