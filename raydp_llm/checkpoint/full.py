"""Full training checkpoints (``train.strategy=ddp`` without LoRA): rank 0 writes a model directory
plus ``train_state.json`` (step, epoch, position, run fingerprint) and ``train_state.pt`` (the
optimizer's state and the torch RNG, loaded with ``weights_only=True``), sealed last."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from raydp_llm.checkpoint.layout import STATE_JSON, STATE_TENSORS, TrainState, check_complete
from raydp_llm.checkpoint.model_dir import load_weights, save_model_dir
from raydp_llm.core import integrity
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.models.base import LanguageModel


def save(
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


def load(directory: Path, model: LanguageModel, optimizer) -> TrainState:
    """Restore weights, optimizer and RNG from a complete training checkpoint into ``model`` and
    ``optimizer``; returns its state (``train_state.json``)."""
    directory = Path(directory)
    check_complete(directory)
    load_weights(directory, model, str(model.wte.weight.device), str(directory))
    tensors = torch.load(directory / STATE_TENSORS, weights_only=True)
    optimizer.load_state_dict(tensors["optimizer"])
    torch.set_rng_state(tensors["torch_rng"])
    return TrainState.from_json(json.loads((directory / STATE_JSON).read_text()))


