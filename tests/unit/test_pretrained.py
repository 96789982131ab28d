"""transformers' families behind the model interface, no engines: tiny Llama (tied and untied,
GQA), Qwen2 (qkv bias, ids above 65,535), Mistral and GPT-2 checkpoints built here. Each loads
with its own tokenizer as AutoTokenizer builds it, generates greedily as transformers does, is
fine-tuned by the plain-torch loop, exported as a Hugging Face directory and reloaded with the same
logits; model=llama from scratch too. Bad model directories are one line."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import hf_models
from helpers.chunks import chunked
from helpers.configs import make_config
from helpers.hf_models import HF_BIG_IDS
from helpers.paths import ROOT
from helpers.tiny_loop import Reports
from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.checkpoint.model_dir import export_model_dir, load_model_dir
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.core.model_config import HFConfig, LlamaConfig
from raydp_llm.core.tokenizer import (
    CharTokenizer,
    load_tokenizer,
    pretrained_tokenizer,
    train_bpe,
)
from raydp_llm.data import windows
from raydp_llm.data.stream import Sampling, SplitChunks, steps_per_epoch
from raydp_llm.models.hf import read_hf_config, resolved
from raydp_llm.training.objectives import Placement
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.worker.loop import TrainLoop
from raydp_llm.training.worker.worker import Worker

CPU = Placement(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
BLOCK = 16


@pytest.fixture(scope="module")
def text(shakespeare) -> str:
    return shakespeare.read_text()[:120_000]


@pytest.fixture(scope="module")
def families(hf_families) -> dict[str, Path]:
    return hf_families


@pytest.mark.parametrize("family", hf_models.FAMILIES)
def test_the_tokenizer_is_autotokenizers_and_generation_is_transformers(families, family, text):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = families[family]
    model, tokenizer = load_model_dir(directory)
    auto = AutoTokenizer.from_pretrained(directory)
    sample = text[100_000:104_000]
    assert tokenizer.encode(sample).tolist() == auto(sample, add_special_tokens=False).input_ids
    assert tokenizer.separator() == [auto.eos_token_id]  # none of them adds a BOS to each text
    reference = AutoModelForCausalLM.from_pretrained(directory).eval()
    x = torch.as_tensor(tokenizer.encode(sample[:300]).astype(np.int64)[None, :40])
    assert torch.allclose(model(x)[0], reference(input_ids=x).logits, atol=1e-5)
    ours = model.generate(x, 24, temperature=0)
    theirs = reference.generate(x, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert torch.equal(ours, theirs)


def test_ids_above_65535_are_stored_as_uint32(families, text):
    tokenizer = pretrained_tokenizer(families["qwen2"])
    ids = tokenizer.encode(text[:5000])
    assert tokenizer.token_dtype == np.uint32 and ids.dtype == np.uint32
    assert ids.min() >= HF_BIG_IDS and tokenizer.vocab_size > 1 << 16
    assert load_tokenizer(families["qwen2"]).encode(text[:5000]).tolist() == ids.tolist()


def spec_for(cfg, tokenizer, data, max_steps: int = 4) -> TrainSpec:
    from raydp_llm.core.config import OptimSettings, TrainSettings

    sampling = {"train": Sampling(BLOCK, BLOCK), "val": Sampling(BLOCK, BLOCK)}
    return TrainSpec(
        model=cfg, optim=OptimSettings(lr=3e-3, min_lr=3e-4, warmup_steps=1),
        train=TrainSettings(batch_size=4, max_steps=max_steps, eval_interval=2, eval_batches=2,
                            checkpoint_interval=4, cpus_per_worker=1),
        seed=3, tokenizer_json=tokenizer.to_json(), token_dtype=tokenizer.token_dtype.name,
        chars_per_token=2.0, sampling=sampling,
        steps_per_epoch=steps_per_epoch(sampling["train"].windows(data["train"].index), 4),
        max_steps=max_steps, fingerprint="f" * 20)


def stream_data(tokenizer, text: str) -> dict:
    stream = tokenizer.encode(text)
    n = len(stream)
    segments_of = functools.partial(windows.segments, n=n, split="tail", val_fraction=0.25,
                                    seed=0, segment_tokens=8192)
    index, sources = chunked(stream, [n // 2, n - n // 2], segments_of, 256, 64)
    return {name: SplitChunks(sources[name], index[name]) for name in index}


def fine_tune(cfg, tokenizer, text: str, out: Path) -> tuple[Worker, Path]:
    """A few optimizer steps of the plain-torch loop; the final checkpoint exported as model/."""
    data = stream_data(tokenizer, text)
    worker = Worker(spec_for(cfg, tokenizer, data), data, CPU)
    reports = Reports(out)
    assert TrainLoop(worker, TrainState(), reports).run()
    return worker, export_model_dir(reports.checkpoints[4], out / "model")


@pytest.mark.parametrize("family", hf_models.FAMILIES)
def test_a_fine_tuned_checkpoint_exports_and_reloads_with_the_same_logits(families, family, text,
                                                                         tmp_path):
    from transformers import AutoModelForCausalLM

    tokenizer = pretrained_tokenizer(families[family])
    cfg = resolved(HFConfig(path=str(families[family]), block_size=BLOCK),
                   read_hf_config(str(families[family]), "model.path"), tokenizer)
    worker, model_dir = fine_tune(cfg, tokenizer, text[:6000], tmp_path)
    start = AutoModelForCausalLM.from_pretrained(families[family])
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    x = torch.as_tensor(tokenizer.encode(text[7000:7400]).astype(np.int64)[None, :BLOCK])
    worker.model.eval()
    trained_logits = worker.model(x)[0]
    assert torch.allclose(trained_logits, reloaded(input_ids=x).logits, atol=1e-5)
    assert not torch.allclose(trained_logits, start(input_ids=x).logits, atol=1e-3)  # it trained
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "complete.json"} <= {p.name for p in model_dir.iterdir()}
    assert pretrained_tokenizer(model_dir).to_json() == tokenizer.to_json()
    # the block it was trained with, not its 128 positions: what evaluate and generate read
    assert load_model_dir(model_dir)[0].config.block_size == BLOCK
    assert load_model_dir(families[family])[0].config.block_size == 128  # trained elsewhere


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_llama_from_scratch_is_a_hugging_face_directory_with_the_etls_ids(text, tmp_path, kind):
    from transformers import AutoTokenizer

    if kind == "char":
        tokenizer = CharTokenizer(text[:6000])
    else:
        tokenizer = train_bpe([text[i:i + 1000] for i in range(0, 50_000, 1000)], 300)
    cfg = LlamaConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=1, n_head=4,
                      n_kv_head=2, n_embd=32)
    _, model_dir = fine_tune(cfg, tokenizer, text[:6000], tmp_path)
    auto = AutoTokenizer.from_pretrained(model_dir)
    assert auto(text[:500], add_special_tokens=False).input_ids == tokenizer.encode(
        text[:500]).tolist()
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["num_key_value_heads"], config["max_position_embeddings"]
            ) == ("llama", 2, BLOCK)
    model, reloaded = load_model_dir(model_dir)
    assert reloaded.encode(text[:500]).tolist() == tokenizer.encode(text[:500]).tolist()
    assert model.config.block_size == BLOCK


def test_generate_and_export_on_a_directory_trained_elsewhere(families):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = families["mistral"]
    p = subprocess.run([sys.executable, "-m", "raydp_llm.generate", f"model_dir={directory}",
                        "prompt=ROMEO:", "temperature=0", "max_new_tokens=12"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    auto = AutoTokenizer.from_pretrained(directory)
    x = torch.tensor([auto("ROMEO:", add_special_tokens=False).input_ids])
    out = AutoModelForCausalLM.from_pretrained(directory).generate(
        x, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert p.stdout.rstrip("\n") == auto.decode(out[0])


# ---- bad input: one line, before any engine --------------------------------------------------


def hf_settings(path, *more: str):
    return make_config("model=hf", f"model.path={path}", *more)


def test_model_hf_takes_its_block_size_and_vocabulary_from_the_directory(families):
    settings = hf_settings(families["gpt2"])
    assert (settings.model.block_size, settings.model.vocab_size) == (128, 401)
    assert Path(settings.tokenizer.path) == families["gpt2"]
    assert check_inputs(settings).files
    assert hf_settings(families["llama"], "model.block_size=32").model.block_size == 32


def test_model_hf_refuses_what_it_cannot_train(families, tmp_path):
    with pytest.raises(InputError, match=r"^model.path is missing: model=hf trains"):
        make_config("model=hf")
    with pytest.raises(InputError, match=r"no config.json there; give a directory that "
                                         r"save_pretrained wrote"):
        hf_settings(tmp_path)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(families["llama"], no_weights,
                    ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(InputError, match=r"no \*.safetensors weights there"):
        hf_settings(no_weights)
    with pytest.raises(InputError, match=r"model.block_size=256 is above the model's "
                                         r"max_position_embeddings=128"):
        hf_settings(families["llama"], "model.block_size=256")
    with pytest.raises(InputError, match=r"model=hf brings its tokenizer"):
        hf_settings(families["llama"], "tokenizer.path=/x/tokenizer.json")


@pytest.mark.parametrize("model_type,what", [("bert", "not a decoder-only"),
                                             ("t5", "not a decoder-only"),
                                             ("bart", "not a decoder-only")])
def test_encoder_and_seq2seq_models_are_refused(families, tmp_path, model_type, what):
    other = tmp_path / model_type
    shutil.copytree(families["llama"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"model_type": model_type}))
    with pytest.raises(InputError, match=f"model_type '{model_type}' is (an encoder-decoder|"
                                         f"{what})"):
        hf_settings(other)


def test_a_tokenizer_past_the_embedding_is_refused(families, tmp_path):
    small = tmp_path / "small"
    shutil.copytree(families["llama"], small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps(config | {"vocab_size": 100}))
    with pytest.raises(InputError, match=r"the tokenizer has ids up to 402 but the model only 100 "
                                         r"token embeddings"):
        hf_settings(small)


def test_the_command_line_says_one_line_and_exits_2(families, tmp_path):
    p = subprocess.run([sys.executable, "-m", "raydp_llm.train", "model=hf",
                        f"model.path={families['llama']}", "model.block_size=4096"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2
    said = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert len(said) == 1 and "max_position_embeddings=128" in said[0], said


@pytest.mark.parametrize("family,lora", [("gpt2", 0), ("llama_untied", 0), ("llama", 4)])
def test_a_gathered_state_becomes_the_model_directory_without_reading_the_base(families, family,
                                                                              lora, tmp_path):
    """``sharded.gathered`` (what ``train.eval_tasks`` scores under FSDP) writes the state it
    gathered, built on the meta device: the base directory's weights are not read (here they are
    gone), a tied head stays tied, LoRA is merged: the same logits as the live model."""
    from raydp_llm.checkpoint import sharded
    from raydp_llm.core.model_config import LoraSettings
    from raydp_llm.models.factory import build_model

    tokenizer = pretrained_tokenizer(families[family])
    cfg = resolved(HFConfig(path=str(families[family]), block_size=BLOCK,
                            lora=LoraSettings(r=lora)),
                   read_hf_config(str(families[family]), "model.path"), tokenizer)
    torch.manual_seed(0)
    live = build_model(cfg).eval()
    with torch.no_grad():  # trained, as a run's weights are: adapters and all differ from the base
        for p in live.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    base = tmp_path / "base"
    shutil.copytree(families[family], base)
    (base / "model.safetensors").unlink()  # only its config may be read
    written = sharded.gathered(live, tmp_path / "model", replace(cfg, path=str(base)), tokenizer)
    reloaded, _ = load_model_dir(written)
    ids = tokenizer.encode(" ".join(["Romeo, Romeo"] * 8)).astype(np.int64)
    x = torch.as_tensor(ids[None, :BLOCK])
    assert torch.allclose(live(x)[0], reloaded.eval()(x)[0], atol=1e-4)
    net = reloaded.net
    tied = net.get_output_embeddings().weight is net.get_input_embeddings().weight
    assert tied == (family != "llama_untied")


def test_a_chat_tuned_llama_keeps_its_template_beside_it(text, tmp_path):
    """A chat run's model=llama directory holds the template it was tuned in (chat_template.jinja,
    as transformers 5 reads it): generate chat=true, evaluate and GRPO render prompts with it."""
    from transformers import AutoTokenizer

    from raydp_llm.checkpoint.model_dir import save_model_dir
    from raydp_llm.data.chat.template import CHATML, model_template
    from raydp_llm.models.factory import build_model

    tokenizer = CharTokenizer(text[:6000])
    tokenizer.chat_template = CHATML
    cfg = LlamaConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=1, n_head=4,
                      n_kv_head=2, n_embd=32)
    model_dir = tmp_path / "model"
    save_model_dir(model_dir, build_model(cfg), tokenizer)
    assert model_template(model_dir).text == CHATML
    assert AutoTokenizer.from_pretrained(model_dir).chat_template == CHATML
