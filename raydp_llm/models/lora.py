"""LoRA (peft) on a transformers model: the adapters added beside the targeted Linear layers (the
base weights frozen), and, after training, the adapter alone (``adapter/``) and the base with the
adapters merged into it (a Hugging Face directory that loads without peft)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from raydp_llm.core.model_config import LoraSettings
from raydp_llm.models.init import named_generator

ADAPTER_DIR = "adapter"  # in a LoRA run's model/: the PEFT adapter (adapter_config.json + weights)
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def add_adapters(net, lora: LoraSettings, seed: int):
    """``net`` (a transformers PreTrainedModel) as a peft model: rank-``lora.r`` adapters on
    ``lora.targets``, or on every projection of the attention and the MLP (peft's "all-linear":
    every Linear but the head), initialized from ``seed`` (``adapter_init``; left alone on the
    meta device, where a sharded load fills them); only the adapters require gradients."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.targets) if lora.targets else "all-linear",
                        task_type="CAUSAL_LM")
    net = get_peft_model(net, config)
    with torch.no_grad():
        for name, param in net.named_parameters():
            init = adapter_init(name, param.shape, seed)
            if init is not None and param.device.type != "meta":
                param.copy_(init)
    return net


def adapter_init(name: str, shape, seed: int) -> torch.Tensor | None:
    """The starting value of the adapter tensor ``name`` as peft draws it (A: Kaiming-uniform,
    as ``nn.Linear``'s; B: zeros), from a generator of ``seed`` and the name alone: the same
    values whether the model is loaded whole or shard by shard, on any number of workers. None
    for a tensor that is no adapter's."""
    if ".lora_B." in name:
        return torch.zeros(shape)
    if ".lora_A." not in name:
        return None
    return torch.nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5),
                                          generator=named_generator(seed, name))


def base_name(name: str) -> str:
    """A peft model's parameter ``name`` as its base model names it (in the base's files)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


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
