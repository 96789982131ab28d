"""Tiny Hugging Face checkpoints of the tested families, built locally (nothing from a hub): a
byte-level BPE trained on a few plays, given to each family's own tokenizer class (the form that
class expects, as transformers' AutoTokenizer rebuilds it), and a model of a few thousand
parameters from a config, saved with ``save_pretrained``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

HF_BIG_IDS = 66_000  # the Qwen2 checkpoint's ids all lie above 65,535
FAMILIES = ("llama", "llama_untied", "qwen2", "mistral", "gpt2")
SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}


def bpe(texts: list[str], vocab_size: int = 400) -> tuple[dict, list[tuple[str, str]]]:
    """A byte-level BPE's vocabulary and merges, trained on ``texts``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    spec = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    return spec["vocab"], merges


def shifted(vocab: dict, offset: int) -> dict:
    """``vocab`` with every id moved up by ``offset`` and the ids below filled by tokens no text
    reaches: a vocabulary whose real tokens all have ids above 65,535 when offset is."""
    filler = {f"<unused_{i}>": i for i in range(offset)}
    return filler | {token: i + offset for token, i in vocab.items()}


def tokenizer_for(family: str, vocab: dict, merges: list):
    from transformers import GPT2Tokenizer, LlamaTokenizer, Qwen2Tokenizer

    cls = {"qwen2": Qwen2Tokenizer, "gpt2": GPT2Tokenizer}.get(family, LlamaTokenizer)
    return cls(vocab=dict(vocab), merges=list(merges))


def config_for(family: str, vocab_size: int, tokenizer):
    """A tiny config of ``family``: GQA for Llama (tied, or not), a qkv bias for Qwen2."""
    import transformers as tf

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4,
                             n_positions=128, **ids)
    cls = {"qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}.get(family, tf.LlamaConfig)
    tied = family != "llama_untied"
    return cls(vocab_size=vocab_size, tie_word_embeddings=tied, **SHAPE, **ids)


def build(family: str, directory: Path, texts: list[str], offset: int = 0, seed: int = 0) -> Path:
    """A tiny ``family`` checkpoint with random weights and a BPE trained on ``texts`` (its ids
    moved up by ``offset``), saved into ``directory``."""
    from transformers import AutoModelForCausalLM

    vocab, merges = bpe(texts)
    tokenizer = tokenizer_for(family.removesuffix("_untied"), shifted(vocab, offset), merges)
    torch.manual_seed(seed)
    config = config_for(family, len(tokenizer), tokenizer)
    model = AutoModelForCausalLM.from_config(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# Qwen2's template, shortened: a default system turn when the conversation has none
QWEN_CHAT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT_TEXTS = ["Romeo, Romeo, wherefore art thou Romeo? A rose by any other name would smell as "
              "sweet.", "What is a flower? Its guard is a thorn, and the rose is sweet."] * 20


def chat_tokenizer(directory: Path, texts: list[str], template: str) -> Path:
    """A tiny Qwen2 tokenizer with ChatML's two special tokens and ``template`` as its chat
    template, saved into ``directory`` (a model directory's tokenizer files)."""
    tokenizer = tokenizer_for("qwen2", *bpe(texts))
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.chat_template = template
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    return directory
