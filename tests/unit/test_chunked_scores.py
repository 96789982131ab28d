"""The targets' scores without the whole logits (``models/base.token_scores``, issue 69): every
model family's chunked cross-entropy, hits and gradients equal those of its whole (B, T, V) logits
(fp32, rtol 1e-5), with a sampling temperature and ignored targets, in chunks of a few rows; no
tensor of the whole logits' size is ever made, forward or backward; a batch that counts nothing
still gives every weight its (zero) gradient, as DDP needs of every rank. The objectives built on
it (language modelling, chat, DPO, GRPO) are held to the same values by their own tests, and
through DDP and FSDP2 by test_gradients.py and test_fsdp.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers as tf
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.scores import whole_scores
from raydp_llm.core.config import GPTConfig, LSTMConfig
from raydp_llm.core.model_config import HFConfig, LoraSettings
from raydp_llm.core.tokenizer import pretrained_tokenizer
from raydp_llm.models import base
from raydp_llm.models import scores as chunks
from raydp_llm.models.gpt import GPT
from raydp_llm.models.hf import HFModel, load_net, read_hf_config, resolved
from raydp_llm.models.lora import add_adapters
from raydp_llm.models.lstm import LSTMLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")
B, T, TEMPERATURE = 3, 12, 0.7
# transformers' families whose logits are scaled after the head (models/hf.py ``HFModel.head``)
SCALED = {
    "gemma2": lambda: tf.Gemma2Config(head_dim=8, final_logit_softcapping=3.0, **_SMALL),
    "cohere": lambda: tf.CohereConfig(logit_scale=0.5, **_SMALL),
    "granite": lambda: tf.GraniteConfig(logits_scaling=4.0, **_SMALL),
}
_SMALL = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2)


def _hf(directory) -> HFModel:
    path = str(directory)
    cfg = resolved(HFConfig(path=path, block_size=T), read_hf_config(path, "model.path"),
                   pretrained_tokenizer(directory))
    return HFModel(load_net(directory), cfg)


@pytest.fixture(scope="module")
def models(hf_families, tmp_path_factory) -> dict:
    torch.manual_seed(0)
    built = {"gpt": GPT(GPTConfig(vocab_size=50, block_size=T, n_layer=2, n_head=2, n_embd=16,
                                  dropout=0.0)),
             "lstm": LSTMLM(LSTMConfig(vocab_size=50, block_size=T, n_layer=1, n_embd=16,
                                       dropout=0.0))}
    built |= {family: _hf(directory) for family, directory in hf_families.items()}
    lora = _hf(hf_families["llama"])  # peft's wrapper: its decoder is the base's, adapters in
    built["llama_lora"] = HFModel(add_adapters(lora.net, LoraSettings(r=4), seed=0), lora.config)
    like = built["llama"].config
    for family, config in SCALED.items():
        net = tf.AutoModelForCausalLM.from_config(config())
        built[family] = HFModel(net, replace(like, vocab_size=net.config.vocab_size))
    return {name: model.eval() for name, model in built.items()}


def _batch(model, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    idx = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    targets[0, :5] = base.IGNORE  # a prompt's tokens, a chat's other turns
    targets[2, -3:] = base.IGNORE  # padding
    return idx, targets


def _grads(model, loss) -> list[torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("rows", [5, None])  # 5 a chunk; None: the batch in one (kept logits)
@pytest.mark.parametrize("name", ["gpt", "lstm", "llama", "llama_untied", "llama_lora", "qwen2",
                                  "mistral", "gpt2", *SCALED])
def test_chunked_scores_equal_the_whole_logits_and_their_gradients(models, name, rows,
                                                                   monkeypatch):
    model = models[name]
    idx, targets = _batch(model)
    weights = torch.rand(B, T, generator=torch.Generator().manual_seed(2))  # a loss per token

    logits, _ = model(idx)  # (B, T, V) whole
    want = whole_scores(logits.float() / TEMPERATURE, targets)
    nats, hits, counted = want.nats, want.hits, want.counted
    whole = _grads(model, (nats * weights).sum())

    # 5 rows of logits at a time: the batch's 28 counted targets in 6 chunks
    if rows:
        monkeypatch.setattr(chunks, "LOGIT_ELEMENTS", rows * model.config.vocab_size)
    _, scores = model(idx, targets, temperature=TEMPERATURE)
    torch.testing.assert_close(scores.nats, nats, rtol=1e-5, atol=1e-6)
    assert torch.equal(scores.hits, hits) and torch.equal(scores.counted, counted)
    assert float(scores.nats.detach()[~counted].abs().sum()) == 0.0
    chunked = _grads(model, (scores.nats * weights).sum())
    for got, want in zip(chunked, whole, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _Largest(TorchDispatchMode):
    """The most elements of any tensor an op made while it was on."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_of_the_whole_logits_size_is_made(models, monkeypatch):
    """The Qwen2 checkpoint's vocabulary is past 65,535: its (B, T, V) logits would be the
    largest tensor by far. Forward and backward with 16 rows a chunk make nothing above a
    quarter of it (the largest: the embedding's gradient, V × C)."""
    model, vocab = models["qwen2"], models["qwen2"].config.vocab_size
    idx = torch.randint(0, vocab, (4, 64), generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(chunks, "LOGIT_ELEMENTS", 16 * vocab)
    with _Largest() as seen:
        _, scores = model(idx[:, :-1], idx[:, 1:])
        scores.mean.backward()
    whole = idx[:, 1:].numel() * vocab
    assert seen.largest < whole / 4
    with _Largest() as logits:
        model(idx[:, :-1])
    assert logits.largest >= whole  # what it would have been


def test_a_batch_that_counts_nothing_gives_every_weight_a_zero_gradient(models):
    model = models["llama_untied"]
    idx, targets = _batch(model)
    _, scores = model(idx, torch.full_like(targets, base.IGNORE))
    assert float(scores.mean.detach()) == 0.0
    grads = _grads(model, scores.mean)
    assert len(grads) == len(list(model.parameters()))
    assert all(float(g.abs().sum()) == 0.0 for g in grads)


def test_a_head_that_is_no_plain_linear_is_checkpointed_chunk_by_chunk(monkeypatch):
    """A biased or adapted head is called as a module on each chunk (checkpointed): the same
    values and gradients as its whole logits."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 40)  # a bias: no ``Head``
    x = torch.randn(B, T, 16, requires_grad=True)
    targets = torch.randint(0, 40, (B, T))
    targets[1, :4] = base.IGNORE
    whole = whole_scores(head(x) / TEMPERATURE, targets)
    want = torch.autograd.grad(whole.nats.sum(), [x, head.weight, head.bias])
    monkeypatch.setattr(chunks, "LOGIT_ELEMENTS", 7 * 40)
    got = base.token_scores(head, x, targets, TEMPERATURE)
    torch.testing.assert_close(got.nats, whole.nats, rtol=1e-5, atol=1e-6)
    assert torch.equal(got.hits, whole.hits)
    for g, w in zip(torch.autograd.grad(got.nats.sum(), [x, head.weight, head.bias]), want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["bf16 weights", "bf16 autocast"])
def test_bf16_scores_match_the_whole_bf16_logits(how, monkeypatch):
    """FSDP2's bf16 parameters, or fp32 ones under autocast: the matmuls in bf16, the softmax and
    the head's gradient summed in float32; within bf16's rounding of the whole logits' values."""
    torch.manual_seed(0)
    weight = torch.randn(40, 16) * 0.3
    x = torch.randn(B, T, 16)
    if how == "bf16 weights":
        weight, x = weight.bfloat16(), x.bfloat16()
    weight.requires_grad_(True)
    x.requires_grad_(True)
    targets = torch.randint(0, 40, (B, T))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=how == "bf16 autocast")
    with autocast:
        want = whole_scores(x @ weight.T, targets)
    grads = torch.autograd.grad(want.nats.sum(), [x, weight])
    monkeypatch.setattr(chunks, "LOGIT_ELEMENTS", 7 * 40)
    with autocast:
        got = base.token_scores(chunks.Head(weight), x, targets)
    torch.testing.assert_close(got.nats, want.nats, rtol=2e-2, atol=2e-2)
    for g, w in zip(torch.autograd.grad(got.nats.sum(), [x, weight]), grads):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), rtol=5e-2, atol=5e-2)
