"""Whether a checkpoint can start this run (``train.resume=<path>``, checked at the door): complete,
its config and tokenizer fitting together, sharded as this run's are, and of the model's shape."""

from __future__ import annotations

from dataclasses import replace

from raydp_llm.checkpoint.layout import SHARDS, STATE_JSON
from raydp_llm.checkpoint.model_dir import build_from_dir
from raydp_llm.core import integrity, storage
from raydp_llm.core.errors import InputError
from raydp_llm.core.model_config import HFConfig, ModelConfig
from raydp_llm.core.storage import S3Options
from raydp_llm.models.files import CONFIG_FILE
from raydp_llm.models.hf import HFModel


def check_resumable(location: str, model: ModelConfig, shown_as: str,
                    s3: S3Options = S3Options(), sharded: bool = False) -> None:
    """``location`` (local or s3://) must be a complete training checkpoint (``integrity``) whose
    config and tokenizer fit together, whose model has the shape ``model`` asks for (block size,
    layers, widths): its weights would not load into another, and which is ``sharded`` as the
    run's are (checkpoint/sharded.py). One line, named ``shown_as``, when not."""
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
    from raydp_llm.models.hf import llama_config

    if isinstance(model, HFConfig):
        config = storage.read_json(storage.join(model.path, CONFIG_FILE), s3)
    else:
        vocab = saved.config.vocab_size or 1
        config = llama_config(replace(model, vocab_size=vocab)).to_dict()
    have = saved.net.config.to_dict()
    differ = [k for k in SHAPE_KEYS if k in config and have.get(k) != config[k]]
    if differ:
        raise InputError(f"{shown_as}: the checkpoint's model has "
                         f"{', '.join(f'{k}={have.get(k)}' for k in differ)}, the run's "
                         f"{', '.join(f'{k}={config[k]}' for k in differ)}; resume with the "
                         "checkpoint's model settings")
