"""Sharded training checkpoints (``train.strategy=fsdp``, and every LoRA run), written with
``torch.distributed.checkpoint`` (DCP): every worker writes its own shard of the weights and AdamW
state into ``shards/`` (``__<rank>_0.distcp``; rank 0 also the ``.metadata`` that maps them), and
Ray Train uploads each worker's directory into the same ``checkpoint_*``. Rank 0 adds what a full
checkpoint has but its weights: ``config.json`` and the tokenizer, ``train_state.json``, the RNG;
then ``complete.json``, which lists every worker's files (gathered), so a checkpoint that lost one
shard is damaged, skipped by ``resume=auto`` and refused by name.

Loading reshards: each worker asks DCP for its own shard of every tensor, whatever the number of
workers that wrote them, so a run continues on another number of workers. A LoRA run's shards hold
the adapters alone (the frozen base is the model the run starts from). ``export`` gathers the
final checkpoint into a full model directory, in one process (the driver): a Hugging Face directory
for a transformers family, with the adapter in ``adapter/`` and merged into the weights for LoRA.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from raydp_llm.checkpoint.layout import (
    SHARDS,
    STATE_JSON,
    STATE_TENSORS,
    TrainState,
    check_complete,
)
from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.core import integrity
from raydp_llm.core.model_config import HFConfig, LlamaConfig, ModelConfig, uses_lora
from raydp_llm.core.storage import S3Options, whole_or_absent
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.factory import build_model
from raydp_llm.models.files import WEIGHTS_FILE, is_hf_dir
from raydp_llm.models.hf import (
    HFModel,
    empty_model,
    empty_net,
    pretrained_dir,
    save_hf_dir,
)
from raydp_llm.models.lora import ADAPTER_DIR, has_adapters, merged, save_adapter
from raydp_llm.models.tensor_files import write_safetensors


def _lora(model: LanguageModel) -> bool:
    return isinstance(model, HFModel) and has_adapters(model.net)


def _dcp():
    """``torch.distributed.checkpoint`` and its state-dict helpers, imported when a sharded
    checkpoint is written or read: they import FSDP and DTensor, over a second of CPU that every
    worker and the driver would spend at start for runs that never shard."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict as state_dict

    return dcp, state_dict


def _options(model: LanguageModel):
    """LoRA: the frozen base is left out of the state (strict off: it is not loaded either)."""
    return _dcp()[1].StateDictOptions(ignore_frozen_params=_lora(model), strict=not _lora(model))


def _trained(model: LanguageModel, state: dict) -> dict:
    """``state`` without the frozen tensors in a LoRA run: ``ignore_frozen_params`` keeps a tied
    head (another name for the frozen embedding, vocabulary × width)."""
    if not _lora(model):
        return state
    names = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    return {k: v for k, v in state.items() if k in names}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save(directory: Path, model: LanguageModel, tokenizer: Tokenizer, optimizer,
         state: TrainState) -> Path:
    """This worker's part of a sharded checkpoint at ``state`` into ``directory`` (every worker
    calls it at once: DCP plans the save together)."""
    directory = Path(directory)
    dcp, sd = _dcp()
    model_state, optim_state = sd.get_state_dict(model, optimizer, options=_options(model))
    dcp.save({"model": _trained(model, model_state), "optim": optim_state},
             checkpoint_id=directory / SHARDS, no_dist=not dist.is_initialized())
    if _rank() == 0:
        save_model_dir(directory, model, tokenizer, seal=False, weights=False)
        (directory / STATE_JSON).write_text(json.dumps(state.to_json(), indent=2))
        torch.save({"torch_rng": torch.get_rng_state()}, directory / STATE_TENSORS)
    files = integrity.listing(directory)
    if dist.is_initialized():
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, files)
        files = {name: entry for part in every for name, entry in part.items()}
    if _rank() == 0:
        integrity.write_marker(directory, files)
    return directory


def load(directory: Path, model: LanguageModel, optimizer) -> TrainState:
    """This worker's shards of a complete sharded checkpoint into ``model`` and ``optimizer``
    (resharded for this number of workers), and the RNG; returns its state."""
    directory = Path(directory)
    check_complete(directory)
    options, (dcp, sd) = _options(model), _dcp()
    model_state, optim_state = sd.get_state_dict(model, optimizer, options=options)
    both = {"model": _trained(model, model_state), "optim": optim_state}
    dcp.load(both, checkpoint_id=directory / SHARDS, no_dist=not dist.is_initialized())
    sd.set_state_dict(model, optimizer, model_state_dict=both["model"],
                   optim_state_dict=both["optim"], options=options)
    torch.set_rng_state(torch.load(directory / STATE_TENSORS, weights_only=True)["torch_rng"])
    return TrainState.from_json(json.loads((directory / STATE_JSON).read_text()))


def export(checkpoint_dir: Path, directory: Path, cfg: ModelConfig, tokenizer: Tokenizer,
           s3: S3Options = S3Options()) -> Path:
    """The full model of a sharded checkpoint into a new, sealed ``directory`` (whole or absent).
    A transformers model without LoRA is written tensor by tensor (``_streamed``); else the model
    is built as the run built it (``cfg``), its trained tensors read from the shards, in this one
    process: the whole model once (4 bytes a parameter), plus, for LoRA, the merge."""
    check_complete(checkpoint_dir)
    if is_hf_dir(checkpoint_dir) and not uses_lora(cfg):
        return _streamed(Path(checkpoint_dir), Path(directory), cfg, tokenizer)
    model = build_model(cfg, s3)
    options, (dcp, sd) = _options(model), _dcp()
    trained = {"model": _trained(model, sd.get_model_state_dict(model, options=options))}
    dcp.load(trained, checkpoint_id=Path(checkpoint_dir) / SHARDS, no_dist=True)
    sd.set_model_state_dict(model, trained["model"], options=options)
    return _write_whole(model, Path(directory), tokenizer)


def gathered(model: LanguageModel, directory: Path, cfg: ModelConfig, tokenizer: Tokenizer,
             s3: S3Options = S3Options()) -> Path | None:
    """A live sharded run's ``model`` (FSDP's shards, or a LoRA model) as the model directory
    ``export`` would write of its checkpoint, on rank 0 (every worker calls it at once: FSDP gathers
    the shards into rank 0's memory, the whole model once); None on the other ranks. What
    ``train.eval_tasks`` scores while training: the workers' checkpoint parts lie on their own
    disks until Ray Train gathers them."""
    _, sd = _dcp()
    options = sd.StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 alone holds it
    state = sd.get_model_state_dict(model, options=options)
    if _rank() != 0:
        return None
    return _write_whole(_holding(state, cfg, s3), Path(directory), tokenizer)


def _holding(state: dict, cfg: ModelConfig, s3: S3Options) -> LanguageModel:
    """The model ``cfg`` describes, holding the whole ``state``. A transformers model is built
    on the meta device, its checkpoint never read (nor a fresh Llama drawn) only to be
    overwritten, and takes the state's tensors as its parameters: the model once in memory. With
    LoRA it takes copies: the merge adds to the weights in place, and a gathered tensor may be the
    live model's own (one worker's whole shard)."""
    if not isinstance(cfg, (HFConfig, LlamaConfig)):  # the own models: built in a moment
        whole = build_model(cfg, s3)
        whole.load_state_dict(state)
        return whole
    whole = empty_model(cfg, pretrained_dir(cfg, s3), seed=0)  # no values: the state's are taken
    if uses_lora(cfg):
        state = {name: tensor.clone() for name, tensor in state.items()}
    whole.load_state_dict(state, assign=True)
    if whole.net.config.tie_word_embeddings:  # the state holds the head and embedding apart
        whole.net.tie_weights()
    return whole


def _write_whole(model: LanguageModel, directory: Path, tokenizer: Tokenizer) -> Path:
    """``model`` into a new, sealed model ``directory`` (whole or absent); a LoRA model's adapter
    in ``adapter/`` and merged into the weights."""
    with whole_or_absent(directory) as tmp:
        if _lora(model):
            save_adapter(model.net, tmp / ADAPTER_DIR)
            model.net = merged(model.net)
        save_model_dir(tmp, model, tokenizer)
    return directory


def _streamed(checkpoint_dir: Path, directory: Path, cfg: ModelConfig,
              tokenizer: Tokenizer) -> Path:
    """A transformers model's sharded checkpoint as a Hugging Face directory, one tensor at a
    time: each read whole from the shards (DCP reads only that tensor's pieces) and appended to
    the safetensors file, so the process holds one tensor, never the model. The names and their
    order are save_pretrained's: the model's state, a tied head left out."""
    dcp, _ = _dcp()
    shards = checkpoint_dir / SHARDS
    stored = dcp.FileSystemReader(shards).read_metadata().state_dict_metadata
    net = empty_net(checkpoint_dir)  # on the meta device: names and shapes only
    shapes = {}
    for name in _saved_names(net):
        entry = stored[f"model.net.{name}"]
        shapes[name] = (entry.properties.dtype, tuple(entry.size))

    def tensors():
        for name, (dtype, shape) in shapes.items():
            tensor = torch.empty(shape, dtype=dtype)
            dcp.load({"model": {f"net.{name}": tensor}}, checkpoint_id=shards, no_dist=True)
            yield name, tensor

    with whole_or_absent(directory) as tmp:
        save_hf_dir(tmp, HFModel(net, cfg), tokenizer, weights=False)
        write_safetensors(tmp / WEIGHTS_FILE, shapes, tensors())
        integrity.seal(tmp)
    return directory


def _saved_names(net) -> list[str]:
    """The tensors save_pretrained writes: the state's, each once (a tied head is the embedding,
    written under the embedding's name)."""
    seen, names = set(), []
    for name, tensor in net.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            names.append(name)
    return names
