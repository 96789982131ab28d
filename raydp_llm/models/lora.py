"""LoRA (peft) on a transformers model: the adapters added beside the targeted Linear layers (the
base weights frozen), and, after training, the adapter alone (``adapter/``) and the base with the
adapters merged into it (a Hugging Face directory that loads without peft)."""

from __future__ import annotations

import math
from pathlib import Path

from safetensors import safe_open

from raydp_llm.core.model_config import LoraSettings

ADAPTER_DIR = "adapter"  # in a LoRA run's model/: the PEFT adapter (adapter_config.json + weights)
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def add_adapters(net, lora: LoraSettings):
    """``net`` (a transformers PreTrainedModel) as a peft model: rank-``lora.r`` adapters on
    ``lora.targets``, or on every projection of the attention and the MLP (peft's "all-linear":
    every Linear but the head); only the adapters require gradients."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.targets) if lora.targets else "all-linear",
                        task_type="CAUSAL_LM")
    return get_peft_model(net, config)


def has_adapters(net) -> bool:
    from peft import PeftModel

    return isinstance(net, PeftModel)


def save_adapter(net, directory: Path) -> None:
    """The adapter of a peft ``net``, as peft's ``save_pretrained`` writes it."""
    net.save_pretrained(directory, safe_serialization=True)
    (Path(directory) / "README.md").unlink(missing_ok=True)  # peft's model card template


def merged(net):
    """A peft ``net``'s base model with the adapters' updates added to its weights."""
    return net.merge_and_unload()


def adapter_params(directory: Path) -> int | None:
    """The parameters of the adapter in ``directory/adapter`` (a LoRA run's model/), or None."""
    weights = Path(directory) / ADAPTER_DIR / ADAPTER_WEIGHTS
    if not weights.is_file():
        return None
    with safe_open(weights, framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
