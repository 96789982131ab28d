"""Starting values drawn by a parameter's name: each from its own generator, seeded by the run's
seed and the name, so a tensor's values do not depend on the order the model is built in, nor on
whether it is built whole or shard by shard (every worker draws the whole tensor, one at a time,
and keeps its rows). LoRA's adapters (``lora.adapter_init``) and ``model=llama``'s fresh weights
(``fresh_values``) start so."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterator

import torch
from torch import nn


def named_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator of ``seed`` (the run's ``seed`` setting: any integer) and ``name`` alone.
    The mix is taken modulo 2**64, the range ``manual_seed`` accepts: a run's seed of any size
    draws, and a small one draws what it always did."""
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**64)


def fresh_values(net: nn.Module, seed: int
                 ) -> Iterator[tuple[str, nn.Parameter, Callable[[], torch.Tensor]]]:
    """Each parameter of a fresh transformers Llama once (a tied head is its embedding), by its
    ``named_parameters`` name, with what draws its starting value: transformers' Llama init
    (Linear and Embedding weights normal(0, ``initializer_range``), biases zeros, RMSNorm weights
    ones) from ``named_generator(seed, name)``."""
    std = net.config.initializer_range
    seen = set()
    for module_name, module in net.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            name = f"{module_name}.{attr}" if module_name else attr
            yield name, param, functools.partial(_drawn, module, attr, tuple(param.shape), std,
                                                 named_generator(seed, name))


def _drawn(module: nn.Module, attr: str, shape: tuple, std: float,
           generator: torch.Generator) -> torch.Tensor:
    if attr == "weight" and isinstance(module, (nn.Linear, nn.Embedding)):
        return torch.empty(shape).normal_(0.0, std, generator=generator)
    if attr == "bias":
        return torch.zeros(shape)
    if attr == "weight" and type(module).__name__.endswith("RMSNorm"):
        return torch.ones(shape)
    raise ValueError(f"no starting value for {type(module).__name__}.{attr}")
