"""A transformers checkpoint loaded shard by shard under FSDP (training/worker/sharded_start.py), in
gloo
processes (helpers/gloo.py): each worker's shards are its slices of the whole model to the bit,
from files in bfloat16, for a tied and an untied Llama, Qwen2 (biases) and GPT-2 (its own layout),
and with LoRA adapters, and a fresh Llama's drawn weights; training after the sharded load follows
the whole load's curve, for DPO and LoRA too; a worker's rows are FSDP2's."""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from helpers import hf_models
from helpers.gloo import placement, run, spawned
from helpers.pairs import pair_data, pair_spec
from helpers.tiny_loop import BLOCK, tiny_data
from helpers.tiny_loop import spec as loop_spec
from raydp_llm.checkpoint import sharded
from raydp_llm.checkpoint.layout import SHARDS
from raydp_llm.core import integrity
from raydp_llm.core.model_config import HFConfig, LlamaConfig, LoraSettings
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.models.tensor_files import TensorFiles, write_safetensors
from raydp_llm.training.worker import sharded_start
from raydp_llm.training.worker.starting import starting_model
from raydp_llm.training.worker.worker import Worker

# two gloo worker processes per layout (helpers/gloo.py): 25-50 s of module set-up on 2 cores
pytestmark = pytest.mark.slow

FAMILIES = ("llama", "llama_untied", "qwen2", "gpt2")
TEXTS = ["Romeo, Romeo, wherefore art thou Romeo?", "A rose by any other name."] * 20
WORLD = 2


def _in_bf16(directory: Path) -> None:
    """The directory's weights rewritten in bfloat16 (streamed: write_safetensors)."""
    from safetensors.torch import load_file

    path = directory / "model.safetensors"
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(path).items()}
    write_safetensors(path, {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()},
                      tensors.items())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Each family's tiny checkpoint, in bfloat16 files; Llama's vocabulary one id more (an odd
    number of rows: shards of unequal size)."""
    root = tmp_path_factory.mktemp("sharded_start")
    dirs = {}
    for family in FAMILIES:
        dirs[family] = hf_models.build(family, root / family, TEXTS,
                                       offset=int(family == "llama"))
        _in_bf16(dirs[family])
    return dirs


def hf_spec(spec, directory: Path, **train):
    """``spec`` (a tiny loop's, or DPO's) on the transformers model in ``directory``, FSDP."""
    files = TensorFiles.of(directory)
    table = files.find("model.embed_tokens.weight", "") or files.find("transformer.wte.weight",
                                                                        "transformer")
    vocab = files.tensors[table].shape[0]
    model = HFConfig(path=str(directory), block_size=BLOCK, vocab_size=vocab)
    chars = CharTokenizer("abcdefghijklmnop")  # 16 ids: a Hugging Face tokenizer can be written
    return replace(spec, model=model, train=replace(spec.train, strategy="fsdp", **train),
                   tokenizer_json=chars.to_json())


def _shards(rank, world, specs: dict) -> dict:
    """Every worker's shards and buffers of each family's sharded load, gathered to rank 0."""
    mine = {}
    for family, spec in specs.items():
        model = sharded_start.sharded_model(spec, torch.device("cpu"))
        mine[family] = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
        mine[family] |= {f"buffer:{n}": b.clone() for n, b in model.named_buffers()}
    every = [None] * world
    dist.all_gather_object(every, mine)
    return {"shards": every}


def _curves(rank, world, specs: dict, data, pairs, keep: Path) -> dict:
    """The same runs loaded shard by shard and loaded whole (then sharded): ``specs``' lm and
    lora runs, and dpo's first step."""
    lm, lora = specs["lm"], specs["lora"]
    worker = Worker(specs["dpo"], pairs, placement(rank, world))
    first = worker.train_step(next(worker.data.steps(epoch=0, first_step=0)), lr=1e-3)
    out = {"sharded": run(lm, data, rank, world, keep / "sharded"), "dpo_first_loss": first.loss,
           "lora_sharded": run(lora, data, rank, world, keep / "lora_sharded")}
    with mock.patch.object(sharded_start, "applies", return_value=False):
        out["whole"] = run(lm, data, rank, world, keep / "whole")
        out["lora_whole"] = run(lora, data, rank, world, keep / "lora_whole")
    return out


def test_each_workers_shards_are_its_slices_of_the_whole_model_to_the_bit(checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    base = loop_spec(tiny_data(), max_steps=4)
    specs = {f: hf_spec(base, d) for f, d in checkpoints.items()}
    specs["lora"] = lora_spec(base, checkpoints["llama"])
    specs["fresh"] = fresh_spec(base)
    shards = spawned(WORLD, functools.partial(_shards, specs=specs), tmp_path)["shards"]
    for built in ("lora", "fresh"):
        _assert_shards_are_the_whole_builds(shards, built, specs[built])
    for family, directory in checkpoints.items():
        whole = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        for name, param in whole.named_parameters():
            pieces = [shards[r][family][f"net.{name}"] for r in range(WORLD)]
            assert all(p.dtype == torch.float32 for p in pieces)
            assert torch.equal(torch.cat(pieces), param.detach()), (family, name)
        for name, buffer in whole.named_buffers():
            assert torch.equal(shards[0][family][f"buffer:net.{name}"], buffer), (family, name)
    # unequal shards: an odd number of rows over 2 workers
    rows = [shards[r]["llama"]["net.model.embed_tokens.weight"].shape[0] for r in range(WORLD)]
    assert rows[0] == rows[1] + 1


def _assert_shards_are_the_whole_builds(shards: list, built: str, spec) -> None:
    """Built shard by shard (LoRA: the frozen base from the files, the adapters drawn from the
    seed; a fresh Llama: every tensor drawn from the seed), each worker's rows are exactly those
    of the model every worker built whole before, and the buffers its buffers."""
    whole = starting_model(spec)
    drawn = 0
    for name, param in whole.named_parameters():
        pieces = [shards[r][built][name] for r in range(WORLD)]
        assert torch.equal(torch.cat(pieces), param.detach()), (built, name)
        drawn += bool(param.std() > 0) if ".lora_A." in name or built == "fresh" else 0
    for name, buffer in whole.named_buffers():
        assert torch.equal(shards[0][built][f"buffer:{name}"], buffer), (built, name)
    assert drawn >= 4  # drawn, not left empty


def fresh_spec(spec):
    """``spec`` on a fresh 2-layer Llama (GQA, untied, an odd vocabulary: shards of unequal
    size), FSDP."""
    model = LlamaConfig(vocab_size=17, block_size=BLOCK, n_layer=2, n_head=4, n_kv_head=2,
                        n_embd=16, intermediate_size=32, tie_weights=False)
    chars = CharTokenizer("abcdefghijklmnopq")
    return replace(spec, model=model, train=replace(spec.train, strategy="fsdp"),
                   tokenizer_json=chars.to_json())


def lora_spec(spec, directory: Path):
    """``spec`` on ``directory``'s model with rank-4 LoRA adapters, FSDP."""
    spec = hf_spec(spec, directory)
    return replace(spec, model=replace(spec.model, lora=LoraSettings(r=4, alpha=32.0)))


@pytest.fixture(scope="module")
def runs(checkpoints, tmp_path_factory) -> dict:
    """On 2 workers: an untied Llama's run loaded shard by shard and loaded whole (its checkpoints
    kept), and a DPO step on Qwen2 loaded shard by shard."""
    keep = tmp_path_factory.mktemp("runs")
    data, pairs = tiny_data(), pair_data()
    lm = hf_spec(loop_spec(data, max_steps=8), checkpoints["llama_untied"])
    dpo = hf_spec(pair_spec(pairs), checkpoints["qwen2"])
    lora = lora_spec(loop_spec(data, max_steps=8), checkpoints["llama"])
    job = functools.partial(_curves, specs={"lm": lm, "dpo": dpo, "lora": lora}, data=data,
                            pairs=pairs, keep=keep)
    return {**spawned(WORLD, job, keep), "keep": keep, "spec": lm}


def test_training_after_a_sharded_load_follows_the_whole_loads_curve(runs):
    assert len(runs["sharded"]) >= 2 and runs["sharded"] == runs["whole"]
    assert len(runs["lora_sharded"]) >= 2 and runs["lora_sharded"] == runs["lora_whole"]
    # the DPO reference, loaded shard by shard too, is the policy at the first step
    assert runs["dpo_first_loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_a_sharded_checkpoint_is_exported_tensor_by_tensor(runs, tmp_path):
    """The export holds one tensor at a time; its file holds the checkpoint's tensors exactly
    (against torch's own conversion of the whole checkpoint) and transformers loads it whole."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    spec = runs["spec"]
    last = max((runs["keep"] / "sharded").glob("step_*"), key=lambda p: int(p.name[5:]))
    out = sharded.export(last, tmp_path / "model", spec.model, spec.tokenizer())
    dcp_to_torch_save(last / SHARDS, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)["model"]
    written = load_file(out / "model.safetensors")
    assert {f"net.{k}" for k in written} == set(whole)  # untied: every tensor
    for name, tensor in written.items():
        assert torch.equal(tensor, whole[f"net.{name}"]), name
    net, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert integrity.problem(out) is None


def test_a_worker_reads_only_its_rows():
    assert [sharded_start.shard_rows(401, r, 2) for r in range(2)] == [(0, 201), (201, 401)]
    assert [sharded_start.shard_rows(5, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 5),
                                                                     (5, 5)]


def test_weights_that_do_not_fit_the_config_are_one_line(checkpoints, tmp_path):
    import json
    import shutil

    from raydp_llm.core.errors import InputError
    from raydp_llm.models.hf import HFModel, empty_net

    narrower = shutil.copytree(checkpoints["llama_untied"], tmp_path / "narrower")
    config = json.loads((narrower / "config.json").read_text())
    (narrower / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    model = HFModel(empty_net(narrower), HFConfig(path=str(narrower)))
    model.to_empty(device="cpu")
    with pytest.raises(InputError, match=r"narrower: the weights do not fit the model's "
                                         r"config.json \(model.layers.0.mlp.gate_proj.weight is "
                                         r"\(64, 32\), the config makes it \(48, 32\)\); give"):
        sharded_start.fill(model, narrower)
