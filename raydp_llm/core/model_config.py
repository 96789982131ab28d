"""The model group's schema (conf/model/): ``GPTConfig`` and ``LSTMConfig``, the fields a model
directory's ``config.json`` holds. Apart from the rest of the configuration (core/config.py) so that
the model file needs only torch: ``benchmarks/gpu.py`` runs it on a bare GPU machine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Optional

from raydp_llm.core.errors import InputError
from raydp_llm.core.schema import Choice, at_least, setting, within


class PosEmbedding(Choice):
    learned = "learned", "a trained table"
    sinusoidal = "sinusoidal", "fixed sin/cos, no parameters"


class Activation(Choice):
    gelu = "gelu", "exact"
    gelu_tanh = "gelu_tanh", "GPT-2's tanh approximation"


@dataclass(frozen=True)
class ModelConfig:
    """What every model has: the model group (conf/model/) and a model directory's ``config.json``
    both hold it; ``GPTConfig`` and ``LSTMConfig`` add their own fields."""

    kind: str = setting("gpt", "model family: gpt | lstm (pick a preset, e.g. model=lstm, rather "
                               "than overriding this)")
    vocab_size: Optional[int] = setting(None, "ids the model predicts; null = the tokenizer's "
                                              "(set after the ETL)")
    n_layer: int = setting(4, "layers: transformer blocks (gpt) or stacked LSTM layers (lstm)",
                           check=at_least(1))
    n_embd: int = setting(128, "embedding width (lstm: also the hidden state size)",
                          check=at_least(1))
    block_size: int = setting(64, "context length, tokens (training windows are block_size + 1 "
                                  "tokens)", check=at_least(1))
    dropout: float = setting(0.0, "dropout probability, in [0, 1)", check=within(0, 1))
    tie_weights: bool = setting(True, "the output head shares the token embedding table")
    init_embeddings: Optional[str] = setting(None, "token vectors to start from: CSV (id,v1..vn; "
                                                   "optional header) or .npy; null = random")
    freeze_embeddings: bool = setting(False, "keep the token embeddings fixed (with tie_weights "
                                             "the head too)")

    def architecture(self) -> dict[str, Any]:
        """The fields that make the network, as a model directory's ``config.json`` keeps them."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("kind", "init_embeddings", "freeze_embeddings", "init_from")}


@dataclass(frozen=True)
class GPTConfig(ModelConfig):
    n_head: int = setting(4, "attention heads per block; must divide n_embd", check=at_least(1))
    bias: bool = setting(False, "bias terms in Linear and LayerNorm layers")
    pos_embedding: str = setting(PosEmbedding.learned, PosEmbedding.listed())
    activation: str = setting(Activation.gelu, f"the MLP's GELU: {Activation.listed()}")
    init_from: Optional[str] = setting(None, "a local Hugging Face GPT-2 directory "
                                             "(save_pretrained: config.json, model.safetensors, "
                                             "tokenizer.json) to start from: its shape, weights "
                                             "and tokenizer")

    def __post_init__(self) -> None:  # a model directory's config.json is checked here too
        if self.n_embd % self.n_head:
            raise InputError(f"model.n_embd={self.n_embd} is not divisible by "
                             f"model.n_head={self.n_head}; pick a divisor")
        for key, choices in {"pos_embedding": PosEmbedding, "activation": Activation}.items():
            value = getattr(self, key)
            if value not in choices.values():
                raise InputError(f"model.{key}={value} is not one of "
                                 f"{' | '.join(choices.values())}")


@dataclass(frozen=True)
class LSTMConfig(ModelConfig):
    kind: str = "lstm"
    n_layer: int = 2
    n_embd: int = 256


MODEL_CONFIGS = {"gpt": GPTConfig, "lstm": LSTMConfig}


def model_config(kind: str, values: dict[str, Any]) -> ModelConfig:
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
