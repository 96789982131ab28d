"""The Hugging Face GPT-2 format both ways, against the real ``transformers``: small random models
built here (the machines have no model hub), logits compared in float32, greedy generation
compared token for token."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.configs import make_config
from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.cli.export import main as export_main
from raydp_llm.core.config import GPTConfig, LSTMConfig
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import EOD, CharTokenizer, train_bpe
from raydp_llm.models.files import NotExpressible, read_hf_tokenizer
from raydp_llm.models.gpt import GPT
from raydp_llm.models.gpt2 import gpt2_shape, load_gpt2_weights, read_gpt2_config, read_gpt2_tensors
from raydp_llm.models.lstm import LSTMLM

transformers = pytest.importorskip("transformers")

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
TOL = 1e-4  # max abs logit difference, float32
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Biases and norms away from their init: an import or export that drops one then fails."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def hf_gpt2(directory, vocab_size: int, eod_id: int, **config) -> None:
    """A random GPT2LMHeadModel (GPT-2's defaults: gelu_new, biases, tied head) saved to
    ``directory`` as save_pretrained writes it."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=32, n_layer=2,
                                  n_head=4, bos_token_id=eod_id, eos_token_id=eod_id, **config)
    perturbed(transformers.GPT2LMHeadModel(cfg)).save_pretrained(directory)


def imported(directory) -> GPT:
    config, tensors = read_gpt2_config(directory), read_gpt2_tensors(directory)
    model = GPT(GPTConfig(**gpt2_shape(directory, config, tensors)))
    load_gpt2_weights(model, tensors, str(directory))
    return model.eval()


def their_logits(directory, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(ids).logits


def greedy_both(directory, ours: GPT, ids: torch.Tensor, new: int) -> tuple[list, list]:
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    out = theirs.generate(ids, max_new_tokens=new, do_sample=False,
                          attention_mask=torch.ones_like(ids), pad_token_id=0)
    return ours.generate(ids, new, temperature=0).tolist(), out.tolist()


def assert_matches_transformers(directory, ours: GPT, ids: torch.Tensor, prompt: int) -> None:
    """transformers' model in ``directory`` gives ``ours``' logits on ``ids`` and its greedy
    continuation of their first ``prompt`` tokens."""
    with torch.no_grad():
        diff = (ours(ids)[0] - their_logits(directory, ids)).abs().max().item()
    assert diff <= TOL
    mine, theirs = greedy_both(directory, ours, ids[:, :prompt], new=20)
    assert mine == theirs


def bpe_tokenizer():
    return train_bpe([[TEXT] * 20], vocab_size=300)


def test_an_imported_gpt2_computes_transformers_logits(tmp_path):
    tok = bpe_tokenizer()
    hf_gpt2(tmp_path, tok.vocab_size, tok.eod_id)
    ours = imported(tmp_path)
    assert ours.config.activation == "gelu_tanh" and ours.config.bias
    ids = torch.tensor([tok.encode(TEXT)[:32].tolist()])
    assert_matches_transformers(tmp_path, ours, ids, prompt=8)


@pytest.mark.parametrize("variant", [
    {},
    {"bias": True, "tie_weights": False},
    {"pos_embedding": "sinusoidal", "activation": "gelu_tanh"},
])
def test_export_then_transformers_then_import_round_trip(tmp_path, variant):
    """A char GPT of this project: exported, loaded by transformers (model and tokenizer, no custom
    code), the same logits, ids and greedy tokens; imported back, the same model again."""
    torch.manual_seed(1)
    tokenizer = CharTokenizer(TEXT)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=4, n_embd=32,
                    **variant)
    model = perturbed(GPT(cfg)).eval()
    save_model_dir(tmp_path / "model", model, tokenizer)
    out = tmp_path / "hf"
    assert export_main([f"model_dir={tmp_path / 'model'}", f"out={out}"]) == 0

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok(TEXT)["input_ids"] == tokenizer.encode(TEXT).tolist()
    assert hf_tok.decode(tokenizer.encode(TEXT).tolist()) == TEXT
    assert hf_tok.eos_token == EOD and hf_tok.eos_token_id == tokenizer.eod_id
    ids = torch.tensor([tokenizer.encode(TEXT)[:32].tolist()])
    assert_matches_transformers(out, model, ids, prompt=6)

    back = imported(out)
    assert back.config == cfg
    assert read_hf_tokenizer(out).to_json() == tokenizer.to_json()
    with torch.no_grad():
        assert torch.equal(back(ids)[0], model(ids)[0])


def test_a_bpe_tokenizer_exports_as_itself(tmp_path):
    tokenizer = bpe_tokenizer()
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16)
    save_model_dir(tmp_path / "model", GPT(cfg), tokenizer)
    assert export_main([f"model_dir={tmp_path / 'model'}", f"out={tmp_path / 'hf'}"]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = TEXT + EOD + "Ay, there's the rub"
    assert hf_tok(text)["input_ids"] == tokenizer.tok.encode(text).ids
    assert read_hf_tokenizer(tmp_path / "hf").to_json() == tokenizer.to_json()


def test_an_lstm_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    tokenizer = CharTokenizer(TEXT)
    lstm = LSTMLM(LSTMConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_embd=16))
    save_model_dir(tmp_path / "model", lstm, tokenizer)
    assert export_main([f"model_dir={tmp_path / 'model'}", f"out={tmp_path / 'hf'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lstm model has no Hugging Face GPT-2 equivalent" in err
    assert not (tmp_path / "hf").exists() and list(tmp_path.iterdir()) == [tmp_path / "model"]


def test_export_never_overwrites(tmp_path, capsys):
    tokenizer = CharTokenizer(TEXT)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)
    save_model_dir(tmp_path / "model", GPT(cfg), tokenizer)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep me")
    assert export_main([f"model_dir={tmp_path / 'model'}", f"out={tmp_path / 'hf'}"]) == 1
    assert "is not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "hf" / "mine.txt").read_text() == "keep me"
    assert export_main([f"model_dir={tmp_path / 'model'}"]) == 2  # out is required


@pytest.mark.parametrize("config, message", [
    ({"activation_function": "relu"}, "activation_function=relu"),
    ({"n_inner": 64}, "n_inner=64"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06"),
])
def test_gpt2_variants_this_gpt_cannot_compute_are_refused(tmp_path, config, message):
    hf_gpt2(tmp_path, 50, 49, **config)
    with pytest.raises(NotExpressible, match=message):
        imported(tmp_path)


def test_import_needs_safetensors_and_gpt2(tmp_path):
    hf_gpt2(tmp_path, 50, 49)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(InputError, match="no model.safetensors"):
        read_gpt2_tensors(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
    with pytest.raises(NotExpressible, match="model_type 'llama' is not gpt2"):
        read_gpt2_config(tmp_path)


def test_init_from_gives_the_shape_and_tokenizer_and_checks_what_was_given(tmp_path):
    tok = bpe_tokenizer()
    hf_gpt2(tmp_path, tok.vocab_size, tok.eod_id)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok.tok, eos_token=EOD).save_pretrained(
        tmp_path)
    cfg = make_config(f"model.init_from={tmp_path}", "model.block_size=16", "model.n_layer=2")
    model = cfg.model
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size, model.vocab_size) == (
        2, 4, 32, 16, tok.vocab_size)  # block_size: given, shorter than its 32 positions
    assert model.bias and model.tie_weights and model.activation == "gelu_tanh"
    assert cfg.tokenizer.path == str(tmp_path / "tokenizer.json")
    for given, message in [("model.n_embd=64", "has n_embd=32 but model.n_embd=64 was given"),
                           ("model.block_size=64", "has block_size=32 but model.block_size=64"),
                           ("tokenizer.path=/x.json", "brings its tokenizer but tokenizer.path")]:
        with pytest.raises(InputError, match=message):
            make_config(f"model.init_from={tmp_path}", given)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="no tokenizer.json"):
        make_config(f"model.init_from={tmp_path}")
