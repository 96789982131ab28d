"""Decoder families from transformers (Llama, Qwen2, Mistral, GPT-2: whatever
``AutoModelForCausalLM`` builds), behind this project's model interface: ``HFModel``.

``model=llama`` builds transformers' Llama from the Hydra settings (``LlamaConfig``), with fresh
weights; ``model=hf`` loads a Hugging Face directory (``HFConfig``: local, or s3:// copied once
per node). Either run's ``model/`` is a Hugging Face directory (``save_hf_dir``): safetensors,
config, generation config and tokenizer files, which ``from_pretrained`` loads as it is, and
``load_hf_dir`` too. transformers is imported in the functions: the own GPT needs none of it.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn

from raydp_llm.core import storage
from raydp_llm.core.errors import InputError
from raydp_llm.core.model_config import HFConfig, LlamaConfig, ModelConfig, uses_lora
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, Tokenizer
from raydp_llm.models.base import LanguageModel, kept, padded_positions
from raydp_llm.models.files import CONFIG_FILE, hf_tokenizer, local_copy
from raydp_llm.models.init import fresh_values
from raydp_llm.models.scores import Head, token_scores

MAX_DEFAULT_BLOCK = 1024  # model=hf's block_size when none is given: min(positions, this)
# config.json's key for the block size a model was trained with here: what evaluate and generate
# read a model directory with (transformers keeps and ignores keys it does not know)
TRAINED_BLOCK = "raydp_llm_block_size"


class HFModel(LanguageModel):
    """A transformers ``PreTrainedModel`` (``net``) as this project's model: ``forward(idx,
    targets)`` gives logits (B, T, V) and the mean cross-entropy, generation carries transformers'
    KV cache, ``wte`` is the input embedding table."""

    pads_prompts = True

    def __init__(self, net, cfg: ModelConfig):
        super().__init__(cfg, embeddings=False)
        self.net = net
        self.kind = cfg.kind

    @property
    def wte(self) -> torch.nn.Embedding:
        return self.net.get_input_embeddings()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, keep: int | None = None,
                pads: torch.Tensor | None = None, temperature: float = 1.0):
        """Logits (B, T, V) and None; with ``targets`` (B, T) None and their scores instead
        (``token_scores``, from the decoder's hidden states through the head in chunks: no whole
        logits). ``positions`` (B, T) restarting at 0 mark packed sequences: transformers'
        masks find them in the position ids (no attention mask given) and keep each sequence to
        itself, block-diagonal through SDPA on a CPU, varlen with flash attention. ``keep``: the
        last ``keep`` positions alone (transformers' ``logits_to_keep``). ``pads`` (B,): each
        row's left padding, out of the attention mask, positions counted after it."""
        padding = {"position_ids": positions}
        if pads is not None:
            padding = padded_inputs(pads, idx.size(1), 0)
        if targets is None:
            logits = self.net(input_ids=idx, use_cache=False, logits_to_keep=keep or 0,
                              **padding).logits
            return logits, None
        # get_decoder: the CausalLM's base model (peft's wrapper passes it through, adapters in)
        x = self.net.get_decoder()(input_ids=idx, use_cache=False, **padding).last_hidden_state
        return None, token_scores(self.scorer(), kept(x, keep), targets, temperature)

    def scorer(self) -> Head | nn.Module:
        """The head as ``token_scores`` takes it: a ``Head`` (its weight and the family's final
        scaling, as the CausalLM's forward applies it: Gemma's soft cap, Cohere's logit_scale,
        Granite's logits_scaling; tests/unit/test_chunked_scores.py holds each), or, for a head
        that is no plain Linear (LoRA-adapted, biased), the module itself."""
        out, config = self.net.get_output_embeddings(), self.net.config
        if type(out) is not nn.Linear or out.bias is not None:
            return out
        scale = getattr(config, "logit_scale", None) or 1.0
        scale /= getattr(config, "logits_scaling", None) or 1.0
        return Head(out.weight, getattr(config, "final_logit_softcapping", None), scale)

    def next_logits(self, idx: torch.Tensor, state: CacheState | None = None,
                    pads: torch.Tensor | None = None):
        """transformers' cache while the window still starts at token 0; once it slides, the
        window is recomputed (positions count from its start), as for the GPT. ``pads`` (B,):
        each row's left padding, out of the attention mask, positions counted after it."""
        T, block = idx.size(1), self.config.block_size
        fresh = state is None or state.tokens != T - 1 or T > block
        padding = {}
        if pads is not None:
            assert T <= block, "left-padded rows longer than the block"
            padding = padded_inputs(pads, T, 0 if fresh else T - 1)
        if fresh:
            out = self.net(input_ids=idx[:, -block:], use_cache=True, **padding)
        else:
            out = self.net(input_ids=idx[:, -1:], past_key_values=state.cache, use_cache=True,
                           **padding)
        return out.logits[:, -1, :], CacheState(out.past_key_values, T)

    def longest_window(self) -> int:
        return positions(self.net.config.to_dict()) or self.config.block_size

    def flops_per_token(self) -> float:
        """6N + 12·L·H·Q·T (PaLM's estimate, as for the GPT)."""
        c = self.net.config
        width = getattr(c, "hidden_size", None) or c.n_embd
        layers = getattr(c, "num_hidden_layers", None) or c.n_layer
        return super().flops_per_token() + 12 * layers * width * self.config.block_size

    def load_weights(self, tensors: dict[str, torch.Tensor], shown_as: str) -> None:
        """``tensors`` (a save_pretrained weights file's) into the network; a tied head may be
        absent. One line for anything else missing or shaped otherwise."""
        try:
            missing, unexpected = self.net.load_state_dict(tensors, strict=False)
        except RuntimeError as err:
            raise InputError(f"{shown_as}: the weights do not fit the model's config.json "
                             f"({str(err).splitlines()[1].strip()[:160]}); give the weights "
                             "and config of one model together") from None
        tied = {"lm_head.weight"} if self.net.config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            what = sorted(set(missing) - tied) or sorted(unexpected)
            raise InputError(f"{shown_as}: the weights do not fit the model's config.json "
                             f"(e.g. {what[0]}); give the weights and config of one model "
                             "together")
        self.net.tie_weights()


def padded_inputs(pads: torch.Tensor, T: int, start: int) -> dict:
    """transformers' inputs for rows of T tokens left-padded by ``pads`` (B,), the tokens from
    ``start`` on given: the attention mask over all T, and their positions after the padding."""
    kept = torch.arange(T, device=pads.device)[None, :] >= pads[:, None]
    return {"attention_mask": kept.long(), "position_ids": padded_positions(pads, start, T - start)}


@dataclass
class CacheState:
    """What generation carries between tokens: transformers' cache after ``tokens`` tokens."""

    cache: object
    tokens: int


# ---- building ------------------------------------------------------------------------------------

def build_pretrained(cfg: ModelConfig, s3: S3Options | None = None, seed: int = 0) -> HFModel:
    """``model=llama`` with fresh weights, or ``model=hf``'s directory loaded (with LoRA
    adapters when ``model.lora.r`` > 0); what is drawn is drawn from ``seed`` (the run's), never
    from the process's random state, which a command-line driver never seeded."""
    if isinstance(cfg, LlamaConfig):
        return HFModel(new_llama(cfg, seed), cfg)
    net = load_net(local_copy(cfg.path, s3 or S3Options()))
    if cfg.lora.r:
        from raydp_llm.models.lora import add_adapters  # peft: only for LoRA

        net = add_adapters(net, cfg.lora, seed)
    return HFModel(net, cfg)


def new_llama(cfg: LlamaConfig, seed: int):
    """transformers' LlamaForCausalLM of ``cfg``'s shape (its positions = the block size), its
    weights drawn from ``seed`` by name (``init.fresh_values``: the values a sharded build fills
    its rows with, ``empty_llama``)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # transformers' own init: drawn below instead
        net = AutoModelForCausalLM.from_config(llama_config(cfg), attn_implementation="sdpa",
                                               dtype=torch.float32)
    net.tie_weights()  # skipped with the init
    with torch.no_grad():
        for _, param, draw in fresh_values(net, seed):
            param.copy_(draw())
    return net


def llama_config(cfg: LlamaConfig):
    """transformers' LlamaConfig of ``cfg``'s settings."""
    from transformers import LlamaConfig as HFLlamaConfig

    return HFLlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head or cfg.n_head, max_position_embeddings=cfg.block_size,
        rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_weights, attention_dropout=cfg.dropout, use_cache=False,
    )


def load_net(directory: Path):
    """A Hugging Face directory's model in float32. transformers builds it on the meta device and
    reads the safetensors into it: one copy of the weights in RAM, not a random init and then the
    file."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load in every worker's log
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                attn_implementation="sdpa")


@contextlib.contextmanager
def _parameters_on_meta():
    """Every parameter a module registers is made on the meta device (no memory, no values);
    buffers stay real (a rotary embedding's frequencies: computed, never in the files)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def empty_net(directory: Path):
    """A Hugging Face directory's model with its parameters on the meta device, to be sharded
    and then filled shard by shard (training/worker/sharded_start.py): the directory's config only,
    no weights read, no random init."""
    from transformers import AutoConfig

    return _empty(AutoConfig.from_pretrained(directory))


def empty_llama(cfg: LlamaConfig):
    """``model=llama``'s Llama with its parameters on the meta device, to be sharded and then
    drawn shard by shard (``init.fresh_values``)."""
    return _empty(llama_config(cfg))


def pretrained_dir(cfg: ModelConfig, s3: S3Options) -> Path | None:
    """Where ``cfg``'s starting weights and config are: ``model=hf``'s directory (an s3:// one's
    node-local copy); None for a model whose values are drawn (``model=llama``, the own)."""
    return local_copy(cfg.path, s3) if isinstance(cfg, HFConfig) else None


def empty_model(cfg: HFConfig | LlamaConfig, directory: Path | None, seed: int) -> HFModel:
    """``cfg``'s model, its LoRA adapters too, with its parameters on the meta device (buffers
    real): ``directory``'s config (``model=hf``, its local copy) or ``model=llama``'s shape. For a
    sharded build to fill (``training/worker/sharded_start.py``) or a gathered state to take
    (``checkpoint/sharded.gathered``): no weights read, none drawn."""
    net = empty_llama(cfg) if directory is None else empty_net(directory)
    if uses_lora(cfg):
        from raydp_llm.models.lora import add_adapters  # peft: only for LoRA

        net = add_adapters(net, cfg.lora, seed)  # on the meta device: no values
    return HFModel(net, cfg)


def _empty(config):
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights(), _parameters_on_meta():
        net = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                               attn_implementation="sdpa")
    net.tie_weights()  # a tied head is the embedding's parameter: one tensor to shard and fill
    return net


# ---- checks at the door --------------------------------------------------------------------------

def read_hf_config(path: str, key: str, s3: S3Options = S3Options()) -> dict:
    """The ``config.json`` of a decoder's directory (local or s3://), refused in one line when the
    directory is missing, lacks the config or weights, or holds no decoder-only model."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    fix = "give a directory that save_pretrained wrote (config.json, *.safetensors, tokenizer)"
    try:
        found = storage.exists(storage.join(path, CONFIG_FILE), s3)
    except OSError as err:
        raise storage.unreachable(key, path, err) from None
    if not found:
        raise InputError(f"{key}={path}: no {CONFIG_FILE} there; {fix}")
    try:
        config = storage.read_json(storage.join(path, CONFIG_FILE), s3)
        names = [f.base_name for f in storage.list_objects(path, s3)] if storage.is_s3(path) \
            else os.listdir(path)
    except OSError as err:
        raise storage.unreachable(key, path, err) from None
    except ValueError as err:
        raise InputError(f"{key}={path}: {CONFIG_FILE} is not JSON ({err}); {fix}") from None
    if not any(n.endswith(".safetensors") for n in names):
        raise InputError(f"{key}={path}: no *.safetensors weights there (pickled .bin files are "
                         f"not read); {fix}")
    kind = config.get("model_type")
    if kind is None:  # this project's own GPT or LSTM: its config.json names no model_type
        raise InputError(f"{key}={path}: a raydp_llm model (its {CONFIG_FILE} names no "
                         "model_type), not a Hugging Face one; export a GPT to one (python -m "
                         f"raydp_llm.export model_dir={path} out=DIR) and give DIR, or train one "
                         "with model=llama (+experiment=sums makes the one +experiment=grpo "
                         "starts from)")
    seq2seq = config.get("is_encoder_decoder", False)
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES \
            or seq2seq:
        role = "an encoder-decoder (seq2seq)" if seq2seq else "not a decoder-only"
        raise InputError(f"{key}={path}: model_type {kind!r} is {role} model; this service "
                         "trains decoder-only language models (Llama, Qwen2, Mistral, GPT-2, ...)")
    return config


def positions(config: dict) -> int | None:
    """The longest sequence a model's config allows (GPT-2 names it n_positions)."""
    return config.get("max_position_embeddings") or config.get("n_positions")


def resolved(cfg: HFConfig, config: dict, tokenizer: Tokenizer) -> HFConfig:
    """``cfg`` with the block size (checked against the model's positions) and the vocabulary
    (the embedding's rows, which the tokenizer's ids must not pass)."""
    most = positions(config)
    block = cfg.block_size or min(most or MAX_DEFAULT_BLOCK, MAX_DEFAULT_BLOCK)
    if most is not None and block > most:
        raise InputError(f"model.block_size={block} is above the model's max_position_embeddings="
                         f"{most} ({cfg.path}); give model.block_size={most} or less")
    rows = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if rows is not None and tokenizer.vocab_size > rows:
        raise InputError(f"{cfg.path}: the tokenizer has ids up to {tokenizer.vocab_size - 1} but "
                         f"the model only {rows} token embeddings; give the tokenizer the model "
                         "was trained with (or resize its embeddings before)")
    return replace(cfg, block_size=block, vocab_size=rows)


# ---- Hugging Face directories --------------------------------------------------------------------

def save_hf_dir(directory: Path, model: HFModel, tokenizer: Tokenizer,
                weights: bool = True) -> Path:
    """``model`` as save_pretrained writes it (safetensors, config.json, generation_config.json;
    without ``weights`` the configs only: a sharded checkpoint's) and ``tokenizer``'s Hugging Face
    files: its own for a model's tokenizer, a fast tokenizer with the same ids for this project's
    char and BPE tokenizers."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.eod_id
    if eos is not None and model.net.generation_config.eos_token_id is None:
        model.net.generation_config.eos_token_id = eos
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    setattr(model.net.config, TRAINED_BLOCK, model.config.block_size)
    if weights:
        model.net.save_pretrained(directory, safe_serialization=True)
    else:
        model.net.config.save_pretrained(directory)
        model.net.generation_config.save_pretrained(directory)
    files = getattr(tokenizer, "files", None)
    if files is None:  # this project's tokenizer, as PreTrainedTokenizerFast files
        text, config = hf_tokenizer(tokenizer, model.config.block_size)
        files = {TOKENIZER_FILE: text, TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2)}
    for name, text in files.items():
        (directory / name).write_text(text)
    tokenizer.save_template(directory)  # a chat run's (a model's own is among its files)
    return directory


def load_hf_dir(directory: Path, device: str = "cpu") -> tuple[HFModel, Tokenizer]:
    """A Hugging Face directory's model (eval mode; block size the one it was trained with here,
    else min(positions, 1024)) and its tokenizer as transformers' AutoTokenizer builds it."""
    from raydp_llm.core.tokenizer import pretrained_tokenizer

    shown = str(directory)
    config = read_hf_config(shown, "model_dir")
    tokenizer = pretrained_tokenizer(directory)
    cfg = resolved(HFConfig(path=shown, block_size=config.get(TRAINED_BLOCK)), config, tokenizer)
    model = HFModel(load_net(Path(directory)), cfg)
    return model.to(device).eval(), tokenizer
