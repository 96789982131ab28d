"""The model group's schema (conf/model/): this project's ``GPTConfig`` and ``LSTMConfig`` (the
fields their model directory's ``config.json`` holds), ``LlamaConfig`` (transformers' Llama built
from scratch) and ``HFConfig`` (any decoder transformers loads from a directory). Apart from the
rest of the configuration (core/config.py) so that the model file needs only torch:
``benchmarks/gpu.py`` runs it on a bare GPU machine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Optional

from raydp_llm.core.errors import InputError
from raydp_llm.core.schema import Choice, above, at_least, optional, setting, within


class PosEmbedding(Choice):
    learned = "learned", "a trained table"
    sinusoidal = "sinusoidal", "fixed sin/cos, no parameters"


class Activation(Choice):
    gelu = "gelu", "exact"
    gelu_tanh = "gelu_tanh", "GPT-2's tanh approximation"


@dataclass(frozen=True)
class ModelConfig:
    """What every model has: a family, a vocabulary and a training window."""

    kind: str = setting("gpt", "model family: gpt | lstm | llama | hf (pick a preset, e.g. "
                               "model=lstm, rather than overriding this)")
    vocab_size: Optional[int] = setting(None, "ids the model predicts; null = the tokenizer's "
                                              "(set after the ETL)")
    block_size: int = setting(64, "context length, tokens (training windows are block_size + 1 "
                                  "tokens)", check=at_least(1))

    def architecture(self) -> dict[str, Any]:
        """The fields that make the network, as a model directory's ``config.json`` keeps them."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("kind", "init_embeddings", "freeze_embeddings", "init_from", "path",
                             "lora")}


@dataclass(frozen=True)
class NetConfig(ModelConfig):
    """A network built from these settings, with fresh weights (gpt, lstm, llama)."""

    n_layer: int = setting(4, "layers: transformer blocks (gpt, llama) or stacked LSTM layers "
                              "(lstm)", check=at_least(1))
    n_embd: int = setting(128, "embedding width (lstm: also the hidden state size)",
                          check=at_least(1))
    dropout: float = setting(0.0, "dropout probability, in [0, 1)", check=within(0, 1))
    tie_weights: bool = setting(True, "the output head shares the token embedding table")
    init_embeddings: Optional[str] = setting(None, "token vectors to start from: CSV (id,v1..vn; "
                                                   "optional header) or .npy; null = random")
    freeze_embeddings: bool = setting(False, "keep the token embeddings fixed (with tie_weights "
                                             "the head too)")


@dataclass(frozen=True)
class GPTConfig(NetConfig):
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
class LSTMConfig(NetConfig):
    kind: str = "lstm"
    n_layer: int = 2
    n_embd: int = 256


@dataclass(frozen=True)
class LlamaConfig(NetConfig):
    """transformers' ``LlamaForCausalLM`` (RoPE, RMSNorm, SwiGLU, grouped-query attention) built
    from these settings, trained from scratch with the ETL's tokenizer."""

    kind: str = "llama"
    n_head: int = setting(4, "query heads per block; must divide n_embd", check=at_least(1))
    n_kv_head: Optional[int] = setting(None, "key/value heads (grouped-query attention), dividing "
                                             "n_head; null = n_head", check=optional(at_least(1)))
    intermediate_size: Optional[int] = setting(None, "the SwiGLU MLP's width; null = 8/3 × n_embd "
                                                     "rounded up to a multiple of 8 (Llama's "
                                                     "rule)", check=optional(at_least(1)))
    rope_theta: float = setting(10000.0, "RoPE base: higher for longer contexts (Llama 3: "
                                         "500000)", check=above(0))
    rms_norm_eps: float = setting(1e-5, "RMSNorm epsilon", check=above(0))

    def __post_init__(self) -> None:
        kv = self.n_kv_head or self.n_head
        if self.n_embd % self.n_head or self.n_head % kv:
            raise InputError(f"model.n_embd={self.n_embd}, model.n_head={self.n_head}, "
                             f"model.n_kv_head={self.n_kv_head}: n_head must divide n_embd and "
                             "n_kv_head must divide n_head; pick divisors")

    @property
    def mlp_width(self) -> int:
        return self.intermediate_size or -(-8 * self.n_embd // 3 // 8) * 8


@dataclass(frozen=True)
class LoraSettings:
    """LoRA (peft): low-rank adapters beside the chosen projections; only they are trained,
    optimised and checkpointed. The run's model/ holds the merged model and model/adapter/ the
    adapter."""

    r: int = setting(0, "the adapters' rank; 0 = no LoRA, train every weight", check=at_least(0))
    alpha: float = setting(16.0, "scale: the update is alpha / r × B·A", check=above(0))
    dropout: float = setting(0.0, "dropout on the adapters' input, in [0, 1)", check=within(0, 1))
    targets: Optional[list[str]] = setting(None, "names of the Linear layers to adapt (e.g. "
                                                 "[q_proj, v_proj]); null = every projection of "
                                                 "the attention and the MLP (not the head)")


@dataclass(frozen=True)
class HFConfig(ModelConfig):
    """A decoder that transformers' ``AutoModelForCausalLM`` loads from a Hugging Face directory
    (Llama, Qwen2, Mistral, GPT-2, ...), trained on with its own tokenizer."""

    kind: str = "hf"
    path: Optional[str] = setting(None, "the model: a local directory or s3:// prefix holding "
                                        "config.json, safetensors weights and the tokenizer files "
                                        "(save_pretrained's output) (required)")
    block_size: Optional[int] = setting(None, "the training window, tokens; null = "
                                              "min(max_position_embeddings, 1024)",
                                        check=optional(at_least(1)))
    lora: LoraSettings = setting(LoraSettings(), "LoRA adapters instead of full fine-tuning "
                                                 "(model.lora.r > 0)")


MODEL_CONFIGS = {"gpt": GPTConfig, "lstm": LSTMConfig, "llama": LlamaConfig, "hf": HFConfig}


def uses_lora(cfg: ModelConfig) -> bool:
    """Whether the model trains LoRA adapters (``model.lora.r > 0``; only model=hf has them)."""
    return bool(getattr(getattr(cfg, "lora", None), "r", 0))


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
