"""The model group's schema (conf/model/): ``GPTConfig`` and ``LSTMConfig``, the fields a model
directory's ``config.json`` holds. Apart from the rest of the configuration (core/config.py) so that
the model file needs only torch: ``benchmarks/gpu.py`` runs it on a bare GPU machine."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from raydp_llm.core.errors import InputError


def setting(default: Any, help: str) -> Any:  # noqa: A002 - the name Hydra users know
    """A dataclass field with its meaning (and unit) for ``--help``."""
    if isinstance(default, (dict, list)) or is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class ModelConfig:
    """What every model has: the model group (conf/model/) and a model directory's ``config.json``
    both hold it; ``GPTConfig`` and ``LSTMConfig`` add their own fields."""

    kind: str = setting("gpt", "model family: gpt | lstm (pick a preset, e.g. model=lstm, rather "
                               "than overriding this)")
    vocab_size: Optional[int] = setting(None, "ids the model predicts; null = the tokenizer's "
                                              "(set after the ETL)")
    n_layer: int = setting(4, "layers: transformer blocks (gpt) or stacked LSTM layers (lstm)")
    n_embd: int = setting(128, "embedding width (lstm: also the hidden state size)")
    block_size: int = setting(64, "context length, tokens (training windows are block_size + 1 "
                                  "tokens)")
    dropout: float = setting(0.0, "dropout probability, in [0, 1)")
    tie_weights: bool = setting(True, "the output head shares the token embedding table")
    init_embeddings: Optional[str] = setting(None, "token vectors to start from: CSV (id,v1..vn; "
                                                   "optional header) or .npy; null = random")
    freeze_embeddings: bool = setting(False, "keep the token embeddings fixed (with tie_weights "
                                             "the head too)")

    def architecture(self) -> dict:
        """The fields that make the network, as a model directory's ``config.json`` keeps them."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("kind", "init_embeddings", "freeze_embeddings", "init_from")}


POS_EMBEDDINGS = ("learned", "sinusoidal")
ACTIVATIONS = ("gelu", "gelu_tanh")


@dataclass
class GPTConfig(ModelConfig):
    n_head: int = setting(4, "attention heads per block; must divide n_embd")
    bias: bool = setting(False, "bias terms in Linear and LayerNorm layers")
    pos_embedding: str = setting("learned", "learned (a trained table) | sinusoidal (fixed "
                                            "sin/cos, no parameters)")
    activation: str = setting("gelu", "the MLP's GELU: gelu (exact) | gelu_tanh (GPT-2's tanh "
                                      "approximation)")
    init_from: Optional[str] = setting(None, "a local Hugging Face GPT-2 directory "
                                             "(save_pretrained: config.json, model.safetensors, "
                                             "tokenizer.json) to start from: its shape, weights "
                                             "and tokenizer")

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise InputError(f"model.n_embd={self.n_embd} is not divisible by "
                             f"model.n_head={self.n_head}; pick a divisor")
        if self.pos_embedding not in POS_EMBEDDINGS:
            raise InputError(f"model.pos_embedding={self.pos_embedding} is not one of "
                             f"{' | '.join(POS_EMBEDDINGS)}")
        if self.activation not in ACTIVATIONS:
            raise InputError(f"model.activation={self.activation} is not one of "
                             f"{' | '.join(ACTIVATIONS)}")


@dataclass
class LSTMConfig(ModelConfig):
    kind: str = "lstm"
    n_layer: int = 2
    n_embd: int = 256


MODEL_CONFIGS = {"gpt": GPTConfig, "lstm": LSTMConfig}


def model_config(kind: str, values: dict) -> ModelConfig:
    """The config of a model of ``kind`` with ``values`` (a model directory's ``config.json``);
    InputError for an unknown kind or a field that kind has not."""
    if kind not in MODEL_CONFIGS:
        raise InputError(f"model.kind={kind} is not one of {' | '.join(MODEL_CONFIGS)}; pick a "
                         "preset, e.g. model=lstm")
    schema = MODEL_CONFIGS[kind]
    allowed = [f.name for f in fields(schema) if f.name != "kind"]
    unknown = [key for key in values if key not in allowed]
    if unknown:
        raise InputError(f"model.kind={kind} has no setting {', '.join(unknown)} (it has "
                         f"{', '.join(allowed)}); remove it, or pick the preset model={kind} "
                         "rather than overriding model.kind")
    return schema(**values)
