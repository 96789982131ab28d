"""A transformers checkpoint loaded shard by shard (``train.strategy=fsdp`` with ``model=hf``): no
worker ever holds the whole model.

Each worker builds the model with its parameters on the meta device (``hf.empty_net``: no memory,
no random init), shards it as training does (``parallel.shard``: FSDP2 splits every parameter's
rows over the workers), gives its shards memory, and reads into them only its own rows of each
tensor from the safetensors files (``TensorFiles.read_rows``), in the files' dtype, converted to
float32 a tensor at a time. The whole load (``from_pretrained`` in every worker, then sharding)
read every byte of the model into every worker; a worker now reads 1/N of it (torchtitan and
torchtune load the same way). With LoRA the adapters are added on the meta device too, sharded
with the base, and each worker fills its rows of them from ``lora.adapter_init`` (drawn from the
seed and the adapter's name: the values a whole load starts from). DDP runs need the whole model
in every worker anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from raydp_llm.core.model_config import HFConfig, uses_lora
from raydp_llm.models import lora
from raydp_llm.models.files import local_copy
from raydp_llm.models.hf import HFModel, empty_net
from raydp_llm.models.tensor_files import TensorFiles, weights_mismatch
from raydp_llm.training import parallel

if TYPE_CHECKING:  # the spec is only read here; ``fill`` imports no engine (benchmarks/gpu_fsdp.py)
    from raydp_llm.training.spec import TrainSpec


def applies(spec: TrainSpec) -> bool:
    """Whether a worker loads its model shard by shard: FSDP, a transformers directory."""
    return spec.train.strategy == "fsdp" and isinstance(spec.model, HFConfig)


def sharded_model(spec: TrainSpec, device: torch.device) -> HFModel:
    """``spec``'s model, sharded over the workers (torch.distributed initialized), each worker's
    shards read from the files; activation checkpointing applied as the worker would."""
    directory = local_copy(spec.model.path, spec.s3)
    torch.manual_seed(spec.seed)
    net = empty_net(directory)
    if uses_lora(spec.model):
        net = lora.add_adapters(net, spec.model.lora, spec.seed)  # on the meta device: no values
    model = HFModel(net, spec.model)
    if spec.pairs:
        from raydp_llm.training.objectives import without_dropout  # Ray's data path: only here

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
def fill(model: HFModel, directory: Path, seed: int = 0) -> None:
    """Each of ``model``'s parameters (sharded: this worker's rows) read from ``directory``'s
    safetensors (a tied head is the embedding it is tied to), a LoRA adapter's drawn from
    ``seed`` (``lora.adapter_init``)."""
    files = TensorFiles.of(directory)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    prefix = model.net.base_model_prefix
    for name, param in model.net.named_parameters():
        mine = parallel.local(param)
        start, stop = (0, param.shape[0]) if mine is param else shard_rows(param.shape[0], rank,
                                                                            world)
        init = lora.adapter_init(name, param.shape, seed)
        if init is not None:
            mine.copy_(init[start:stop])
            continue
        key = files.find(lora.base_name(name), prefix)
        if key is None:
            raise weights_mismatch(directory, f"no tensor {name}")
        stored = files.tensors[key].shape
        if tuple(stored) != tuple(param.shape) or stop - start != len(mine):
            raise weights_mismatch(directory, f"{key} is {tuple(stored)}, the config makes it "
                                              f"{tuple(param.shape)}")
        files.read_rows(key, start, mine)
