"""LoRA (peft) on a tiny local Llama, in one process through the project's Worker and TrainLoop:
only the adapters train and are checkpointed, a resumed run is exact, and the export is the merged
model (transformers loads it without peft) beside the adapter."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from helpers.tiny_loop import CPU, Reports, tiny_data
from helpers.tiny_loop import spec as loop_spec
from raydp_llm.checkpoint import sharded
from raydp_llm.checkpoint.layout import SHARDS, TrainState
from raydp_llm.core.config import HFConfig
from raydp_llm.core.model_config import LoraSettings
from raydp_llm.core.tokenizer import load_tokenizer
from raydp_llm.models.lora import ADAPTER_DIR
from raydp_llm.training.driver.run import trainable_params
from raydp_llm.training.worker.loop import TrainLoop
from raydp_llm.training.worker.worker import Worker


@pytest.fixture(scope="module")
def data():
    """test_loop's tiny corpus (helpers.tiny_loop.tiny_data)."""
    return tiny_data()


def spec(data, base: Path, **lora):
    """test_loop's run (6 steps, checkpoints at 4 and 6) on a tiny Llama with rank-4 adapters."""
    s = loop_spec(data, max_steps=6)
    model = HFConfig(path=str(base), block_size=8, vocab_size=None,
                     lora=LoraSettings(r=4, alpha=8.0, **lora))
    return replace(s, model=model, tokenizer_json=load_tokenizer(base).to_json())


@pytest.fixture(scope="module")
def lora_run(data, hf_families, tmp_path_factory):
    """The run, its checkpoints and rows, and a second run resumed from its step-4 checkpoint."""
    keep = tmp_path_factory.mktemp("lora")
    s = spec(data, hf_families["llama"])
    worker = Worker(s, data, CPU)
    reports = Reports(keep)
    TrainLoop(worker, TrainState(), reports).run()
    resumed_worker = Worker(s, data, CPU)
    state = resumed_worker.load_checkpoint(reports.checkpoints[4])
    resumed = Reports(keep / "resumed")
    (keep / "resumed").mkdir()
    TrainLoop(resumed_worker, state, resumed).run()
    return {"spec": s, "worker": worker, "rows": reports.rows, "checkpoints": reports.checkpoints,
            "resumed_rows": resumed.rows, "keep": keep}


def test_only_the_adapters_train(lora_run, hf_families):
    from transformers import AutoModelForCausalLM

    model = lora_run["worker"].model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # every projection of the attention and the MLP is adapted, not the head
    adapted = {n.split(".")[-4] for n in trainable if n.endswith("lora_A.default.weight")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    base = AutoModelForCausalLM.from_pretrained(hf_families["llama"])
    frozen = dict(model.net.get_base_model().named_parameters())
    for name, p in base.named_parameters():  # the base weights did not move
        assert torch.equal(frozen[name.replace(".weight", ".base_layer.weight")]
                           if name not in frozen else frozen[name], p), name


def test_the_checkpoint_holds_the_adapters_alone(lora_run):
    """Its shards hold the adapters and their two AdamW moments, nothing of the frozen base (not
    even a tied head)."""
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = lora_run["checkpoints"][6]
    tensors = FileSystemReader(str(ckpt / SHARDS)).read_metadata().state_dict_metadata
    numel = {k: math.prod(v.size) for k, v in tensors.items() if hasattr(v, "size")}
    model_keys = [k for k in numel if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), model_keys
    trained = sum(p.numel() for p in lora_run["worker"].model.parameters() if p.requires_grad)
    assert sum(numel[k] for k in model_keys) == trained
    moments = sum(n for k, n in numel.items() if k.endswith(("exp_avg", "exp_avg_sq")))
    assert moments == 2 * trained


def test_a_resumed_lora_run_is_exact(lora_run):
    rows, resumed = lora_run["rows"], lora_run["resumed_rows"]
    assert [r["step"] for r in resumed] == [6]
    for key in ("train_loss", "val_loss", "grad_norm"):
        assert resumed[-1][key] == rows[-1][key], key


def test_the_export_is_the_merged_model_and_the_adapter(lora_run, tmp_path):
    """model/ loads in transformers without peft and computes what the trained peft model does;
    model/adapter/ is the PEFT adapter, which peft puts back on the base."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    s, worker = lora_run["spec"], lora_run["worker"]
    out = sharded.export(lora_run["checkpoints"][6], tmp_path / "model", s.model,
                         load_tokenizer(Path(s.model.path)))
    assert json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())["r"] == 4
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    x = torch.arange(8)[None]
    worker.model.eval()
    with torch.no_grad():
        want = worker.model.net(input_ids=x).logits
        assert (merged(input_ids=x).logits - want).abs().max() < 1e-4
        base = AutoModelForCausalLM.from_pretrained(s.model.path)
        again = PeftModel.from_pretrained(base, out / ADAPTER_DIR)
        assert (again(input_ids=x).logits - want).abs().max() < 1e-4
    adapter = trainable_params(merged, s.model, out)
    assert adapter == sum(p.numel() for p in worker.model.parameters() if p.requires_grad)
    assert adapter < sum(p.numel() for p in merged.parameters()) / 5


def test_adapters_are_drawn_from_the_runs_seed_whatever_the_processs_random_state(hf_families):
    """A command-line driver never seeds torch: its ``initial_seed`` is a random 64-bit number.
    The adapters come from the seed given (any size), the same whatever torch's global state."""
    from raydp_llm.models.factory import build_model

    cfg = HFConfig(path=str(hf_families["llama"]), block_size=8, vocab_size=None,
                   lora=LoraSettings(r=4, alpha=8.0))

    def adapters(process_seed: int, run_seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(process_seed)
        net = build_model(cfg, seed=run_seed).net
        return {n: p.detach().clone() for n, p in net.named_parameters() if "lora_A" in n}

    unseeded = adapters(2**64 - 1, 3)  # as large as an unseeded process's initial_seed gets
    assert unseeded and all(torch.equal(t, adapters(0, 3)[n]) for n, t in unseeded.items())
    assert not torch.equal(next(iter(unseeded.values())),
                           next(iter(adapters(0, 4).values())))  # the run's seed draws them
    huge = adapters(0, 2**70 + 5)  # a run seed past 64 bits draws too
    assert all(t.abs().sum() > 0 for t in huge.values())
