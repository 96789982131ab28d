"""A transformers model built shard by shard under ``train.strategy=fsdp`` (``model=hf``'s
checkpoint, or ``model=llama``'s fresh weights): no worker ever holds the whole model.

Each worker builds the model with its parameters on the meta device (``hf.empty_model``: no memory,
no random init), shards it as training does (``parallel.shard``: FSDP2 splits every parameter's
rows over the workers), gives its shards memory, and fills only its own rows of each tensor: from
the safetensors files (``TensorFiles.read_rows``), in the files' dtype, converted to float32 a
tensor at a time; or, for a fresh Llama, drawn from the seed by the tensor's name
(``init.fresh_values``: the values a whole build draws), one whole tensor at a time. The whole load
(``from_pretrained`` in every worker, then sharding) read every byte of the model into every
worker; a worker now reads 1/N of it (torchtitan and torchtune load the same way). With LoRA the
adapters are added on the meta device too, sharded with the base, and each worker fills its rows of
them from ``lora.adapter_init`` (drawn from the seed and the adapter's name). DDP runs need the
whole model in every worker anyway."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from raydp_llm.core.model_config import HFConfig, LlamaConfig
from raydp_llm.models import lora
from raydp_llm.models.hf import HFModel, empty_model, pretrained_dir
from raydp_llm.models.init import fresh_values
from raydp_llm.models.tensor_files import TensorFiles, weights_mismatch
from raydp_llm.training.worker import parallel

if TYPE_CHECKING:  # the spec is only read here; ``fill`` imports no engine (benchmarks/gpu_fsdp.py)
    from raydp_llm.training.spec import TrainSpec


def applies(spec: TrainSpec) -> bool:
    """Whether a worker builds its model shard by shard: FSDP, a transformers directory or a
    fresh Llama."""
    return spec.train.strategy == "fsdp" and isinstance(spec.model, (HFConfig, LlamaConfig))


def sharded_model(spec: TrainSpec, device: torch.device) -> HFModel:
    """``spec``'s model, sharded over the workers (torch.distributed initialized), each worker's
    shards read from the files; activation checkpointing applied as the worker would."""
    torch.manual_seed(spec.seed)
    directory = pretrained_dir(spec.model, spec.s3)  # None: a fresh Llama's values are drawn
    model = empty_model(spec.model, directory, spec.seed)
    if spec.without_dropout:
        from raydp_llm.training.objectives.reference import (
            without_dropout,  # Ray's data path: only here
        )

        without_dropout(model)
    if spec.train.activation_checkpointing:
        parallel.checkpoint_activations(model)
    buffers = {name: b.clone() for name, b in model.named_buffers()}  # computed, not in the files
    parallel.shard(model, device, spec.train.precision)
    model.to_empty(device=device)  # each worker's shards get memory (uninitialized)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    fill(model, directory, spec.seed)
    torch.manual_seed(spec.seed)  # the RNG as ``starting_model`` leaves it
    return model


def shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """The rows of a ``rows``-row tensor that FSDP2 gives worker ``rank`` of ``world``: the
    ``rank``-th of ``torch.chunk``'s pieces (ceil(rows / world) each; the last ones shorter or
    empty)."""
    size = -(-rows // world)
    start = min(rank * size, rows)
    return start, min(start + size, rows)


@torch.no_grad()
def fill(model: HFModel, directory: Path | None, seed: int = 0) -> None:
    """Each of ``model``'s parameters (sharded: this worker's rows) read from ``directory``'s
    safetensors (a tied head is the embedding it is tied to), or drawn from ``seed`` by name: a
    fresh Llama's (``directory`` None: ``init.fresh_values``) and LoRA's adapters
    (``lora.adapter_init``)."""
    files = TensorFiles.of(directory) if directory is not None else None
    drawn = {} if files is not None else {
        name: draw for name, _, draw in fresh_values(model.net, seed)}
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    for name, param in model.net.named_parameters():
        mine = parallel.local(param)
        start, stop = (0, param.shape[0]) if mine is param else shard_rows(param.shape[0], rank,
                                                                            world)
        init = lora.adapter_init(name, param.shape, seed)
        if init is None and name in drawn:
            init = drawn[name]()
        if init is not None:
            mine.copy_(init[start:stop])
            continue
        _read(files, model.net.base_model_prefix, name, param, mine, start, stop)


def _read(files: TensorFiles, prefix: str, name: str, param, mine, start: int, stop: int
          ) -> None:
    """``mine``, the rows ``[start, stop)`` of ``param`` (named ``name``), from the files."""
    key = files.find(lora.base_name(name), prefix)
    if key is None:
        raise weights_mismatch(files.directory, f"no tensor {name}")
    stored = files.tensors[key].shape
    if tuple(stored) != tuple(param.shape) or stop - start != len(mine):
        raise weights_mismatch(files.directory, f"{key} is {tuple(stored)}, the config makes it "
                                                f"{tuple(param.shape)}")
    files.read_rows(key, start, mine)
